"""GLA on the `fused` backend (DESIGN §4): the `chunk` backend's cumsum and state kernels, with the
intra-chunk scores, output and their backward fused so that neither A nor dA ([B, T, H, C] each)
reaches HBM (ops/common/fused_chunk.py). Components (`--fuse`): `chunk` (those kernels) and `state`
(issue [G]: the state scan split into segments where the (K, V, batch·head) tiles cannot fill the
SMs, ops/common/chunk_h.py); either alone runs inside the `chunk` backend's stages.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ops.common.chunk import check_triton_device as check_available  # noqa: F401
from ops.common.chunk import (check_inputs, chunk_decay_attention, input_grads, states_backward,
                              states_forward)
from ops.common.fused_chunk import fused_chunk_bwd_dqk, fused_chunk_bwd_dv, fused_chunk_fwd
from ops.gla import chunk

COMPONENTS = ("chunk", "state")
CHUNK_SIZES = (16, 32, 64, 128, 256)


class FusedChunkGLA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, scale, initial_state, output_final_state, chunk_size, split_state):
        q, k, v, b, h, ht = states_forward(ctx, q, k, v, g, scale, initial_state, output_final_state, chunk_size,
                                           split_state)
        o = fused_chunk_fwd(q, k, v, b, h, scale, chunk_size)
        ctx.save_for_backward(q, k, v, b, h)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, b, h = ctx.saved_tensors
        C, scale = ctx.chunk_size, ctx.scale
        do, dh, dh0 = states_backward(ctx, q, b, do, dht)
        dv = fused_chunk_bwd_dv(q, k, b, do, dh, scale, C)
        dq, dk, db = fused_chunk_bwd_dqk(q, k, v, b, h, do, dh, scale, C)
        return input_grads(ctx, dq, dk, dv, db, dh0)


def fused_chunk_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, scale: float,
                    initial_state: torch.Tensor | None, output_final_state: bool,
                    chunk_size: int = 64, split_state: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as ops.gla.naive.gla. A scalar decay [B, T, H, 1] is broadcast over K: the fused kernels
    take a per-key decay, and autograd sums the broadcast's gradient back."""
    check_inputs(q, k, v, chunk_size, CHUNK_SIZES)
    if gk.shape[-1] == 1 and q.shape[-1] != 1:
        gk = gk.expand(*gk.shape[:-1], q.shape[-1])
    return FusedChunkGLA.apply(q, k, v, gk, scale, initial_state, output_final_state, chunk_size, split_state)


@functools.cache
def _op(fuse_chunk: bool, split_state: bool) -> Callable:
    """The op with the chosen components, one function object per choice (the registry's tests
    compare them by identity)."""
    def gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor,
            scale: float | None = None, initial_state: torch.Tensor | None = None,
            output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Shapes as ops.gla.naive.gla."""
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        if fuse_chunk:
            return fused_chunk_gla(q, k, v, gk, scale, initial_state, output_final_state, split_state=split_state)
        return chunk_decay_attention(q, k, v, gk, scale, initial_state, output_final_state, split_state=split_state)
    return gla


gla = _op(True, True)
gla.__doc__ = "Every fused component this op has (chunk, state). Shapes as ops.gla.naive.gla."


def build(fuse: frozenset[str]) -> Callable:
    """The op with only the components in `fuse` fused (ops.get_op has checked they exist here).
    With neither it is the `chunk` backend's computation, the ablation baseline, and the run log
    says so (ops.fused_label)."""
    if not fuse & set(COMPONENTS):
        return chunk.gla
    return _op("chunk" in fuse, "state" in fuse)
