"""One decode step of the gated delta rule on the `fused` backend: the single-step Triton kernel
(ops/decode/step.py), one program per (batch, head, V-tile) updating its state tile in place. No components."""
from __future__ import annotations

from collections.abc import Callable

import torch

from ops import backend_fn
from ops.decode.step import DELTA, recurrent_step, step_plan
from ops.triton_utils import check_dtypes, check_triton_device

COMPONENTS: tuple[str, ...] = ()

check_available = check_triton_device       # ops.get_op calls it with (op, backend)


@backend_fn(plan=step_plan)
def gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Shapes as ops.gated_delta_step.naive.gated_delta_step: q, k [B, H, K]; v [B, H, V]; g, beta [B, H];
    state contiguous fp32 [B, H, K, V], updated in place → (o [B, H, V] in v's dtype, state)."""
    check_dtypes("gated_delta_step", "fused", q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return recurrent_step(DELTA, q, k, v, g, beta, None, state, float(scale)), state


def build(fuse: frozenset[str]) -> Callable:
    """No fused components: the step kernel (ops.get_op has refused any component asked for)."""
    return gated_delta_step
