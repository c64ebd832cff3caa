"""Mamba-2 SSD on the `chunk` backend: the chunkwise stages GLA runs, with a scalar decay
(q = C, k = B, v = dt·x, log-decay dt·A, scale 1)."""
from __future__ import annotations

import functools

import torch

from ops import backend_fn, varlen
from ops.chunkwise.decay_attention import CHUNK_SIZES, chunk_decay_attention, stages_plan
from ops.triton_utils import check_dtypes, check_triton_device

check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def ssd_plan(device: torch.device, B: int, T: int, H: int, N: int, P: int, chunk_size: int, split_state: bool,
             **_) -> str:
    """The stages at SSD's dims: keys of N = the state size, values of P = the head dim."""
    return stages_plan(device, B, T, H, N, P, chunk_size, split_state)


@backend_fn(chunk_sizes=CHUNK_SIZES, plan=functools.partial(ssd_plan, split_state=False))
def ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
        initial_state: torch.Tensor | None = None, output_final_state: bool = False,
        chunk_size: int = 64, cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as ops.ssd.naive.ssd: x [B, T, H, P]; dt [B, T, H]; A (H,); B, C [B, T, G, N]. cu_seqlens: packed
    documents in ops/varlen.py's chunk-aligned layout (B = 1, states [N, H, N, P]; at most N·(C − 1) padded
    tokens)."""
    return ssd_decay_attention(x, dt, A, B, C, initial_state, output_final_state, chunk_size, split_state=False,
                               cu_seqlens=cu_seqlens)


def ssd_decay_attention(x, dt, A, B, C, initial_state, output_final_state: bool, chunk_size: int, split_state: bool,
                        cu_seqlens: torch.Tensor | None = None):
    """SSD as chunk_decay_attention; split_state: the `fused` backend's `state` component (not with cu_seqlens:
    packed documents run the state pass unsplit). Padding dt = 0 gives v = 0 and log-decay 0."""
    check_dtypes("ssd", "fused" if split_state else "chunk", x, B, C)
    if cu_seqlens is not None:
        return varlen.run_chunk_aligned(
            "ssd", cu_seqlens, chunk_size, initial_state, (x, dt, B, C),
            lambda x, dt, B, C, docs: _ssd_stages(x, dt, A, B, C, initial_state, output_final_state, chunk_size,
                                                  False, docs))
    return _ssd_stages(x, dt, A, B, C, initial_state, output_final_state, chunk_size, split_state)


def _ssd_stages(x, dt, A, B, C, initial_state, output_final_state: bool, chunk_size: int, split_state: bool,
                docs: varlen.Documents | None = None):
    """The stages on SSD's tensors: q = C, k = B, v = dt·x, g = dt·A."""
    v = (x * dt.unsqueeze(-1)).to(x.dtype)                                      # [B, T, H, P]
    g = (dt.float() * A.float()).unsqueeze(-1)                                  # [B, T, H, 1]
    # C and B stay per group [B, T, G, N]: the chunkwise kernels read each head's group in place
    return chunk_decay_attention(C.to(x.dtype), B.to(x.dtype), v, g, 1.0, initial_state, output_final_state,
                                 chunk_size, split_state, docs)
