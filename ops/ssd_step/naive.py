"""One decode step of Mamba-2's SSD in PyTorch (the oracle of the `fused` single-step kernel):

    h ← exp(dt·A) h + dt · B xᵀ,      y = C h,      h ∈ R^{N×P} per (batch, head)

B and C of head h are those of its group h // (H / G). The D skip and the gate are the model's. The state is
updated in place; `ssd_recurrent` (ops/ssd/naive.py) is this step applied T times.
"""
from __future__ import annotations

import torch

from ops.ssd.naive import expand_groups


def ssd_step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row. x: [B, H, P]; dt: [B, H] (> 0, after softplus); A: (H,) (< 0); B, C: [B, G, N];
    state: [B, H, N, P] fp32 (fp64 for fp64 inputs), updated in place. Returns y [B, H, P] in x's dtype and the
    state."""
    H = x.shape[1]
    acc = state.dtype
    xf, dt, A = x.to(acc), dt.to(acc), A.to(acc)
    Bm, Cm = (expand_groups(t.unsqueeze(1), H)[:, 0].to(acc) for t in (B, C))           # [B, H, N]
    state.mul_((dt * A).exp()[..., None, None]).add_((dt[..., None] * Bm).unsqueeze(-1) * xf.unsqueeze(-2))
    y = torch.einsum("bhn,bhnp->bhp", Cm, state)                                          # [B, H, P]
    return y.to(x.dtype), state


def make_inputs(shape: dict, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, decay: str = "model") -> dict:
    """The keyword arguments of `ssd_step` at shape {B, H, P, G, N}: one token of ops.ssd.naive.make_inputs (its dt
    regimes, `decay`) with a random fp32 state [B, H, N, P]."""
    from ops.ssd.naive import make_inputs as ssd_inputs

    kw = ssd_inputs({**shape, "T": 1}, dtype, device, seed, requires_grad=False, decay=decay, initial_state=True)
    return {"x": kw["x"][:, 0], "dt": kw["dt"][:, 0], "A": kw["A"], "B": kw["B"][:, 0], "C": kw["C"][:, 0],
            "state": kw["initial_state"]}
