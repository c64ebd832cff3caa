"""Profile the WMMA attention kernel beside SDPA at one shape under Nsight Compute (issue [J]):

    ncu --target-processes all --kernel-name regex:'wmma|fmha|flash|cudnn|sm90' --section SpeedOfLight \
        --section WarpStateStats --section LaunchStats --section Occupancy python scripts/profile_wmma.py

Runs each variant a few times (the profiler sees each launch; the first of each is the warm-up), so ncu's
duration and stall reasons say where a small shape's time goes.

    python scripts/profile_wmma.py --phases

builds the kernel a second time with -DWMMA_TIMING (its own extension name and folder; the op's build never
has it) and prints, per key split, the cycles each block spends from its start to each phase: the Q and
first K/V loads, the key loop, the group barrier, the merge and the stores (median and max over blocks).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F


PHASES = ("loads + barrier", "key loop (warp 0)", "all groups done", "partials staged", "merge + stores")


def phases(B: int, H: int, T: int, causal: bool, reps: int) -> None:
    import os

    from torch.utils.cpp_extension import load

    from ops.attention import fused

    build = Path(os.environ.get("CHUNKFUSE_EXT_DIR", Path.home() / ".cache" / "chunkfuse" / "ext")) / "wmma_timing"
    build.mkdir(parents=True, exist_ok=True)
    ext = load(name="chunkfuse_wmma_attention_timing", sources=[str(fused._SOURCE)], build_directory=str(build),
               extra_cuda_cflags=["-O3", "--use_fast_math", "-DWMMA_TIMING"])
    q, k, v = (torch.randn(B, T, H, 64, device="cuda").half() for _ in range(3))
    o = torch.empty_like(q)
    blocks = B * H * -(-T // 64)
    print(f"B{B} H{H} T{T} causal={causal}: {blocks} blocks; cycles from each block's start (clock64), "
          "median / max over blocks")
    print(f"{'split':>5} | " + " | ".join(f"{p:>18}" for p in PHASES) + " | event µs")
    for split in fused.SPLITS:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(reps):
            start.record()
            ext.forward(q, k, v, o, causal, 64 ** -0.5, split)
            end.record()
        torch.cuda.synchronize()
        stamps = ext.phases()[:blocks]
        d = (stamps[:, 1:] - stamps[:, :1]).double()
        cells = [f"{d[:, i].median().item():8.0f} / {d[:, i].max().item():7.0f}" for i in range(d.shape[1])]
        print(f"{split:>5} | " + " | ".join(cells) + f" | {start.elapsed_time(end) * 1e3:.1f}")


def main() -> None:
    from ops.attention import fused

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1,8,512", help="B,H,T (head dim 64)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--phases", action="store_true", help="per-block cycle breakdown from a -DWMMA_TIMING build")
    args = p.parse_args()
    B, H, T = (int(x) for x in args.shape.split(","))
    if args.phases:
        return phases(B, H, T, args.causal, max(args.reps, 3))
    q, k, v = (torch.randn(B, T, H, 64, device="cuda").half() for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    with torch.no_grad():
        for split in fused.SPLITS:
            for _ in range(args.reps):
                fused.wmma_attention(q, k, v, args.causal, None, split)
        for _ in range(args.reps):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
