"""Mamba-2 SSD oracles in PyTorch: the step recurrence and the chunkwise form.

    h_t = exp(dt_t A) h_{t-1} + dt_t B_tᵀ x_t,    y_t = C_t h_t,    h ∈ R^{N×P}

SSD is scalar-decay GLA with q = C, k = B, v = dt·x, log-decay dt·A and scale 1, so the chunkwise
form *is* ops/gla/naive.py's (which takes a decay of shape [B, T, H, 1]); only the recurrence is
written out here, independently, as the test oracle. The D skip connection and the gate live in
the model (model/mamba2.py), not in the op.
"""
from __future__ import annotations

import torch

from ops import backend_fn, varlen
from ops.gla.naive import CHUNK_SIZE, CHUNK_SIZES, chunkwise_gla


def expand_groups(t: torch.Tensor, H: int) -> torch.Tensor:
    """[B, T, G, N] → [B, T, H, N]: head h uses group h // (H / G)."""
    G = t.shape[2]
    if H % G:
        raise ValueError(f"ssd: {H} heads are not divisible into {G} groups")
    return t.repeat_interleave(H // G, dim=2)


def ssd_recurrent(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  initial_state: torch.Tensor | None = None,
                  output_final_state: bool = False,
                  cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x: [B, T, H, P]; dt: [B, T, H] (> 0, after softplus); A: (H,) (< 0); B, C: [B, T, G, N];
    initial_state: [B, H, N, P]. Returns y [B, T, H, P] in x's dtype and the final state.
    With cu_seqlens (ops/varlen.py: B = 1, N documents) h restarts at each document's first token from zero or
    initial_state[n] ([N, H, N, P]); the final state is [N, H, N, P], each document's last h."""
    Bsz, T, H, P = x.shape
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    x, dt, A = x.to(acc), dt.to(acc), A.to(acc)
    Bm, Cm = (expand_groups(t, H).to(acc) for t in (B, C))                         # [B, T, H, N]
    packed, N = cu_seqlens is not None, Bm.shape[-1]
    starts, finals = varlen.document_starts(cu_seqlens, initial_state, Bsz, T, "ssd"), []
    h, y = varlen.start_state(initial_state, 0, packed, x, Bsz, H, N, P), []     # [B, H, N, P]
    for t in range(T):
        if t in starts:                                                               # a document starts
            if t:
                finals.append(h)
            h = varlen.start_state(initial_state, starts[t], packed, x, Bsz, H, N, P)
        a = (dt[:, t] * A).exp()[..., None, None]                                     # [B, H, 1, 1]
        h = a * h + (dt[:, t, :, None, None] * Bm[:, t].unsqueeze(-1)) * x[:, t].unsqueeze(-2)  # [B, H, N, P]
        y.append(torch.einsum("bhn,bhnp->bhp", Cm[:, t], h))
    h = torch.cat(finals + [h])                                                       # [B or N, H, N, P]
    y = torch.stack(y, 1) if T else x.new_zeros(Bsz, 0, H, P)
    return y.to(x.dtype), (h if output_final_state else None)


@backend_fn(chunk_sizes=CHUNK_SIZES)
def ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
        initial_state: torch.Tensor | None = None, output_final_state: bool = False,
        chunk_size: int = CHUNK_SIZE, cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise SSD (the `naive` backend), through GLA's chunkwise form; shapes as ssd_recurrent.
    Returns y [B, T, H, P] in x's dtype and, if asked, the final state [B, H, N, P] in fp32.
    cu_seqlens: packed documents (ops/varlen.py: B = 1, states [N, H, N, P])."""
    H = x.shape[2]
    with torch.autocast(x.device.type, enabled=False):
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        v = x.to(acc) * dt.to(acc).unsqueeze(-1)                                       # [B, T, H, P]
        gk = (dt.to(acc) * A.to(acc)).unsqueeze(-1)                                    # [B, T, H, 1]
        y, h = chunkwise_gla(expand_groups(C, H), expand_groups(B, H), v, gk, 1.0, initial_state, True, chunk_size,
                             cu_seqlens=cu_seqlens)
    return y.to(x.dtype), (h if output_final_state else None)


# dt regimes of make_inputs (the decay per step is dt·A with A in [−16, −1]): the model's, and uniform ranges
DT = {"model": "softplus(N(0, 1) − 3), the Mamba-2 layer's", "realistic": (1e-3, 0.1), "large": (1.0, 20.0)}


def make_inputs(shape: dict, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, requires_grad: bool = True, decay: str = "model",
                initial_state: bool = False) -> dict:
    """The keyword arguments of `ssd` at shape {B, T, H, P, G, N}, shared by the tests and the benchmark:
    x [B, T, H, P] and B, C [B, T, G, N] in dtype; dt [B, T, H], A (H,) = −(U[0, 1)·15 + 1) and, with
    initial_state, initial_state [B, H, N, P] in fp32 (fp64 for fp64 inputs).

    decay (DT) sets dt and so the log-decay dt·A: 'model' softplus(z − 3); 'realistic' dt uniform in
    [1e-3, 0.1) (dt·A from −1.6 to −1e-3); 'large' in [1, 20) (down to −320 a step). Drawn on `device` from
    `seed`, or from a fresh seed when None; every tensor is a leaf, requiring grad if asked."""
    B, T, H, P, G, N = (shape[n] for n in ("B", "T", "H", "P", "G", "N"))
    g = torch.Generator(device=device).manual_seed(torch.seed() % 2**31 if seed is None else seed)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    x = torch.randn(B, T, H, P, generator=g, device=device, dtype=acc).to(dtype)
    if decay == "model":
        dt = torch.nn.functional.softplus(torch.randn(B, T, H, generator=g, device=device, dtype=acc) - 3)
    elif isinstance(DT.get(decay), tuple):
        lo, hi = DT[decay]
        dt = torch.rand(B, T, H, generator=g, device=device, dtype=acc) * (hi - lo) + lo
    else:
        raise ValueError(f"ssd make_inputs: decay {decay!r}; one of {', '.join(DT)}")
    A = -torch.rand(H, generator=g, device=device, dtype=acc) * 15 - 1           # −exp(A_log), A_log ∈ log[1, 16]
    Bm, Cm = (torch.randn(B, T, G, N, generator=g, device=device, dtype=acc).to(dtype) for _ in range(2))
    out = {"x": x, "dt": dt, "A": A, "B": Bm, "C": Cm}
    if initial_state:
        out["initial_state"] = torch.randn(B, H, N, P, generator=g, device=device, dtype=acc)
    return {n: t.requires_grad_(requires_grad) for n, t in out.items()}
