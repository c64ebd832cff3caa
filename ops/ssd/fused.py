"""Mamba-2 SSD on the `fused` backend: the `chunk` backend's stages with the `state` component (issue
[G]): the state scan split into segments where the (N, P, batch·head) tiles cannot fill the SMs
(ops/common/chunk_h.py). No `chunk` component ([F]) yet: its kernels take a per-key decay, and
SSD's is one scalar per head, which they would read K times over (fused GLA broadcasts a scalar
gate that way); chunk_o.chunk_fwd_o_scalar already forms SSD's A inside the output kernel.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ops.triton_utils import check_triton_device
from ops.ssd import chunk

COMPONENTS = ("state",)


check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every fused component this op has (state). Shapes as ops.ssd.naive.ssd."""
    return chunk.ssd_decay_attention(x, dt, A, B, C, initial_state, output_final_state, split_state=True)


def build(fuse: frozenset[str]) -> Callable:
    """`state` fused, or nothing: the `chunk` backend's computation (ops.get_op has checked the names)."""
    return ssd if "state" in fuse else chunk.ssd
