"""The input side of Gated DeltaNet's projection chain, in PyTorch: the oracle for the fused `proj` component
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
                n_heads: int, cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """x: [B, T, d] (the block's normed input); w_q, w_k: [H·K, d]; w_v, w_r: [H·V, d]; w_b, w_a: [H, d]
    (nn.Linear's layouts); conv_q, conv_k: [H·K, 1, W] and conv_v: [H·V, 1, W] (nn.Conv1d's); A_log, dt_bias: (H,).
    Returns q, k [B, T, H, K] and v [B, T, H, V] (one dtype: v's), g, β [B, T, H] fp32 and r [B, T, H·V].
    cu_seqlens: packed documents (B = 1): the short convolutions restart at each document (ops/varlen.py)."""
    B, T, _ = x.shape
    H = n_heads
    # ShortConv, then F.normalize per head (eps 1e-6), as the layer ran them
    q = short_conv_ref(F.linear(x, w_q), conv_q, head_dim=w_q.shape[0] // H, cu_seqlens=cu_seqlens).view(B, T, H, -1)
    k = short_conv_ref(F.linear(x, w_k), conv_k, head_dim=w_k.shape[0] // H, cu_seqlens=cu_seqlens).view(B, T, H, -1)
    v = short_conv_ref(F.linear(x, w_v), conv_v, cu_seqlens=cu_seqlens).view(B, T, H, -1)
    # CUDA autocast runs F.normalize in fp32; the mixer ops take q, k, v in one dtype
    q, k = q.to(v.dtype), k.to(v.dtype)
    beta = F.linear(x, w_b).float().sigmoid()                                          # [B, T, H]
    g = -A_log.float().exp() * F.softplus(F.linear(x, w_a).float() + dt_bias)          # [B, T, H]
    return q, k, v, g, beta, F.linear(x, w_r)


def make_inputs(shape: dict, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, requires_grad: bool = True) -> dict:
    """The keyword arguments of `gdn_proj_in` at shape {B, T, d, H, K, V, W}, shared by the tests and the
    benchmark: x [B, T, d] and the parameters in nn.Linear's and nn.Conv1d's layouts, in dtype (fp32: the model's
    x and parameters under autocast), scaled so that activations are O(1); A_log uniform in [0, 2.8) and
    dt_bias = N(0, 1) − 3, as model.common.init_ssm_decay_ draws them, stretched a little; n_heads. Drawn on
    `device` from `seed`, or from a fresh seed when None; every tensor is a leaf, requiring grad if asked."""
    B, T, d, H, K, V, W = (shape[n] for n in ("B", "T", "d", "H", "K", "V", "W"))
    g = torch.Generator(device=device).manual_seed(torch.seed() % 2**31 if seed is None else seed)
    acc = torch.float64 if dtype == torch.float64 else torch.float32

    def draw(*size, scale=1.0, shift=0.0):
        return torch.randn(size, generator=g, device=device, dtype=acc) * scale + shift
    out = {"x": draw(B, T, d)}
    out |= {n: draw(rows, d, scale=d ** -0.5) for n, rows in (("w_q", H * K), ("w_k", H * K), ("w_v", H * V),
                                                             ("w_r", H * V), ("w_b", H), ("w_a", H))}
    out |= {n: draw(c, 1, W, scale=W ** -0.5) for n, c in (("conv_q", H * K), ("conv_k", H * K), ("conv_v", H * V))}
    out["A_log"] = torch.empty(H, device=device, dtype=acc).uniform_(0, 2.8, generator=g)
    out["dt_bias"] = draw(H, shift=-3.0)
    return {**{n: t.to(dtype).requires_grad_(requires_grad) for n, t in out.items()}, "n_heads": H}
