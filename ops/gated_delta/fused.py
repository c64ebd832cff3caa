"""Gated DeltaNet on the `fused` backend: the `chunk` backend's stages. No component inside the mixer is fused
(the WY stage sits between the state pass and the output), so the fused Gated DeltaNet model differs from `chunk`
only in its projection chain, the layer-level `proj` component (the gdn_proj_in and proj_out ops). This module
exists so that `--backend fused` names that model and the run log records `gated_delta: fused[]`.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ops import backend_fn
from ops.gated_delta import chunk
from ops.triton_utils import check_triton_device

COMPONENTS: tuple[str, ...] = ()

check_available = check_triton_device       # ops.get_op calls it with (op, backend)


@backend_fn(chunk_sizes=chunk.CHUNK_SIZES, plan=chunk.plan)
def gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                scale: float | None = None, initial_state: torch.Tensor | None = None,
                output_final_state: bool = False, chunk_size: int = 64,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The `chunk` backend's computation (shapes as ops.gated_delta.naive.gated_delta; cu_seqlens as there)."""
    return chunk.gated_delta(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, cu_seqlens)


def build(fuse: frozenset[str]) -> Callable:
    """No component of this op is fused (ops.get_op has refused any it was asked for): the chunk stages."""
    return gated_delta


__all__ = ["gated_delta", "build", "COMPONENTS"]
