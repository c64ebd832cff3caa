"""The input side of Mamba-2's projection chain, in PyTorch: the oracle for the fused `proj` component and
what the layer runs when `proj` is not fused.

    z, xBC, dt = split(u W_inᵀ);   x, B, C = split(SiLU(conv4(xBC) + b));   dt = softplus(dt + dt_bias)  (fp32)

Exactly the layer's own lines before the op existed (model/mamba2.py), op for op.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ops.proj.short_conv import short_conv_ref


def mamba2_proj_in(u: torch.Tensor, w_in: torch.Tensor, conv_w: torch.Tensor, conv_b: torch.Tensor | None,
                   dt_bias: torch.Tensor, d_inner: int, d_state: int,
                   cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """u: [B, T, d]; w_in: [2·d_inner + 2·d_state + H, d] (rows z | x | B | C | dt; d_state = G·N);
    conv_w: [d_inner + 2·d_state, 1, W]; conv_b: [d_inner + 2·d_state] or None; dt_bias: (H,).
    Returns z [B, T, d_inner], x [B, T, d_inner], B, C [B, T, d_state] and dt [B, T, H] fp32.
    cu_seqlens: packed documents (B = 1): the short convolution restarts at each document (ops/varlen.py)."""
    H = dt_bias.shape[0]
    z, xBC, dt = F.linear(u, w_in).split([d_inner, d_inner + 2 * d_state, H], -1)
    x, Bm, Cm = short_conv_ref(xBC, conv_w, conv_b, cu_seqlens=cu_seqlens).split([d_inner, d_state, d_state], -1)
    return z, x, Bm, Cm, F.softplus(dt.float() + dt_bias)


def make_inputs(shape: dict, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, requires_grad: bool = True, bias: bool = True) -> dict:
    """The keyword arguments of `mamba2_proj_in` at shape {B, T, d, d_inner, d_state, H, W}, shared by the tests
    and the benchmark: u [B, T, d], w_in, conv_w, conv_b (None without bias) and dt_bias = N(0, 1) − 3 in dtype
    (fp32: the model's input and parameters under autocast), scaled so that activations are O(1); d_inner and
    d_state. Drawn on `device` from `seed`, or from a fresh seed when None; every tensor is a leaf, requiring
    grad if asked."""
    B, T, d, d_inner, d_state, H, W = (shape[n] for n in ("B", "T", "d", "d_inner", "d_state", "H", "W"))
    g = torch.Generator(device=device).manual_seed(torch.seed() % 2**31 if seed is None else seed)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    conv_dim = d_inner + 2 * d_state

    def draw(*size, scale=1.0, shift=0.0):
        return (torch.randn(size, generator=g, device=device, dtype=acc) * scale + shift).to(dtype)
    out = {"u": draw(B, T, d), "w_in": draw(d_inner + conv_dim + H, d, scale=d ** -0.5),
           "conv_w": draw(conv_dim, 1, W, scale=W ** -0.5), "conv_b": draw(conv_dim, scale=0.3) if bias else None,
           "dt_bias": draw(H, shift=-3.0)}
    out = {n: None if t is None else t.requires_grad_(requires_grad) for n, t in out.items()}
    return {**out, "d_inner": d_inner, "d_state": d_state}
