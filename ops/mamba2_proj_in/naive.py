"""The input side of Mamba-2's projection chain, in PyTorch: the oracle for issue [H]'s `proj` component and
what the layer runs when `proj` is not fused.

    z, xBC, dt = split(u W_inᵀ);   x, B, C = split(SiLU(conv4(xBC) + b));   dt = softplus(dt + dt_bias)  (fp32)

Exactly the layer's own lines before the op existed (model/mamba2.py), op for op.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ops.proj.short_conv import short_conv_ref


def mamba2_proj_in(u: torch.Tensor, w_in: torch.Tensor, conv_w: torch.Tensor, conv_b: torch.Tensor | None,
                   dt_bias: torch.Tensor, d_inner: int, d_state: int) -> tuple[torch.Tensor, ...]:
    """u: [B, T, d]; w_in: [2·d_inner + 2·d_state + H, d] (rows z | x | B | C | dt; d_state = G·N);
    conv_w: [d_inner + 2·d_state, 1, W]; conv_b: [d_inner + 2·d_state] or None; dt_bias: [H].
    Returns z [B, T, d_inner], x [B, T, d_inner], B, C [B, T, d_state] and dt [B, T, H] fp32."""
    H = dt_bias.shape[0]
    z, xBC, dt = F.linear(u, w_in).split([d_inner, d_inner + 2 * d_state, H], -1)
    x, Bm, Cm = short_conv_ref(xBC, conv_w, conv_b).split([d_inner, d_state, d_state], -1)
    return z, x, Bm, Cm, F.softplus(dt.float() + dt_bias)
