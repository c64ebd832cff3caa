"""The input side of GLA's projection chain, in PyTorch: the oracle for issue [H]'s `proj` component and
what the GLA layer runs when `proj` is not fused.

    q = x W_qᵀ,  k = x W_kᵀ,  v = x W_vᵀ,  r = x W_rᵀ                  (r: the output gate, before its SiLU)
    gk = logsigmoid((x W_downᵀ) W_upᵀ + b) / normalizer                 (low rank L, in fp32)

This is exactly the GLA layer's five nn.Linear calls and its gate line, op for op (model/gla.py before the
op existed), so under bf16 autocast it casts and rounds where the model always did: each F.linear casts x
to bf16 on its own, and gk_up's output is rounded to bf16 before the fp32 logsigmoid.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def proj_in(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_r: torch.Tensor,
            w_down: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor, n_heads: int,
            normalizer: float = 16.0) -> tuple[torch.Tensor, ...]:
    """x: [B, T, d] (the block's normed input); w_q, w_k: [H·K, d]; w_v, w_r: [H·V, d]; w_down: [L, d];
    w_up: [H·K, L]; b_up: [H·K] (nn.Linear's layouts). Returns q, k [B, T, H, K], v [B, T, H, V],
    gk [B, T, H, K] fp32 (log-decays ≤ 0) and r [B, T, H·V]."""
    B, T, _ = x.shape
    H = n_heads
    q = F.linear(x, w_q).view(B, T, H, -1)                                     # [B, T, H, K]
    k = F.linear(x, w_k).view(B, T, H, -1)                                     # [B, T, H, K]
    v = F.linear(x, w_v).view(B, T, H, -1)                                     # [B, T, H, V]
    z = F.linear(F.linear(x, w_down), w_up, b_up)                              # [B, T, H·K]
    gk = F.logsigmoid(z.float()).view(B, T, H, -1) / normalizer                # [B, T, H, K] fp32
    r = F.linear(x, w_r)                                                       # [B, T, H·V]
    return q, k, v, gk, r
