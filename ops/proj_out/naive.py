"""The output side of a token mixer's projection chain, in PyTorch: the oracle for issue [H]'s `proj`
component and what the mixers run when `proj` is not fused. Two orderings of the norm and the gate:

    g = RMSNorm_head(o) · w ⊙ silu(r)          GLA, Gated DeltaNet (gate_first=False): per head over its
                                               V channels, one weight shared by heads
    g = RMSNorm_head(o ⊙ silu(r)) · w          Mamba-2 (gate_first=True): the gate before the norm; Mamba-2
                                               passes o as one head of V = d_inner channels
    y = residual + g W_oᵀ                      the block's residual add, when a residual is given

This is exactly model.common.RMSNorm and the mixer's gate in the mixer's order, then o_proj/out_proj and
the block's `x + …`, op for op (the norm weight cast to its input's dtype as RMSNorm does), so that under
bf16 autocast it rounds where the model always rounded.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def proj_out(o: torch.Tensor, r: torch.Tensor, norm_weight: torch.Tensor, w_o: torch.Tensor,
             residual: torch.Tensor | None = None, eps: float = 1e-6, *, gate_first: bool = False) -> torch.Tensor:
    """o: [B, T, H, V] the mixer's output; r: [B, T, H·V] the gate before its SiLU (x W_r, or Mamba-2's z);
    norm_weight: [V]; w_o: [d, H·V] (nn.Linear's layout); residual: [B, T, d] or None.
    Returns [B, T, d]: residual + (RMSNorm_head(o) ⊙ silu(r)) W_oᵀ, or with gate_first
    residual + RMSNorm_head(o ⊙ silu(r)) W_oᵀ."""
    B, T, H, V = o.shape
    gate = F.silu(r.view(B, T, H, V))                                         # [B, T, H, V]
    if gate_first:
        x = o * gate                                                          # [B, T, H, V]
        gated = F.rms_norm(x, (V,), norm_weight.to(x.dtype), eps)             # [B, T, H, V]
    else:
        normed = F.rms_norm(o, (V,), norm_weight.to(o.dtype), eps)            # [B, T, H, V]
        gated = normed * gate                                                 # [B, T, H, V]
    y = F.linear(gated.reshape(B, T, H * V), w_o)                             # [B, T, d]
    return y if residual is None else residual + y
