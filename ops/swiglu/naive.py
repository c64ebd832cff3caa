"""The elementwise middle of the SwiGLU MLP, in PyTorch: the oracle for the fused `proj` component and what the
model runs when `proj` is not fused.

    gu = x W_gate_upᵀ = [g | u]          [..., 2F]: the gate first, then the up projection (one GEMM)
    h  = silu(g) ⊙ u = g·σ(g) ⊙ u        [..., F]:  what the down projection reads

This is model.common.SwiGLU's `gate, up = gate_up(x).chunk(2, -1); F.silu(gate) * up`, op for op, so that
under bf16 autocast it rounds where the model always rounded (silu(g) to bf16, then the product). Its gradient
(autograd's) is dg = dh ⊙ u ⊙ σ(g)(1 + g(1 − σ(g))), du = dh ⊙ silu(g).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu(gu: torch.Tensor) -> torch.Tensor:
    """gu: [..., 2F], the gate_up GEMM's output (gate first, then up) → silu(gate) ⊙ up, [..., F] in gu's dtype."""
    gate, up = gu.chunk(2, dim=-1)                                            # [..., F] each, views of gu
    return F.silu(gate) * up


def make_inputs(M: int, F: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, scale: float = 1.0, requires_grad: bool = True) -> torch.Tensor:
    """gu [M, 2F] = scale·N(0, 1) in dtype, drawn on `device` from `seed` (a fresh seed when None), a leaf
    requiring grad if asked: the argument of `swiglu` for the tests and benchmarks."""
    g = torch.Generator(device=device).manual_seed(torch.seed() % 2**31 if seed is None else seed)
    gu = torch.randn(M, 2 * F, generator=g, device=device) * scale
    return gu.to(dtype).requires_grad_(requires_grad)
