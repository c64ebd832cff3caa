"""The output side of a token mixer's projection chain, in PyTorch: the oracle for the fused `proj`
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
    norm_weight: (V,); w_o: [d, H·V] (nn.Linear's layout); residual: [B, T, d] or None.
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


def make_inputs(shape: dict, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, requires_grad: bool = True, residual: bool = True, gate_first: bool = False,
                eps: float = 1e-6) -> dict:
    """The keyword arguments of `proj_out` at shape {B, T, H, V, d}, shared by the tests and the benchmark:
    o [B, T, H, V] (the mixer's output) and r [B, T, H·V] (the gate before its SiLU) in dtype, as the mixer
    hands them over; norm_weight (V,) = 1 + 0.3·N(0, 1) (not all ones: its gradient matters), w_o [d, H·V] and,
    with residual, residual [B, T, d] in fp32 (fp64 for fp64 inputs), as the model holds them; eps and
    gate_first. Drawn on `device` from `seed`, or from a fresh seed when None; every tensor is a leaf,
    requiring grad if asked."""
    B, T, H, V, d = (shape[n] for n in ("B", "T", "H", "V", "d"))
    g = torch.Generator(device=device).manual_seed(torch.seed() % 2**31 if seed is None else seed)
    acc = torch.float64 if dtype == torch.float64 else torch.float32

    def draw(*size, scale=1.0, shift=0.0, to=acc):
        return (torch.randn(size, generator=g, device=device, dtype=acc) * scale + shift).to(to)
    out = {"o": draw(B, T, H, V, to=dtype), "r": draw(B, T, H * V, to=dtype),
           "norm_weight": draw(V, scale=0.3, shift=1.0), "w_o": draw(d, H * V, scale=(H * V) ** -0.5),
           "residual": draw(B, T, d) if residual else None}
    out = {n: None if t is None else t.requires_grad_(requires_grad) for n, t in out.items()}
    return {**out, "eps": eps, "gate_first": gate_first}
