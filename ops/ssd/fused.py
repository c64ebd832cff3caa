"""Mamba-2 SSD on the `fused` backend: the `chunk` backend's stages with the `state` component, the state pass
split into chunk ranges where the (N, P, batch·head) tiles cannot fill the SMs (ops/chunkwise/state.py). There is
no `chunk` component: the fused GLA kernels take a per-key decay, and SSD's is one scalar per head, which they would
read N times over; chunkwise/output.py already forms SSD's scores inside its output kernel.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ops import backend_fn
from ops.chunkwise.decay_attention import CHUNK_SIZES
from ops.ssd import chunk
from ops.triton_utils import check_triton_device

COMPONENTS = ("state",)

check_available = check_triton_device       # ops.get_op calls it with (op, backend)


@backend_fn(chunk_sizes=CHUNK_SIZES, plan=functools.partial(chunk.ssd_plan, split_state=True))
def ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
        initial_state: torch.Tensor | None = None, output_final_state: bool = False,
        chunk_size: int = 64, cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every fused component this op has (state). Shapes as ops.ssd.naive.ssd; cu_seqlens as the `chunk`
    backend's (packed documents run the state pass unsplit)."""
    return chunk.ssd_decay_attention(x, dt, A, B, C, initial_state, output_final_state, chunk_size, split_state=True,
                                     cu_seqlens=cu_seqlens)


def build(fuse: frozenset[str]) -> Callable:
    """`state` fused, or nothing: the `chunk` backend's computation (ops.get_op has checked the names)."""
    return ssd if "state" in fuse else chunk.ssd
