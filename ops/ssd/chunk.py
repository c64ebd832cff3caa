"""Mamba-2 SSD on the `chunk` backend: the same Triton stages as GLA with a scalar decay
(q = C, k = B, v = dt·x, log-decay dt·A, scale 1)."""
from __future__ import annotations

import torch

from ops.chunkwise.decay_attention import chunk_decay_attention
from ops.triton_utils import check_triton_device


check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as ops.ssd.naive.ssd: x [B, T, H, P]; dt [B, T, H]; A [H]; B, C [B, T, G, N]."""
    return ssd_decay_attention(x, dt, A, B, C, initial_state, output_final_state, split_state=False)


def ssd_decay_attention(x, dt, A, B, C, initial_state, output_final_state: bool, split_state: bool):
    """SSD as chunk_decay_attention; split_state: the `fused` backend's `state` component
    (ops/ssd/fused.py)."""
    v = (x * dt.unsqueeze(-1)).to(x.dtype)                                      # [B, T, H, P]
    g = (dt.float() * A.float()).unsqueeze(-1)                                  # [B, T, H, 1]
    # C and B stay per group [B, T, G, N]: chunk_decay_attention expands them per head inside
    return chunk_decay_attention(C.to(x.dtype), B.to(x.dtype), v, g, 1.0, initial_state, output_final_state,
                                 split_state=split_state)
