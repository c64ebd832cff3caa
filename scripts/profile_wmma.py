"""Profile the WMMA attention kernel beside SDPA at one shape under Nsight Compute (issue [J]):

    ncu --target-processes all --kernel-name regex:'wmma|fmha|flash|cudnn|sm90' --section SpeedOfLight \
        --section WarpStateStats --section LaunchStats --section Occupancy python scripts/profile_wmma.py

Runs each variant a few times (the profiler sees each launch; the first of each is the warm-up), so ncu's
duration and stall reasons say where a small shape's time goes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F


def main() -> None:
    from ops.attention import fused

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1,8,512", help="B,H,T (head dim 64)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args()
    B, H, T = (int(x) for x in args.shape.split(","))
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
