"""Tile sizes and dot precision shared by the chunk stages."""
from __future__ import annotations

import torch
import triton


def tile(D: int) -> int:
    """A head-dim tile: the next power of two, at least 16 (tl.dot's minimum), at most 64."""
    return min(64, max(16, triton.next_power_of_2(D)))


def dot_precision(x: torch.Tensor) -> str:
    """fp32 inputs stay exact ("ieee", no TF32); bf16 operands use the tensor cores either way."""
    return "ieee" if x.dtype == torch.float32 else "tf32"
