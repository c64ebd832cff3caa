"""One decode step of Mamba-2's SSD on the `fused` backend: the single-step Triton kernel (ops/decode/step.py) with
q = C, k = B (read through the group map), v = x scaled by dt, log-decay dt·A, scale 1. No components."""
from __future__ import annotations

from collections.abc import Callable

import torch

from ops import backend_fn
from ops.decode.step import SSD, recurrent_step, step_plan
from ops.triton_utils import check_dtypes, check_triton_device

COMPONENTS: tuple[str, ...] = ()

check_available = check_triton_device       # ops.get_op calls it with (op, backend)


@backend_fn(plan=step_plan)
def ssd_step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Shapes as ops.ssd_step.naive.ssd_step: x [B, H, P]; dt [B, H]; A (H,); B, C [B, G, N]; state contiguous
    fp32 [B, H, N, P], updated in place → (y [B, H, P] in x's dtype, state)."""
    check_dtypes("ssd_step", "fused", x, B, C)
    H, G = x.shape[1], B.shape[1]
    if H % G:
        raise ValueError(f"ssd_step: {H} heads are not divisible into {G} groups")
    return recurrent_step(SSD, C, B, x, None, dt, A.contiguous(), state, 1.0), state


def build(fuse: frozenset[str]) -> Callable:
    """No fused components: the step kernel (ops.get_op has refused any component asked for)."""
    return ssd_step
