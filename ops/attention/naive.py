"""Softmax attention for the plain GPT-2 baseline.

`attention` (the `naive` backend) is torch's scaled_dot_product_attention, which is how the
ecosystem's GPT-2 (transformers, SDPA) runs; `attention_reference` materialises the T×T scores
in fp32 and is the oracle the tests compare against.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ops import varlen


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                        scale: float | None = None, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """q, k, v: [B, T, H, D] → o [B, T, H, D], with explicit scores and softmax in fp32; cu_seqlens as
    `attention`'s."""
    T, D = q.shape[1], q.shape[-1]
    scale = 1 / math.sqrt(D) if scale is None else scale
    s = torch.einsum("bihd,bjhd->bhij", q.float(), k.float()) * scale              # [B, H, T, T]
    if cu_seqlens is not None:
        varlen.offsets(cu_seqlens, q.shape[0], T, "attention")
        s = s.masked_fill(~varlen.causal_document_mask(cu_seqlens, T), float("-inf"))
    elif causal:
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v.float()).to(v.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
              scale: float | None = None, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """q, k, v: [B, T, H, D] → o [B, T, H, D] (torch SDPA; flash/cuDNN kernels on GPU). With cu_seqlens (packed
    documents, B = 1; ops/varlen.py) each query sees only the keys of its own document up to itself: SDPA with a
    block-diagonal causal bool mask [T, T] (O(T²) memory; `causal` is implied)."""
    mask = None
    if cu_seqlens is not None:
        varlen.offsets(cu_seqlens, q.shape[0], q.shape[1], "attention")
        mask, causal = varlen.causal_document_mask(cu_seqlens, q.shape[1]), False
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask, is_causal=causal, scale=scale)
    return o.transpose(1, 2)


def make_inputs(shape: dict, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, requires_grad: bool = True, causal: bool = True) -> dict:
    """The keyword arguments of `attention` at shape {B, T, H, D}, shared by the tests and the benchmark:
    q, k, v [B, T, H, D] drawn N(0, 1) in fp32 (fp64 for fp64) and rounded to dtype; causal. Drawn on `device`
    from `seed`, or from a fresh seed when None; every tensor is a leaf, requiring grad if asked."""
    B, T, H, D = (shape[n] for n in "BTHD")
    g = torch.Generator(device=device).manual_seed(torch.seed() % 2**31 if seed is None else seed)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    out = {n: torch.randn(B, T, H, D, generator=g, device=device, dtype=acc).to(dtype).requires_grad_(requires_grad)
           for n in ("q", "k", "v")}
    return {**out, "causal": causal}
