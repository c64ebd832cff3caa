"""Where the fused output projection's time goes at one shape, and how its elementwise kernels' launch shape
moves it: a torch.profiler kernel table of fused vs unfused forward+backward, then a sweep of the gate kernels'
tile size, warps and backward rows per program (ops/proj_out/fused.py's module constants), each checked against
the default launch's outputs before it is timed. CUDA only.

    python scripts/profile_proj_out.py --shape 8,2048,1,2048,1024 --gate-first      # Mamba2-370M's output side
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from triton.testing import do_bench

from ops.proj_out import fused, naive


def profiled_steps(fn, args, dys, steps: int = 5) -> torch.profiler.profile:
    """torch.profiler (CUDA) over `steps` forward+backward steps of fn(*args) under bf16 autocast, after 3 warm-up
    steps. dys: the output's gradient (a tuple of them for several outputs). The inputs' .grad is reset after each
    step, as zero_grad(set_to_none=True) does, so no gradient-accumulation kernels enter the profile."""
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ys = fn(*args)
        torch.autograd.backward(ys, dys)
        for x in args:
            x.grad = None
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return prof


def kernel_table(fn, args, dys, label: str, rows: int = 14) -> None:
    """Prints torch.profiler's CUDA kernel table over 5 forward+backward steps of fn(*args) (profiled_steps)."""
    prof = profiled_steps(fn, args, dys)
    print(f"== {label}: CUDA kernels over 5 forward+backward steps")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8,2048,1,2048,1024", help="B,T,H,V,d")
    ap.add_argument("--gate-first", action="store_true")
    args = ap.parse_args(argv)
    B, T, H, V, d = map(int, args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    o = torch.randn(B, T, H, V, device="cuda", generator=g).bfloat16().requires_grad_()
    r = torch.randn(B, T, H * V, device="cuda", generator=g).bfloat16().requires_grad_()
    nw = (1 + 0.3 * torch.randn(V, device="cuda", generator=g)).requires_grad_()
    w = (torch.randn(d, H * V, device="cuda", generator=g) / (H * V) ** 0.5).requires_grad_()
    res = torch.randn(B, T, d, device="cuda", generator=g).requires_grad_()
    dy = torch.randn(B, T, d, device="cuda", generator=g)
    kw = dict(eps=1e-5, gate_first=args.gate_first)
    fn_f = lambda *a: fused.proj_out(*a, **kw)                                              # noqa: E731
    fn_n = lambda *a: naive.proj_out(*a, **kw)                                              # noqa: E731
    kernel_table(fn_n, (o, r, nw, w, res), dy, "unfused")
    kernel_table(fn_f, (o, r, nw, w, res), dy, "fused")

    # the elementwise kernels alone, on the GEMM's operands as the op hands them over
    o2, r2 = o.detach().reshape(B * T, H * V), r.detach().reshape(B * T, H * V)
    dg = torch.randn_like(o2)
    ref_g = fused.gate_fwd(o2, r2, nw.detach(), 1e-5, V, args.gate_first)
    ref_b = fused.gate_bwd(dg, o2, r2, nw.detach(), 1e-5, V, args.gate_first)
    moved = 3 * o2.numel() * 2, 6 * o2.numel() * 2                                          # bytes: fwd, bwd
    rows = []
    default = (fused.TILE_ELEMS, fused.TILE_WARPS, fused.BWD_LOOP, fused.BWD_MIN_ROWS)
    for elems, warps, loop, min_rows in itertools.chain([default], itertools.product(
            (2048, 4096, 8192), (4, 8, 16), (1,), (1, 8, 32))):
        fused.TILE_ELEMS, fused.TILE_WARPS, fused.BWD_LOOP, fused.BWD_MIN_ROWS = elems, warps, loop, min_rows
        try:
            gf = fused.gate_fwd(o2, r2, nw.detach(), 1e-5, V, args.gate_first)
            gb = fused.gate_bwd(dg, o2, r2, nw.detach(), 1e-5, V, args.gate_first)
            ok = torch.equal(gf, ref_g) and all((a.float() - b.float()).abs().max() <= 1e-2 * b.float().abs().max()
                                                for a, b in zip(gb, ref_b))
            tf = do_bench(lambda: fused.gate_fwd(o2, r2, nw.detach(), 1e-5, V, args.gate_first), return_mode="median")
            tb = do_bench(lambda: fused.gate_bwd(dg, o2, r2, nw.detach(), 1e-5, V, args.gate_first),
                          return_mode="median")
            rows.append((elems, warps, loop, min_rows, tf, tb, ok))
        except Exception as e:                                     # a launch shape that cannot compile
            print(f"elems {elems} warps {warps} min_rows {min_rows}: {type(e).__name__}: {str(e)[:120]}")
    fused.TILE_ELEMS, fused.TILE_WARPS, fused.BWD_LOOP, fused.BWD_MIN_ROWS = default
    print(f"== gate kernels alone, [{B * T}, {H * V}] V {V} gate_first {args.gate_first} "
          f"(fwd moves {moved[0] / 1e6:.0f} MB, bwd {moved[1] / 1e6:.0f} MB; first row: the defaults)")
    print("| tile elems | warps | bwd loop | bwd min rows | fwd ms | fwd GB/s | bwd ms | bwd GB/s | same result |")
    print("|---|---|---|---|---|---|---|---|---|")
    for elems, warps, loop, min_rows, tf, tb, ok in rows:
        print(f"| {elems} | {warps} | {loop} | {min_rows} | {tf:.4f} | {moved[0] / tf / 1e6:.0f} | {tb:.4f} | "
              f"{moved[1] / tb / 1e6:.0f} | {ok} |")


if __name__ == "__main__":
    main()
