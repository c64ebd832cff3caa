"""One decode step of the gated delta rule in PyTorch (the oracle of the `fused` single-step kernel):

    S ← α (I − β k kᵀ) S + β k vᵀ,   α = exp(g),      o = Sᵀ (scale · q),      S ∈ R^{K×V} per (batch, head)

computed as S ← α S; u = Sᵀ k; S ← S + β k (v − u)ᵀ (the same order as ops/gated_delta/naive.py's recurrence,
which is this step applied T times). k is L2-normalised per head by the layer. The state is updated in place.
"""
from __future__ import annotations

import torch


def gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row. q, k: [B, H, K]; v: [B, H, V]; g (log-decay ≤ 0), beta: [B, H]; state: [B, H, K, V] fp32
    (fp64 for fp64 inputs), updated in place. scale defaults to K^{-1/2}. Returns o [B, H, V] in v's dtype and
    the state."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    acc = state.dtype
    q, k, v, g, beta = (x.to(acc) for x in (q, k, v, g, beta))
    state.mul_(g.exp()[..., None, None])                                                  # α S
    u = torch.einsum("bhk,bhkv->bhv", k, state)                                           # Sᵀ k  [B, H, V]
    state.add_(k.unsqueeze(-1) * (beta.unsqueeze(-1) * (v - u)).unsqueeze(-2))            # + β k (v − u)ᵀ
    o = torch.einsum("bhk,bhkv->bhv", q * scale, state)                                   # [B, H, V]
    return o.to(v.dtype), state


def make_inputs(shape: dict, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, decay: str = "model", beta: str = "model") -> dict:
    """The keyword arguments of `gated_delta_step` at shape {B, H, K, V}: one token of
    ops.gated_delta.naive.make_inputs (its gate and β regimes) with a random fp32 state [B, H, K, V]."""
    from ops.gated_delta.naive import make_inputs as gd_inputs

    kw = gd_inputs({**shape, "T": 1}, dtype, device, seed, requires_grad=False, decay=decay, beta=beta,
                   initial_state=True)
    return {**{n: kw[n][:, 0] for n in ("q", "k", "v", "g", "beta")}, "state": kw["initial_state"]}
