"""GLA on the `chunk` backend: flash-linear-attention's decomposition in our Triton stages
(ops/common/), with a per-key-dim decay gk [B, T, H, K] or one decay per head, gk [B, T, H, 1]."""
from __future__ import annotations

import torch

from ops.chunkwise.decay_attention import chunk_decay_attention
from ops.triton_utils import check_triton_device


check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor,
        scale: float | None = None, initial_state: torch.Tensor | None = None,
        output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as ops.gla.naive.gla: q, k, gk [B, T, H, K] (gk may be [B, T, H, 1]); v [B, T, H, V];
    states [B, H, K, V] fp32. Returns o in v's dtype and the final state if asked."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return chunk_decay_attention(q, k, v, gk, scale, initial_state, output_final_state)
