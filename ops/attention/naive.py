"""Softmax attention for the plain GPT-2 baseline.

`attention` (the `naive` backend) is torch's scaled_dot_product_attention, which is how the
ecosystem's GPT-2 (transformers, SDPA) runs; `attention_reference` materialises the T×T scores
in fp32 and is the oracle the tests compare against.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                        scale: float | None = None) -> torch.Tensor:
    """q, k, v: [B, T, H, D] → o [B, T, H, D], with explicit scores and softmax in fp32."""
    T, D = q.shape[1], q.shape[-1]
    scale = 1 / math.sqrt(D) if scale is None else scale
    s = torch.einsum("bihd,bjhd->bhij", q.float(), k.float()) * scale              # [B, H, T, T]
    if causal:
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v.float()).to(v.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
              scale: float | None = None) -> torch.Tensor:
    """q, k, v: [B, T, H, D] → o [B, T, H, D] (torch SDPA; flash/cuDNN kernels on GPU)."""
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=causal, scale=scale)
    return o.transpose(1, 2)
