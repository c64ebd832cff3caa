"""The input side of GLA's projection chain, in PyTorch: the oracle for the fused `proj` component and
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


def make_inputs(shape: dict, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, requires_grad: bool = True, bias_scale: float = 1.0,
                normalizer: float = 16.0) -> dict:
    """The keyword arguments of `proj_in` at shape {B, T, d, H, K, V, L}, shared by the tests and the benchmark:
    x [B, T, d] and the seven parameters in nn.Linear's layouts, in dtype (fp32: the model's x and parameters
    under autocast), scaled so that z = low W_upᵀ + b is O(1) (bias_scale stretches it into logsigmoid's
    saturated tails); n_heads and normalizer. Drawn on `device` from `seed`, or from a fresh seed when None;
    every tensor is a leaf, requiring grad if asked."""
    B, T, d, H, K, V, L = (shape[n] for n in ("B", "T", "d", "H", "K", "V", "L"))
    g = torch.Generator(device=device).manual_seed(torch.seed() % 2**31 if seed is None else seed)

    def draw(*size, scale=1.0):
        return (torch.randn(size, generator=g, device=device, dtype=torch.float64 if dtype == torch.float64 else
                            torch.float32) * scale).to(dtype).requires_grad_(requires_grad)
    out = {"x": draw(B, T, d)}
    out |= {n: draw(rows, d, scale=d ** -0.5) for n, rows in (("w_q", H * K), ("w_k", H * K), ("w_v", H * V),
                                                             ("w_r", H * V), ("w_down", L))}
    out |= {"w_up": draw(H * K, L, scale=L ** -0.5), "b_up": draw(H * K, scale=bias_scale)}
    return {**out, "n_heads": H, "normalizer": normalizer}
