"""RA+MLA attention (issue [I]): the fused flash kernels against naive RA+MLA (T×T scores) and against
the plain GPT-2's attention (SDPA, 12 heads of 64) at the same shape, side by side in one process.

    python scripts/bench_ramla.py                       # GPT-2 124M: B8 H12 D64 L64 W64, T = 2048, 4096, 8192
    python scripts/bench_ramla.py --seq-lens 2048 --batch 8
    python scripts/bench_ramla.py --sweep                 # first each kernel's tile candidates (SWEEP)
    python scripts/bench_ramla.py --sweep dkv,dq          # only the backward kernels' candidates

Each row: forward and forward+backward medians (triton.testing.do_bench), and the attention's own
peak memory in the forward+backward (the peak above the inputs, which are allocated first). fused is
checked against naive in fp32 before timing wherever naive fits in memory, on fp32 inputs and on the
timed bf16 ones; a row that runs out of memory says so. naive is the oracle: it computes in fp32 (no
TF32) whatever its inputs, so its times and memory are those of an fp32 T×T implementation. `fused core` is
the attention alone (from fused.FAR_MIN_T on the split form: cuDNN and the band kernels) on precomputed
q_lat (without the W_ql and W_vu GEMMs), at the backward's automatic head grouping and, with
--heads-per-program, at others; its `no band` row runs the same kernels on plain MLA (α = None), which prices
the reciprocal band and gives these kernels' floor beside SDPA. Every row but naive's is also timed as a
replayed CUDA graph (the device time alone). Writes bench/results/<date>-<device>-ramla.{md,json,png}.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

H, D, L, W = 12, 64, 64, 64     # gpt2_ramla_124m
NAIVE = "naive (fp32 inside)"   # the oracle upcasts to fp32 (no TF32): T×T scores in fp32 whatever the inputs
MHA_LAYER = "module: GPT-2 MHA layer (SDPA)"
# SDPA timed under torch.use_deterministic_algorithms, the like-for-like peer of the fused core's bitwise-repeatable
# backward: SDPA's default cuDNN backward is not repeatable, and there torch takes FlashAttention-2 (on the H100)
SDPA_DETERMINISTIC = "sdpa (GPT-2 MHA), deterministic mode"
PLAIN_CORE = "fused core, all Triton, no band (plain MLA)"


def ramla_inputs(B, T, device, dtype=torch.bfloat16):
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, T, H, D, device=device, generator=g)
    k_lat, v_lat = (torch.randn(B, T, L, device=device, generator=g) for _ in range(2))
    w_ql = torch.randn(H, D, L, device=device, generator=g) / math.sqrt(D)
    w_vu = torch.randn(H, L, D, device=device, generator=g) / math.sqrt(L)
    alpha = torch.tensor(0.5, device=device)
    return [x.to(dtype).requires_grad_() for x in (q, k_lat, v_lat)] + [x.requires_grad_() for x in (w_ql, w_vu, alpha)]


@contextmanager
def form(far: str = "auto", kernel: str = "auto", hp: int | None = None):
    """The fused op's form for the block: ops.ramla.fused's FAR, FAR_KERNEL and HEADS_PER_PROGRAM, restored after."""
    from ops.ramla import fused

    saved = fused.FAR, fused.FAR_KERNEL, fused.HEADS_PER_PROGRAM
    fused.FAR, fused.FAR_KERNEL, fused.HEADS_PER_PROGRAM = far, kernel, hp
    try:
        yield
    finally:
        fused.FAR, fused.FAR_KERNEL, fused.HEADS_PER_PROGRAM = saved


def variants(B, T, device, heads_per_program=()):
    """name → (forward function returning one tensor, leaves needing grad). `fused` is the op as the model
    calls it (from fused.FAR_MIN_T on the split form: far field on cuDNN's kernel, band in Triton); the
    `, all Triton` and `, split <kernel>` rows pin one form. The `module` rows are each model's whole attention
    layer (its projections, the op, the output projection) under bf16 autocast, the comparison a training step
    sees."""
    from model.config import ModelConfig
    from model.gpt2 import MHA, RAMLA
    from ops.ramla import fused, naive
    from ops.ramla.fused import FlashRAMLA, latent_queries

    def pinned(fn, far="auto", kernel="auto", hp=None):
        def call():
            with form(far, kernel, hp):  # the backward reads the form the forward saved, so the forward suffices
                return fn()
        return call

    def module(kind):
        cfg = ModelConfig(family="gpt2", attention=kind, backend="fused" if kind == "ramla" else "naive",
                          latent_dim=L, ra_window=W)
        layer = (RAMLA if kind == "ramla" else MHA)(cfg, 0).to(device)
        if kind == "ramla":
            layer.init_extra()                   # W_ql, W_vu, α: the model's own init (they start empty)
        x_in = torch.randn(B, T, H * D, device=device, requires_grad=True)

        def call():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return layer(x_in)
        return call, [x_in, *layer.parameters()]

    x = ramla_inputs(B, T, device)
    q, k, v, w_ql, w_vu, alpha = x
    q_lat = latent_queries(q, w_ql).detach().requires_grad_()
    mha = [torch.randn(B, T, H, D, device=device, dtype=torch.bfloat16).requires_grad_() for _ in range(3)]
    op = lambda: fused.ramla(q, k, v, w_ql, w_vu, alpha, W)     # noqa: E731
    core = lambda: FlashRAMLA.apply(q_lat, k, v, alpha, W, L ** -0.5, fused.far_kernel(q_lat))   # noqa: E731
    plain = lambda: FlashRAMLA.apply(q_lat, k, v, None, W, L ** -0.5, None)                      # noqa: E731
    return {
        NAIVE: (lambda: naive.ramla(q, k, v, w_ql, w_vu, alpha, W), x),
        "fused": (op, x),
        "fused, all Triton": (pinned(op, "triton"), x),
        "fused, split cudnn": (pinned(op, "sdpa", "cudnn"), x),
        "fused, split flash": (pinned(op, "sdpa", "flash"), x),
        "fused core": (core, [q_lat, k, v, alpha]),
        "fused core, all Triton": (pinned(core, "triton"), [q_lat, k, v, alpha]),
        # the same kernels without the reciprocal band: what the band costs, and these kernels' floor
        PLAIN_CORE: (pinned(plain, "triton"), [q_lat, k, v]),
        "sdpa (GPT-2 MHA)": (lambda: torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in mha), is_causal=True), mha),
        SDPA_DETERMINISTIC: (lambda: torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in mha), is_causal=True), mha),
        "module: RA+MLA layer (fused)": module("ramla"),
        MHA_LAYER: module("mha"),
        **{f"fused core, all Triton, {hp} heads/program": (pinned(core, "triton", hp=hp), [q_lat, k, v, alpha])
           for hp in heads_per_program},
    }


def measure(fn, leaves, graph: bool = True) -> dict:
    """Eager medians (what a caller sees, launches included) and, with `graph`, the forward+backward's median as
    a replayed CUDA graph (the device time alone: at T = 2048 the fused rows' launches are host-bound). A call
    that cannot be captured keeps its eager times and says why in `graph_error`."""
    from triton.testing import do_bench, do_bench_cudagraph

    with torch.no_grad():
        do = torch.randn_like(fn())              # the upstream gradient is not the attention's memory
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.autograd.grad(out, leaves, do)
    del out
    torch.cuda.synchronize()
    peak_gb = (torch.cuda.max_memory_allocated() - base) / 1e9

    def fwd_bwd():
        torch.autograd.grad(fn(), leaves, do)

    with torch.no_grad():
        fwd = do_bench(fn, warmup=25, rep=100, return_mode="median")
    row = {"fwd_ms": fwd, "fwdbwd_ms": do_bench(fwd_bwd, warmup=25, rep=100, return_mode="median"),
           "peak_gb": peak_gb, "status": "ok"}
    if graph:
        try:
            row["graph_ms"] = do_bench_cudagraph(fwd_bwd, rep=100, return_mode="median")
        except RuntimeError as e:
            row["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    return row


def check(B, T, device, far="auto") -> str:
    """Largest relative error of fused's output and gradients against naive in fp32: fused on fp32 inputs
    (the exact-dot kernels, all Triton: SDPA's GPU kernels are half precision) and on bf16 ones (the timed
    kernels, in the form `far`). A NaN shows as nan."""
    from ops.ramla import fused, naive
    from scripts.bench_kernels import rel

    x = [t.detach().float().requires_grad_() for t in ramla_inputs(B, T, device)]
    gen = torch.Generator(device=device).manual_seed(1)
    do = torch.randn(B, T, H, D, device=device, generator=gen)
    out = naive.ramla(*x[:5], x[5], W)
    ref = [out, *torch.autograd.grad(out, x, do)]
    errs = []
    for dtype in (torch.float32, torch.bfloat16):
        with form(far if dtype == torch.bfloat16 else "triton"):
            xs = [t.detach().to(dtype if i < 3 else torch.float32).requires_grad_() for i, t in enumerate(x)]
            out = fused.ramla(*xs[:5], xs[5], W)
            got = [out, *torch.autograd.grad(out, xs, do.to(out.dtype))]
        e = [rel(a, b) for a, b in zip(got, ref)]
        errs.append(float("nan") if any(v != v for v in e) else max(e))
    return f"fp32 (all Triton) {errs[0]:.1e}, bf16 {errs[1]:.1e}"


def run(B, T, device, heads_per_program=()) -> list[dict]:
    rows, errs = [], {}
    for name, far in (("fused", "auto"), ("fused, all Triton", "triton")):
        try:
            errs[name] = check(B, T, device, far)
        except torch.OutOfMemoryError:
            errs[name] = "naive OOM"
        torch.cuda.empty_cache()
    for name, (fn, leaves) in variants(B, T, device, heads_per_program).items():
        row = {"B": B, "T": T, "variant": name, "check": errs.get(name, "")}
        was = torch.are_deterministic_algorithms_enabled()
        try:
            torch.use_deterministic_algorithms(was or name == SDPA_DETERMINISTIC)
            row.update(measure(fn, leaves, graph=name != NAIVE))     # naive: 8-33 GB of scores per call
        except torch.OutOfMemoryError:
            row["status"] = "OOM"
        except RuntimeError as e:    # e.g. an SDPA kernel this GPU lacks: reported in the row, not fatal
            row["status"] = f"error: {str(e)[:100]}"
        finally:
            torch.use_deterministic_algorithms(was)
        torch.cuda.empty_cache()
        rows.append(row)
        print(row, flush=True)
    return rows


SWEEP = {"fwd": [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 4, 3), (128, 32, 4, 2), (64, 32, 4, 3)],
         "dkv": [(64, 64, 4, 2), (64, 64, 4, 3), (32, 64, 4, 2), (64, 128, 8, 2), (32, 128, 8, 2), (64, 64, 8, 2)],
         "dq": [(64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 2), (128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 8, 2)]}


def sweep(B, T, device, kernels=tuple(SWEEP)) -> list[dict]:
    """Each kernel's tiles and launch (BM, BN, warps, stages) with the other two at their defaults, in the
    all-Triton form (every score in the kernels):
    the core's forward time for `fwd`, forward+backward for the backward kernels; every candidate's
    output and gradients checked against the defaults' first (relative error ≤ 1e-2)."""
    from triton.testing import do_bench

    from ops.ramla import fused
    from ops.ramla.fused import FlashRAMLA, latent_queries
    from scripts.bench_kernels import rel

    q, k, v, w_ql, *_, alpha = ramla_inputs(B, T, device)
    q_lat = latent_queries(q, w_ql).detach().requires_grad_()
    leaves = [q_lat, k, v, alpha]
    do = torch.randn(H, B, T, L, device=device, dtype=torch.bfloat16)

    def outputs():
        o = FlashRAMLA.apply(q_lat, k, v, alpha, W, L ** -0.5, None)
        return [o, *torch.autograd.grad(o, leaves, do)]

    ref, default, rows = outputs(), dict(fused.TILES), []
    unknown = set(kernels) - set(SWEEP)
    if unknown:
        raise SystemExit(f"--sweep: no such kernel {sorted(unknown)}; choose among {', '.join(SWEEP)}")
    for kernel in kernels:
        for bm, bn, warps, stages in SWEEP[kernel]:
            fused.TILES[kernel] = dict(BM=bm, BN=bn, num_warps=warps, num_stages=stages)
            row = {"kernel": kernel, "BM": bm, "BN": bn, "warps": warps, "stages": stages}
            try:
                errs = [rel(a, b) for a, b in zip(outputs(), ref)]
                err = float("nan") if any(e != e for e in errs) else max(errs)
                row["max_rel_err"] = err
                if not err <= 1e-2:                       # NaN fails too
                    row["status"] = "FAIL"
                elif kernel == "fwd":
                    with torch.no_grad():
                        row["ms"] = do_bench(lambda: FlashRAMLA.apply(q_lat, k, v, alpha, W, L ** -0.5, None),
                                             rep=100, return_mode="median")
                    row["status"] = "ok"
                else:
                    row["ms"] = do_bench(lambda: torch.autograd.grad(
                        FlashRAMLA.apply(q_lat, k, v, alpha, W, L ** -0.5, None), leaves, do), rep=100,
                        return_mode="median")
                    row["status"] = "ok"
            except Exception as e:   # a configuration that fails to compile or launch is reported, not fatal
                row["status"] = f"error: {type(e).__name__}: {str(e)[:80]}"
            fused.TILES.update(default)
            rows.append(row)
            print(row, flush=True)
    return rows


def sweep_markdown(rows) -> str:
    lines = ["", "## Tile sweep (fused core; the other kernels at their defaults)", "",
             "| kernel | BM | BN | warps | stages | timed | ms | max rel. err vs default | status |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = f"{r['ms']:.3f}" if "ms" in r else ""
        err = f"{r['max_rel_err']:.1e}" if "max_rel_err" in r else ""
        timed = "fwd" if r["kernel"] == "fwd" else "fwd+bwd"
        lines.append(f"| {r['kernel']} | {r['BM']} | {r['BN']} | {r['warps']} | {r['stages']} | {timed} | {ms} | {err} "
                     f"| {r['status']} |")
    return "\n".join(lines) + "\n"


def to_markdown(rows, env, command) -> str:
    lines = [f"# RA+MLA attention — {env['date']}, {env['device']}", "",
             f"Command: `{command}`  ", f"torch {env['torch']}, triton {env['triton']}; H{H} D{D} L{L} W{W}, bf16, "
             "forward and forward+backward medians (do_bench, eager: launches included); graph = the forward+backward "
             "replayed as a CUDA graph (do_bench_cudagraph: device time alone); peak = the attention's memory above "
             "its inputs during forward+backward.", "",
             "| B | T | variant | fwd ms | fwd+bwd ms | graph ms | naive ÷ this (fwd+bwd) "
             "| ÷ SDPA (fwd+bwd; module rows: ÷ the MHA layer) | ÷ SDPA (graph; module rows: ÷ the MHA layer) "
             "| peak GB | check vs naive (fp32) | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (B, T) in dict.fromkeys((r["B"], r["T"]) for r in rows):
        group = [r for r in rows if (r["B"], r["T"]) == (B, T)]
        by = {r["variant"]: r for r in group}
        for r in group:
            ok = r["status"] == "ok"
            naive = by[NAIVE]
            vs_naive = f"{naive['fwdbwd_ms'] / r['fwdbwd_ms']:.2f}×" if ok and naive["status"] == "ok" else ""
            sdpa = by.get(MHA_LAYER if r["variant"].startswith("module") else "sdpa (GPT-2 MHA)", {"status": ""})
            vs_sdpa = f"{r['fwdbwd_ms'] / sdpa['fwdbwd_ms']:.2f}" if ok and sdpa["status"] == "ok" else ""
            vs_graph = f"{r['graph_ms'] / sdpa['graph_ms']:.2f}" if "graph_ms" in r and "graph_ms" in sdpa else ""
            cells = [f"{r[k]:.3f}" if k in r else "" for k in ("fwd_ms", "fwdbwd_ms", "graph_ms")]
            peak = f"{r['peak_gb']:.2f}" if ok else ""
            status = r["status"] + (f" (graph: {r['graph_error']})" if "graph_error" in r else "")
            lines.append(f"| {B} | {T} | {r['variant']} | {' | '.join(cells)} | {vs_naive} | {vs_sdpa} | {vs_graph} "
                         f"| {peak} | {r['check']} | {status} |")
    return "\n".join(lines) + "\n"


def plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r["variant"] for r in rows):
        ok = [r for r in rows if r["variant"] == name and r["status"] == "ok"]
        ax_t.plot([r["T"] for r in ok], [r["fwdbwd_ms"] for r in ok], "o-", label=name)
        ax_m.plot([r["T"] for r in ok], [r["peak_gb"] for r in ok], "o-", label=name)
    for ax, label in ((ax_t, "forward+backward ms"), (ax_m, "attention peak GB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ax_t.legend()
    fig.suptitle(f"RA+MLA attention, B{rows[0]['B']} H{H} D{D} L{L} W{W}, bf16")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> list[dict]:
    from scripts.bench_kernels import environment

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-lens", default="2048,4096,8192")
    p.add_argument("--heads-per-program", default="",
                   help="also time the core with these backward head groups, e.g. 1,3,12 "
                        "(default: the auto choice only)")
    p.add_argument("--sweep", nargs="?", const=",".join(SWEEP), default="",
                   help=f"first time other tiles for these kernels (default: all of {','.join(SWEEP)}) at B, "
                        "the first T")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_ramla.py times CUDA kernels; run it on a GPU")
    env, rows = environment(), []
    command = "python scripts/bench_ramla.py " + " ".join(argv if argv is not None else sys.argv[1:])
    stem = Path(args.out) / f"{env['date']}-{env['device'].replace(' ', '_')}-ramla"
    stem.parent.mkdir(parents=True, exist_ok=True)
    lens = [int(t) for t in args.seq_lens.split(",")]
    swept = sweep(args.batch, lens[0], "cuda", args.sweep.split(",")) if args.sweep else []
    for T in lens:
        rows += run(args.batch, T, "cuda", [int(h) for h in args.heads_per_program.split(",") if h])
        md = to_markdown(rows, env, command) + (sweep_markdown(swept) if swept else "")
        stem.with_suffix(".md").write_text(md)      # after every shape
        stem.with_suffix(".json").write_text(json.dumps({"env": env, "command": command, "rows": rows,
                                                         "sweep": swept}, indent=1))
    plot(rows, stem.with_suffix(".png"))
    print(md)
    return rows


if __name__ == "__main__":
    main()
