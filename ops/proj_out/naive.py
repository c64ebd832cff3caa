"""The output side of a token mixer's projection chain, in PyTorch: the oracle for issue [H]'s `proj`
component and what the GLA layer runs when `proj` is not fused.

    g = RMSNorm_head(o) · w ⊙ silu(r)          per head over its V channels, one weight shared by heads
    y = residual + g W_oᵀ                      the block's residual add, when a residual is given

This is exactly model.common.RMSNorm followed by the mixer's gate, o_proj and the block's `x + …`,
op for op (the norm weight cast to o's dtype as RMSNorm does), so that under bf16 autocast it
rounds where the model always rounded.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def proj_out(o: torch.Tensor, r: torch.Tensor, norm_weight: torch.Tensor, w_o: torch.Tensor,
             residual: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """o: [B, T, H, V] the mixer's output; r: [B, T, H·V] the gate before its SiLU (x W_r);
    norm_weight: [V]; w_o: [d, H·V] (nn.Linear's layout); residual: [B, T, d] or None.
    Returns [B, T, d]: residual + (RMSNorm_head(o) ⊙ silu(r)) W_oᵀ."""
    B, T, H, V = o.shape
    normed = F.rms_norm(o, (V,), norm_weight.to(o.dtype), eps)                # [B, T, H, V]
    gated = normed * F.silu(r.view(B, T, H, V))                               # [B, T, H, V]
    y = F.linear(gated.reshape(B, T, H * V), w_o)                             # [B, T, d]
    return y if residual is None else residual + y
