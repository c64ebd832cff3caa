"""Kernel benchmark: every op × backend × shape, checked against naive, then timed side by side.

    python scripts/bench_kernels.py                 # all shapes, every backend that can run here
    python scripts/bench_kernels.py --quick         # one shape per op (about a minute plus autotuning)
    python scripts/bench_kernels.py --ops gla --backends chunk,fla --shapes mve

Before timing, each backend's forward output and every input gradient are compared with the naive
backend's on the same bf16 inputs (relative error ≤ 5e-3, DESIGN §6). A backend that fails is
reported as FAIL and not timed. Times are triton.testing.do_bench medians (warm-up 25 ms, 100 ms of
repeats), forward and forward+backward (torch.autograd.grad of the output). Achieved TFLOP/s and
GB/s are reported against the device's measured ceilings, and the byte floor is every input read
once plus every output written once. Writes bench/results/<date>-<device>-kernels.{md,json,png}.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ops import BACKENDS, BackendError, get_op, list_backends

PEAK_TFLOPS, PEAK_GBS = 786.0, 3000.0   # H100 bf16 matmul and device copy, measured (../shared/GPU.md)


@dataclass
class Case:
    op: str
    name: str
    dims: dict
    make: Callable[[dict, str], tuple[list, list]]     # (args, tensors needing grad)
    flops: Callable[[dict], float]                      # forward FLOPs of the chunkwise algorithm
    bytes_fwd: Callable[[dict], float]
    bytes_bwd: Callable[[dict], float]


def _gla_make(d, device):
    B, T, H, K, V = d["B"], d["T"], d["H"], d["K"], d["V"]
    g = torch.Generator(device=device).manual_seed(0)
    q, k = (torch.randn(B, T, H, K, device=device, generator=g).bfloat16() for _ in range(2))
    v = torch.randn(B, T, H, V, device=device, generator=g).bfloat16()
    gk = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device=device, generator=g)) / 16
    args = [t.requires_grad_() for t in (q, k, v, gk)]
    return args, args


def _gla_flops(d):  # per head: C×C scores over K, scores·V, q·S and the state update
    return 2.0 * d["B"] * d["H"] * d["T"] * (64 * d["K"] + 64 * d["V"] + 2 * d["K"] * d["V"])


def _gla_bytes(d, bwd=False):   # bf16 q, k, v, o (+ do, dq, dk, dv); fp32 gk (+ dgk)
    n = d["B"] * d["T"] * d["H"]
    fwd = n * (2 * (2 * d["K"] + 2 * d["V"]) + 4 * d["K"])
    return fwd + n * (2 * (2 * d["K"] + 2 * d["V"]) + 4 * d["K"]) if bwd else fwd


def _ssd_make(d, device):
    B, T, H, P, G, N = d["B"], d["T"], d["H"], d["P"], d["G"], d["N"]
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(B, T, H, P, device=device, generator=g).bfloat16()
    dt = torch.nn.functional.softplus(torch.randn(B, T, H, device=device, generator=g) - 3)
    A = -torch.rand(H, device=device, generator=g) * 15 - 1
    Bm, Cm = (torch.randn(B, T, G, N, device=device, generator=g).bfloat16() for _ in range(2))
    args = [t.requires_grad_() for t in (x, dt, A, Bm, Cm)]
    return args, args


def _ssd_flops(d):
    return 2.0 * d["B"] * d["H"] * d["T"] * (64 * d["N"] + 64 * d["P"] + 2 * d["N"] * d["P"])


def _ssd_bytes(d, bwd=False):   # bf16 x, B, C, y; fp32 dt
    fwd = d["B"] * d["T"] * (2 * 2 * d["H"] * d["P"] + 2 * 2 * d["G"] * d["N"] + 4 * d["H"])
    return 2 * fwd if bwd else fwd


def _gdn_make(d, device):
    B, T, H, K, V = d["B"], d["T"], d["H"], d["K"], d["V"]
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, T, H, K, device=device, generator=g).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=device, generator=g), dim=-1).bfloat16()
    v = torch.randn(B, T, H, V, device=device, generator=g).bfloat16()
    # the model's gate −exp(A_log) · softplus(x W_a + dt_bias) with A = exp(A_log) ∈ [1, 16]; β = sigmoid
    A = torch.rand(H, device=device, generator=g) * 15 + 1
    gate = -A * torch.nn.functional.softplus(torch.randn(B, T, H, device=device, generator=g) - 3)
    beta = torch.randn(B, T, H, device=device, generator=g).sigmoid()
    args = [t.requires_grad_() for t in (q, k, v, gate, beta)]
    return args, args


def _gdn_flops(d):  # per head and token: k kᵀ, w, scores (C·K each); u, A v_new (C·V each); w h, kᵀ v_new, q h
    return 2.0 * d["B"] * d["H"] * d["T"] * (3 * 64 * d["K"] + 2 * 64 * d["V"] + 3 * d["K"] * d["V"])


def _gdn_bytes(d, bwd=False):   # bf16 q, k, v, o (+ do, dq, dk, dv); fp32 g, beta (+ dg, dbeta)
    n = d["B"] * d["T"] * d["H"]
    fwd = n * (2 * (2 * d["K"] + 2 * d["V"]) + 8)
    return 2 * fwd if bwd else fwd


def gla_case(name, **d):
    return Case("gla", name, d, _gla_make, _gla_flops, _gla_bytes, lambda d: _gla_bytes(d, True))


def ssd_case(name, **d):
    return Case("ssd", name, d, _ssd_make, _ssd_flops, _ssd_bytes, lambda d: _ssd_bytes(d, True))


def gdn_case(name, **d):
    return Case("gated_delta", name, d, _gdn_make, _gdn_flops, _gdn_bytes, lambda d: _gdn_bytes(d, True))


CASES = [
    gla_case("mve", B=16, T=2048, H=12, K=64, V=64),
    gla_case("gla340m_layer", B=8, T=2048, H=4, K=256, V=512),
    gla_case("gla340m_model", B=8, T=2048, H=4, K=128, V=256),      # configs/gla_340m.yaml's layer
    gla_case("state_shape", B=16, T=2048, H=16, K=64, V=64),
    ssd_case("mamba2", B=8, T=2048, H=24, P=64, G=1, N=128),
    gdn_case("gdn_mve", B=16, T=2048, H=16, K=64, V=64),
    gdn_case("gdn_wide", B=8, T=2048, H=8, K=128, V=128),
    gla_case("long", B=1, T=32768, H=4, K=128, V=128),
]
QUICK = {"gla": "mve", "ssd": "mamba2", "gated_delta": "gdn_mve"}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


TOLERANCE = 5e-3    # relative error of the output and of every gradient against the reference (DESIGN §6, bf16)


def errors_against(out: torch.Tensor, grads: list[torch.Tensor], ref: dict) -> list[float]:
    """Relative errors of the output and of each gradient against ref = {"out", "grads"}."""
    return [rel(out, ref["out"])] + [rel(g, r) for g, r in zip(grads, ref["grads"])]


def time_fwd_bwd(forward: Callable[[], torch.Tensor], needs_grad: list[torch.Tensor],
                 do: torch.Tensor) -> tuple[float, float]:
    """do_bench medians in ms (warm-up 25 ms, 100 ms of repeats) of `forward` and of forward+backward
    (torch.autograd.grad of its output against the upstream gradient `do`)."""
    from triton.testing import do_bench

    def fwd_bwd():
        torch.autograd.grad(forward(), needs_grad, do)

    return (do_bench(forward, warmup=25, rep=100, return_mode="median"),
            do_bench(fwd_bwd, warmup=25, rep=100, return_mode="median"))


def run_case(case: Case, backend: str, ref: dict | None, device: str) -> dict:
    row = {"op": case.op, "shape": case.name, "dims": case.dims, "backend": backend}
    try:
        fn = get_op(case.op, backend)
    except BackendError as e:
        return {**row, "status": "n/a", "why": str(e)}
    args, needs_grad = case.make(case.dims, device)
    out = fn(*args)[0]
    gen = torch.Generator(device=device).manual_seed(1)      # the same upstream gradient for every backend
    do = torch.randn(out.shape, generator=gen, device=device).to(out.dtype)
    grads = torch.autograd.grad(out, needs_grad, do)
    if ref is None:                                      # this is the reference (naive)
        ref = {"out": out.detach().float(), "grads": [g.float() for g in grads]}
        row["ref"] = ref
        row["check"] = "reference"
    else:
        errs = errors_against(out, grads, ref)
        row["max_rel_err"] = max(errs)
        if not all(e <= TOLERANCE for e in errs):       # NaN fails too
            return {**row, "status": "FAIL", "errs": errs}
        row["check"] = f"ok ({max(errs):.1e})"
    del out, grads
    row["fwd_ms"], row["fwdbwd_ms"] = time_fwd_bwd(lambda: fn(*args)[0], needs_grad, do)
    f = case.flops(case.dims)
    row["fwd_tflops"] = f / row["fwd_ms"] / 1e9
    row["fwd_gbs"] = case.bytes_fwd(case.dims) / row["fwd_ms"] / 1e6
    row["fwd_floor_ms"] = max(f / PEAK_TFLOPS / 1e9, case.bytes_fwd(case.dims) / PEAK_GBS / 1e6)
    row["fwdbwd_floor_ms"] = max(3 * f / PEAK_TFLOPS / 1e9, case.bytes_bwd(case.dims) / PEAK_GBS / 1e6)
    row["plan_floor_ms"] = plan_floor_ms(case, backend)
    row["status"] = "ok"
    return row


def plan_floor_ms(case: Case, backend: str) -> tuple[float, float | None] | None:
    """The data-movement model's floors (ops/common/movement.py, H100) for this backend's own kernel
    plan, forward and forward+backward, where it has them: chunk and fused for GLA (the fused forward:
    the scan at the tiles the model picks for it, or chunk's where the model says the scan does not
    pay, as ops.gla.fused does), chunk's forward for SSD (B, C expanded per head, as ops/ssd/chunk.py does)."""
    from ops.gla.movement import H100, Shape, choose, chunk_bwd_plan, chunk_plan, fused_bwd_plan, scan_pays

    d = case.dims
    if case.op == "gla" and backend in ("chunk", "fused"):
        s = Shape(d["B"], d["T"], d["H"], d["K"], d["V"])
        scan = backend == "fused" and scan_pays(s.B, s.T, s.H, s.K, s.V, s.C, s.elem)
        fwd = choose(s, H100)[0] if scan else chunk_plan(s)
        bwd = chunk_bwd_plan(s) if backend == "chunk" else fused_bwd_plan(s)
        return fwd.floor_s(H100) * 1e3, (fwd.floor_s(H100) + bwd.floor_s(H100)) * 1e3
    if case.op == "ssd" and backend == "chunk":
        return chunk_plan(Shape(d["B"], d["T"], d["H"], d["N"], d["P"], scalar_decay=True)).floor_s(H100) * 1e3, None
    return None


def environment() -> dict:
    import triton

    env = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "triton": triton.__version__, "date": datetime.date.today().isoformat()}
    try:
        import fla
        env["fla"] = fla.__version__
    except ImportError:
        env["fla"] = None
    return env


def enable_fla_backward_timing() -> str | None:
    """fla 0.6 refuses its gated backward on Hopper with Triton < 3.7.1 (fla #640); lift the
    refusal for timing only, as ../shared/GPU.md prescribes. Returns a note for the table."""
    try:
        import fla.ops.chunkwise.output as chunk_o
    except ImportError:
        return None
    if not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        return ("fla's backward ran with fla.ops.chunkwise.output.TRITON_ABOVE_3_7_1 forced to True "
                "(Triton < 3.7.1 on Hopper, fla #640); its fwd+bwd numbers are timing-only, though each "
                "was still checked against naive above.")
    return None


def to_markdown(rows: list[dict], env: dict, command: str, notes: list[str]) -> str:
    fla_t = {(r["op"], r["shape"]): r for r in rows if r["backend"] == "fla" and r["status"] == "ok"}
    lines = [f"# Kernel benchmark — {env['date']}, {env['device']}", "",
             f"Command: `{command}`  ", f"torch {env['torch']}, triton {env['triton']}, fla {env['fla']}; "
             "bf16 inputs, fp32 states; do_bench medians.", ""]
    lines += [f"- {n}" for n in notes] + [""]
    lines += ["| op | shape | backend | check vs naive | fwd ms | fwd+bwd ms | fla/this fwd | fla/this fwd+bwd "
              "| fwd TFLOP/s | fwd GB/s | floor fwd / fwd+bwd ms |", "|" + "---|" * 11]
    for r in rows:
        dims = " ".join(f"{k}{v}" for k, v in r["dims"].items())
        if r["status"] != "ok":
            why = r.get("why", "") if r["status"] == "n/a" else f"errors {', '.join(f'{e:.1e}' for e in r['errs'])}"
            lines.append(f"| {r['op']} | {r['shape']} ({dims}) | {r['backend']} | {r['status']}: {why} | | | | | | | |")
            continue
        peer = fla_t.get((r["op"], r["shape"]))
        sp = (f"{peer['fwd_ms'] / r['fwd_ms']:.2f}×", f"{peer['fwdbwd_ms'] / r['fwdbwd_ms']:.2f}×") if peer else ("", "")
        lines.append(f"| {r['op']} | {r['shape']} ({dims}) | {r['backend']} | {r['check']} | {r['fwd_ms']:.3f} | "
                     f"{r['fwdbwd_ms']:.3f} | {sp[0]} | {sp[1]} | {r['fwd_tflops']:.1f} | {r['fwd_gbs']:.0f} | "
                     f"{r['fwd_floor_ms']:.3f} / {r['fwdbwd_floor_ms']:.3f}"
                     + plan_text(r.get("plan_floor_ms")) + " |")
    lines += ["", f"Ceilings: {PEAK_TFLOPS:.0f} TFLOP/s bf16, {PEAK_GBS:.0f} GB/s. FLOPs are the chunkwise "
              "algorithm's (C = 64); fwd+bwd counts 3× forward. fla/this > 1 means this backend is faster. "
              "Floor: every input read and every output written once; plan: the floor of the backend's own "
              "kernels, forward / forward+backward (ops/common/movement.py, H100)."]
    return "\n".join(lines) + "\n"


def plan_text(plan) -> str:
    if not plan:
        return ""
    fwd, fwdbwd = plan
    return f"; plan {fwd:.3f}" + (f" / {fwdbwd:.3f}" if fwdbwd is not None else "")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    labels = sorted({f"{r['op']}/{r['shape']}" for r in ok})
    backends = [b for b in BACKENDS if any(r["backend"] == b for r in ok)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key in zip(axes, ("fwd_ms", "fwdbwd_ms")):
        w = 0.8 / max(1, len(backends))
        for i, b in enumerate(backends):
            vals = [next((r[key] for r in ok if f"{r['op']}/{r['shape']}" == lab and r["backend"] == b), math.nan)
                    for lab in labels]
            ax.bar([j + i * w for j in range(len(labels))], vals, w, label=b)
        ax.set_xticks([j + w * (len(backends) - 1) / 2 for j in range(len(labels))], labels, rotation=20)
        ax.set(yscale="log", ylabel="ms (median)", title=key.replace("_ms", "").replace("fwdbwd", "fwd+bwd"))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one shape per op")
    p.add_argument("--ops", default="", help="comma-separated ops (default: all with cases)")
    p.add_argument("--backends", default="", help="comma-separated backends besides naive (default: all)")
    p.add_argument("--shapes", default="", help="comma-separated shape names")
    p.add_argument("--out", default="bench/results", help="folder for the .md/.json/.png")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("error: the kernel benchmark times GPU kernels; run it on a CUDA machine")
    cases = [c for c in CASES if (not args.ops or c.op in args.ops.split(","))
             and (not args.shapes or c.name in args.shapes.split(","))
             and (not args.quick or QUICK.get(c.op) == c.name)]
    notes = [n for n in [enable_fla_backward_timing()] if n]
    env = environment()
    stem = Path(args.out) / f"{env['date']}-{env['device'].replace(' ', '_')}-kernels"
    stem.parent.mkdir(parents=True, exist_ok=True)
    command = ("python scripts/bench_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    rows = []
    for case in cases:
        chosen = [b for b in list_backends(case.op) if b != "naive" and (not args.backends or b in args.backends.split(","))]
        ref_row = run_case(case, "naive", None, "cuda")
        ref = ref_row.pop("ref", None)
        rows.append(ref_row)
        for b in chosen:
            rows.append(run_case(case, b, ref, "cuda"))
            r = rows[-1]
            print(f"{case.op:>4} {case.name:<14} {b:<6} {r['status']:<4} "
                  + (f"fwd {r['fwd_ms']:.3f} ms  fwd+bwd {r['fwdbwd_ms']:.3f} ms  {r.get('check', '')}"
                     if r["status"] == "ok" else r.get("why", str(r.get("errs", "")))), flush=True)
        del ref
        torch.cuda.empty_cache()
        write_results(rows, env, command, notes, stem)    # after every case: a cut-off run keeps what it measured
    print(stem.with_suffix(".md").read_text())
    return rows


def write_results(rows: list[dict], env: dict, command: str, notes: list[str], stem: Path) -> None:
    stem.with_suffix(".md").write_text(to_markdown(rows, env, command, notes))
    stem.with_suffix(".json").write_text(json.dumps({"env": env, "command": command, "notes": notes, "rows": rows},
                                                    indent=1, default=str))
    plot(rows, stem.with_suffix(".png"))


if __name__ == "__main__":
    main()
