"""The input side of Gated DeltaNet's projection chain, in PyTorch: the oracle for issue [H]'s `proj` component
and what the layer runs when `proj` is not fused.

    q, k = L2norm_head(SiLU(conv4(x W_{q,k}ᵀ))),   v = SiLU(conv4(x W_vᵀ)),   r = x W_rᵀ   (the output gate)
    β = sigmoid(x W_βᵀ),   g = −exp(A_log) · softplus(x W_aᵀ + dt_bias)                    (fp32)

Exactly the layer's own lines before the op existed (model/gated_deltanet.py: its nn.Linear, ShortConv and
F.normalize calls), op for op, so that under bf16 autocast it casts and rounds where the model always did.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ops.proj.short_conv import short_conv_ref


def gdn_proj_in(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_r: torch.Tensor,
                w_b: torch.Tensor, w_a: torch.Tensor, conv_q: torch.Tensor, conv_k: torch.Tensor,
                conv_v: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                n_heads: int) -> tuple[torch.Tensor, ...]:
    """x: [B, T, d] (the block's normed input); w_q, w_k: [H·K, d]; w_v, w_r: [H·V, d]; w_b, w_a: [H, d]
    (nn.Linear's layouts); conv_q, conv_k: [H·K, 1, W] and conv_v: [H·V, 1, W] (nn.Conv1d's); A_log, dt_bias: [H].
    Returns q, k [B, T, H, K] and v [B, T, H, V] (one dtype: v's), g, β [B, T, H] fp32 and r [B, T, H·V]."""
    B, T, _ = x.shape
    H = n_heads
    # ShortConv, then F.normalize per head (eps 1e-6), as the layer ran them
    q = short_conv_ref(F.linear(x, w_q), conv_q, head_dim=w_q.shape[0] // H).view(B, T, H, -1)
    k = short_conv_ref(F.linear(x, w_k), conv_k, head_dim=w_k.shape[0] // H).view(B, T, H, -1)
    v = short_conv_ref(F.linear(x, w_v), conv_v).view(B, T, H, -1)
    # CUDA autocast runs F.normalize in fp32; the mixer ops take q, k, v in one dtype
    q, k = q.to(v.dtype), k.to(v.dtype)
    beta = F.linear(x, w_b).float().sigmoid()                                          # [B, T, H]
    g = -A_log.float().exp() * F.softplus(F.linear(x, w_a).float() + dt_bias)          # [B, T, H]
    return q, k, v, g, beta, F.linear(x, w_r)
