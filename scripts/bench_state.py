"""The state pass alone (issue [G]): fla's chunk_fwd_h / chunk_bwd_dh against ours, sequential
(`chunk`) and split (`fused`'s `state` component), and two PyTorch baselines, each checked against
our sequential kernel first, then timed side by side; programs launched against the device's SMs.

    python scripts/bench_state.py                          # the issue's shapes
    python scripts/bench_state.py --shapes long --segments 1,4,9,16,32
Writes bench/results/<date>-<device>-state.{md,json,png}.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton

from ops.chunkwise.state import chunk_bwd_dh, chunk_fwd_h, segment_plan, split_segments
from ops.triton_utils import sm_count
from ops.chunkwise.cumsum import chunk_cumsum
from ops.triton_utils import tile

C = 64
# name: (B, T, H, K, V, scalar decay); Mamba-2's states are N × P with P = 64 and one decay per head
SHAPES = {"train": (16, 2048, 16, 64, 64, False), "long": (1, 65536, 4, 128, 128, False),
          "gla125m": (8, 2048, 12, 64, 64, False), "gla125m_b4": (4, 2048, 12, 64, 64, False),
          "mamba2_n16": (8, 2048, 24, 16, 64, True), "mamba2_n64": (8, 2048, 24, 64, 64, True),
          "mamba2_n128": (8, 2048, 24, 128, 64, True)}


def inputs(B, T, H, K, V, scalar, device, dtype=torch.bfloat16):
    torch.manual_seed(0)
    k, q = (torch.randn(B, T, H, K, device=device, dtype=dtype) for _ in range(2))
    v, do = (torch.randn(B, T, H, V, device=device, dtype=dtype) for _ in range(2))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, 1 if scalar else K, device=device)) / 16
    return q, k, v, do, chunk_cumsum(g, C), g


def baseline_fwd(k, v, b, bmm: bool):
    """Per-chunk local states as one batched product (einsum, or bmm over [B·NT·H] matrices), then
    the chunk-to-chunk scan in a PyTorch loop."""
    B, T, H, K = k.shape
    V, NT = v.shape[-1], triton.cdiv(T, C)
    pad = lambda x: torch.nn.functional.pad(x, (0, 0, 0, 0, 0, NT * C - T)).view(B, NT, C, H, x.shape[-1])  # noqa: E731
    kc, vc, bc = pad(k), pad(v), pad(b)
    bl = bc[:, :, -1:]                                            # zero-padded rows: b there is 0, k is 0
    kd = (kc.float() * torch.exp(bl - bc)).to(k.dtype)
    if bmm:
        local = torch.bmm(kd.permute(0, 1, 3, 4, 2).reshape(-1, K, C), vc.permute(0, 1, 3, 2, 4).reshape(-1, C, V))
        local = local.view(B, NT, H, K, V).float()
    else:
        local = torch.einsum("bnchk,bnchv->bnhkv", kd, vc).float()
    decay = torch.exp(bl[:, :, 0]).unsqueeze(-1)                  # [B, NT, H, K|1, 1]
    h = torch.empty(B, NT, H, K, V, device=k.device, dtype=k.dtype)
    S = torch.zeros(B, H, K, V, device=k.device)
    for n in range(NT):
        h[:, n] = S.to(k.dtype)
        S = decay[:, n] * S + local[:, n]
    return h


def variants(q, k, v, do, b, g, segments: list[int]) -> dict:
    """name → (forward, backward or None, programs launched). b: the chunk-local cumsum of the per-step
    log-decays g (fp32); the `step decays` rows take g itself, in bf16 (fla's GLA layer makes its decays in
    the autocast dtype) or fp32, and take the cumsum in the kernel."""
    B, T, H, K = k.shape
    V, scale = v.shape[-1], K ** -0.5
    tiles = triton.cdiv(K, tile(K)) * triton.cdiv(V, tile(V)) * B * H
    out = {}
    if importlib.util.find_spec("fla") is not None and k.is_cuda:
        from fla.ops.common import chunk_h as fla_h

        b2 = b * (1 / math.log(2))                        # fla 0.6 takes log-decays in base 2 (its kernels use exp2)
        decay = dict(g=b2[..., 0]) if b.shape[-1] == 1 else dict(gk=b2)
        out["fla"] = (lambda: fla_h.chunk_fwd_h(k, v, h0=None, output_final_state=False, chunk_size=C, **decay)[0],
                      lambda: fla_h.chunk_bwd_dh(q, k, v, do, None, None, scale, chunk_size=C, **decay)[0], None)
        out["fla from bf16 step decays (its cumsum + the pass)"] = fla_from_steps(q, k, v, do, g, scale)
    for S in segments:
        name = "chunk (sequential)" if S == 1 else f"fused split S={S}"
        out[name] = (lambda S=S: chunk_fwd_h(k, v, b, None, False, C, segments=S)[0],
                     lambda S=S: chunk_bwd_dh(q, do, b, None, False, scale, C, segments=S)[0],
                     tiles * segment_plan(triton.cdiv(T, C), S)[1])
    for dtype in (torch.bfloat16, torch.float32):
        gs = g.to(dtype)
        out[f"chunk, {str(dtype)[6:]} step decays"] = (
            lambda gs=gs: chunk_fwd_h(k, v, gs, None, False, C, step_decays=True)[0],
            lambda gs=gs: chunk_bwd_dh(q, do, gs, None, False, scale, C, step_decays=True)[0], tiles)
    out["einsum + scan"] = (lambda: baseline_fwd(k, v, b, bmm=False), None, None)
    out["bmm + scan"] = (lambda: baseline_fwd(k, v, b, bmm=True), None, None)
    return out


def fla_from_steps(q, k, v, do, g, scale):
    """fla's state pass from the per-step decays, as its GLA layer runs it: chunk_local_cumsum (base 2, fp32
    out), then chunk_fwd_h / chunk_bwd_dh on the result."""
    from fla.ops.common import chunk_h as fla_h
    from fla.ops.utils import cumsum as fla_cumsum

    gb = (g[..., 0] if g.shape[-1] == 1 else g).to(torch.bfloat16)
    name = "g" if g.shape[-1] == 1 else "gk"

    def cumsum():
        return fla_cumsum.chunk_local_cumsum(gb, C, scale=1 / math.log(2))

    return (lambda: fla_h.chunk_fwd_h(k, v, h0=None, output_final_state=False, chunk_size=C, **{name: cumsum()})[0],
            lambda: fla_h.chunk_bwd_dh(q, k, v, do, None, None, scale, chunk_size=C, **{name: cumsum()})[0], None)


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def run_shape(name, shape, segment_list, device):
    from triton.testing import do_bench

    B, T, H, K, V, scalar = shape
    q, k, v, do, b, g = inputs(B, T, H, K, V, scalar, device)
    auto = split_segments(B, H, K, V, T, C, k.device)
    segments = sorted({1, auto, *segment_list})
    ref_h = chunk_fwd_h(k, v, b, None, False, C)[0]
    ref_dh = chunk_bwd_dh(q, do, b, None, False, K ** -0.5, C)[0]
    rows = []
    for label, (fwd, bwd, programs) in variants(q, k, v, do, b, g, segments).items():
        auto_row = label == f"fused split S={auto}" or (auto == 1 and label == "chunk (sequential)")
        row = {"shape": name, "dims": f"B{B} T{T} H{H} K{K} V{V}{' scalar' if scalar else ''}", "variant": label,
               "programs": programs, "auto": auto_row}
        try:
            row["err h"] = rel(fwd(), ref_h)
            row["fwd ms"] = do_bench(fwd, warmup=10, rep=50, return_mode="median")
            if bwd is not None:
                row["err dh"] = rel(bwd(), ref_dh)
                row["bwd ms"] = do_bench(bwd, warmup=10, rep=50, return_mode="median")
        except Exception as e:                                   # a variant that cannot run is a row saying why
            row["why"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        print(f"{name:<12} {label:<20} " + " ".join(f"{k_} {v_:.3g}" for k_, v_ in row.items()
                                                    if isinstance(v_, float)), flush=True)
    return rows


def to_markdown(rows, env, command) -> str:
    lines = [f"# State pass — {env['date']}, {env['device']}", "", f"Command: `{command}`  ",
             f"torch {env['torch']}, triton {env['triton']}, fla {env['fla']}; bf16 k, v, q, do; fp32 cumulative "
             f"decays (the step-decay rows: per-step, in the dtype named) and fp32 recurrence; C = {C}; "
             f"{env['sms']} SMs. do_bench medians. `auto`: the split split_segments picks.", "",
             "| shape | variant | programs (SMs: {}) | err h | err dh | fwd ms | bwd ms | fla ÷ this fwd | fla ÷ this bwd |".format(env["sms"]),
             "|---|---|---|---|---|---|---|---|---|"]
    fla = {r["shape"]: r for r in rows if r["variant"] == "fla" and "fwd ms" in r}
    f = lambda x, spec: format(x, spec) if isinstance(x, float) else ""  # noqa: E731
    for r in rows:
        peer = fla.get(r["shape"], {})
        ratio = lambda key: f"{peer[key] / r[key]:.2f}×" if key in peer and key in r else ""  # noqa: E731
        lines.append(f"| {r['shape']} ({r['dims']}) | {r['variant']}{' (auto)' if r['auto'] else ''} | "
                     f"{r['programs'] or ''} | {f(r.get('err h'), '.1e')} | {f(r.get('err dh'), '.1e')} | "
                     f"{f(r.get('fwd ms'), '.3f')} | {f(r.get('bwd ms'), '.3f')} | {ratio('fwd ms')} | {ratio('bwd ms')} |"
                     + (f" {r['why']}" if "why" in r else ""))
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--segments", default="2,4,8", help="split counts to time besides 1 and the automatic choice")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "bench" / "results")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_state.py times kernels on a CUDA GPU; tests/ops/test_state_split.py checks them on CPU")
    device = torch.device("cuda")
    fla_version = None
    if importlib.util.find_spec("fla") is not None:
        import fla
        fla_version = fla.__version__
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "fla": fla_version, "sms": sm_count(device), "date": datetime.date.today().isoformat()}
    command = "python scripts/bench_state.py " + " ".join(argv if argv is not None else sys.argv[1:])
    stem = args.out / f"{env['date']}-{env['device'].replace(' ', '_')}-state"
    stem.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.shapes.split(","):
        rows += run_shape(name, SHAPES[name], [int(s) for s in args.segments.split(",") if s], device)
        # the table so far, after every shape: fla autotunes for minutes at a new shape, and a run cut
        # off by a time limit still leaves what it measured
        stem.with_suffix(".md").write_text(to_markdown(rows, env, command.strip()))
        stem.with_suffix(".json").write_text(json.dumps({"env": env, "command": command, "rows": rows}, indent=1))
    plot(rows, stem.with_suffix(".png"))
    print(stem.with_suffix(".md").read_text())


def plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4 * len(shapes), 4), squeeze=False)
    for ax, s in zip(axes[0], shapes):
        ok = [r for r in rows if r["shape"] == s and "fwd ms" in r]
        x = range(len(ok))
        ax.bar([i - 0.2 for i in x], [r["fwd ms"] for r in ok], 0.4, label="fwd")
        ax.bar([i + 0.2 for i in x], [r.get("bwd ms", 0) for r in ok], 0.4, label="bwd (dh)")
        ax.set_xticks(list(x), [r["variant"] for r in ok], rotation=60, ha="right", fontsize=7)
        ax.set(title=s, ylabel="ms")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
