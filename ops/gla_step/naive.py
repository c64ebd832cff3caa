"""One decode step of GLA in PyTorch (the oracle of the `fused` single-step kernel):

    S ← diag(exp(gk)) S + k vᵀ,      o = (scale · q) S,      S ∈ R^{K×V} per (batch, head)

The state is updated in place, so a decode loop holds one fp32 [B, H, K, V] tensor per layer whatever the length
of the text; `gla_recurrent` (ops/gla/naive.py) is this step applied T times.
"""
from __future__ import annotations

import torch


def gla_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, state: torch.Tensor,
             scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row. q, k, gk: [B, H, K] (gk ≤ 0, or [B, H, 1] for a scalar decay); v: [B, H, V];
    state: [B, H, K, V] fp32 (fp64 for fp64 inputs), updated in place. scale defaults to K^{-1/2}.
    Returns o [B, H, V] in v's dtype and the state."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    acc = state.dtype
    q, k, v, gk = (x.to(acc) for x in (q, k, v, gk))
    state.mul_(gk.exp().unsqueeze(-1)).add_(k.unsqueeze(-1) * v.unsqueeze(-2))             # [B, H, K, V]
    o = torch.einsum("bhk,bhkv->bhv", q * scale, state)                                  # [B, H, V]
    return o.to(v.dtype), state


def make_inputs(shape: dict, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, decay: str = "model") -> dict:
    """The keyword arguments of `gla_step` at shape {B, H, K, V}: one token of ops.gla.naive.make_inputs (its decay
    regimes, `decay`) with a random fp32 state [B, H, K, V] (fp64 for fp64 inputs)."""
    from ops.gla.naive import make_inputs as gla_inputs

    kw = gla_inputs({**shape, "T": 1}, dtype, device, seed, requires_grad=False, decay=decay, initial_state=True)
    return {"q": kw["q"][:, 0], "k": kw["k"][:, 0], "v": kw["v"][:, 0], "gk": kw["gk"][:, 0],
            "state": kw["initial_state"]}
