"""The intra-chunk scores alone: chunk's kernel (ops/common/chunk_intra.py, one program per 16-row block pair,
diagonal blocks elementwise) against the fused forward's (ops/common/fused_intra.py, one program per chunk,
one factorised dot per key tile, three with the bf16 hi/lo split or one without), each checked against the
fp32 reference on the same bf16 inputs, then timed (median of do_bench).

    python scripts/bench_fused_intra.py [--shapes 8,2048,4,256 16,2048,12,64]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402

from eval.equivalence import rel  # noqa: E402
from ops.chunkwise.intra import chunk_intra_fwd, chunk_intra_fwd_ref  # noqa: E402
from ops.chunkwise.cumsum import chunk_cumsum  # noqa: E402
from ops.gla.fused_intra import fused_intra_fwd  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["8,2048,4,256", "16,2048,12,64"], help="B,T,H,K")
    p.add_argument("--chunk", type=int, default=64)
    args = p.parse_args()
    C = args.chunk
    print("| B T H K | kernel | rel. error vs fp32 ref | ms |\n|---|---|---|---|")
    for shape in args.shapes:
        B, T, H, K = map(int, shape.split(","))
        torch.manual_seed(0)
        q, k = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        b = chunk_cumsum(torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device="cuda")) / 16, C)
        ref = chunk_intra_fwd_ref(q.float(), k.float(), b, K ** -0.5, C)
        kernels = {"chunk_intra_fwd": lambda: chunk_intra_fwd(q, k, b, K ** -0.5, C),
                   "fused_intra_fwd (3 dots)": lambda: fused_intra_fwd(q, k, b, K ** -0.5, C),
                   "fused_intra_fwd (1 dot)": lambda: fused_intra_fwd(q, k, b, K ** -0.5, C, SPLIT=False)}
        for name, fn in kernels.items():
            err = rel(fn(), ref)
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            print(f"| {B} {T} {H} {K} | {name} | {err:.2e} | {ms:.3f} |", flush=True)
        del ref


if __name__ == "__main__":
    main()
