"""One decode step of GLA on the `fused` backend: the single-step Triton kernel (ops/decode/step.py), one program
per (batch, head, V-tile) updating its state tile in place. No components to choose."""
from __future__ import annotations

from collections.abc import Callable

import torch

from ops import backend_fn
from ops.decode.step import GLA, recurrent_step, step_plan
from ops.triton_utils import check_dtypes, check_triton_device

COMPONENTS: tuple[str, ...] = ()

check_available = check_triton_device       # ops.get_op calls it with (op, backend)


@backend_fn(plan=step_plan)
def gla_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, state: torch.Tensor,
             scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Shapes as ops.gla_step.naive.gla_step: q, k, gk [B, H, K] (gk may be [B, H, 1]); v [B, H, V]; state
    contiguous fp32 [B, H, K, V], updated in place → (o [B, H, V] in v's dtype, state)."""
    check_dtypes("gla_step", "fused", q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if gk.shape[-1] != q.shape[-1]:
        gk = gk.expand(q.shape).contiguous()
    return recurrent_step(GLA, q, k, v, gk, None, None, state, float(scale)), state


def build(fuse: frozenset[str]) -> Callable:
    """No fused components: the step kernel (ops.get_op has refused any component asked for)."""
    return gla_step
