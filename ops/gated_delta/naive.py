"""Gated delta rule oracles in PyTorch: the step recurrence and the chunkwise WY / UT form.

    S_t = α_t (I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ,    o_t = S_tᵀ (scale · q_t),    α_t = exp(g_t)

Chunkwise derivation (one chunk, incoming state S_0, b = cumsum(g) within the chunk, γ = exp(b)).
Writing S_t = α_t S_{t-1} + k_t u_tᵀ with u_t = β_t (v_t − α_t S_{t-1}ᵀ k_t) and unrolling,
    u_t = β_t v_t − β_t γ_t S_0ᵀ k_t − β_t Σ_{i<t} exp(b_t − b_i) (k_tᵀ k_i) u_i,
i.e. (I + L) U = diag(β) V − diag(β) (γ ⊙ K) S_0 with L strictly lower triangular,
L_ti = β_t exp(b_t − b_i) k_tᵀ k_i. With the UT transform T = (I + L)⁻¹:
    W = T diag(β) (γ ⊙ K),   U_0 = T diag(β) V,   U = U_0 − W S_0
    O = (γ ⊙ Q) S_0 + (Q Kᵀ ⊙ exp(b_i − b_j) ⊙ [j ≤ i]) U
    S_C = γ_C S_0 + (exp(b_C − b) ⊙ K)ᵀ U
Every exponent is b_i − b_j with i ≥ j (≤ 0), b accumulated in fp64, as in ops/gla/naive.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64


def gated_delta_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, scale: float | None = None,
                          initial_state: torch.Tensor | None = None,
                          output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step-by-step recurrence. q, k: [B, T, H, K]; v: [B, T, H, V]; g (log-decay ≤ 0), beta: [B, T, H];
    initial_state: [B, H, K, V]. Returns o [B, T, H, V] in v's dtype and the final state."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, g, beta = (x.to(acc) for x in (q, k, v, g, beta))
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(acc)     # [B, H, K, V]
    o = []
    for t in range(T):
        kt, bt = k[:, t], beta[:, t, :, None, None]                                   # [B, H, K], [B, H, 1, 1]
        S = g[:, t, :, None, None].exp() * S                                           # α_t S_{t-1}
        S = S - bt * kt.unsqueeze(-1) * torch.einsum("bhk,bhkv->bhv", kt, S).unsqueeze(-2)  # (I − β k kᵀ) ·
        S = S + bt * kt.unsqueeze(-1) * v[:, t].unsqueeze(-2)                          # + β k vᵀ
        o.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))                   # [B, H, V]
    o = torch.stack(o, 1) if T else v.new_zeros(B, 0, H, V)
    return o.to(v.dtype), (S if output_final_state else None)


def chunkwise_gated_delta(q, k, v, g, beta, scale, initial_state, chunk_size: int = CHUNK_SIZE):
    B, T, H, K = q.shape
    V, C = v.shape[-1], chunk_size
    scale = K ** -0.5 if scale is None else scale
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    pad = -T % C
    # Padding with k = v = 0, β = 0 and g = 0 leaves outputs and the final state unchanged.
    q, k, v = (F.pad(x.to(acc), (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x.to(acc), (0, 0, 0, pad)) for x in (g, beta))
    N = (T + pad) // C
    q, k, v = (x.view(B, N, C, H, -1).permute(0, 3, 1, 2, 4) for x in (q, k, v))    # [B, H, N, C, D]
    g, beta = (x.view(B, N, C, H).permute(0, 3, 1, 2) for x in (g, beta))          # [B, H, N, C]
    q = q * scale
    b = g.to(torch.float64).cumsum(-1)                                            # [B, H, N, C]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = (b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill(~causal, float("-inf")).to(acc).exp()  # [B, H, N, C, C]
    L = (beta.unsqueeze(-1) * (k @ k.transpose(-1, -2)) * decay).tril(-1)          # [B, H, N, C, C]
    eye = torch.eye(C, dtype=acc, device=q.device)
    Tinv = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
    W = Tinv @ (beta.unsqueeze(-1) * b.to(acc).exp().unsqueeze(-1) * k)             # [B, H, N, C, K]
    U0 = Tinv @ (beta.unsqueeze(-1) * v)                                           # [B, H, N, C, V]
    A = (q @ k.transpose(-1, -2)) * decay                                          # [B, H, N, C, C]
    q_in = q * b.to(acc).exp().unsqueeze(-1)                                       # decay from chunk start to i
    k_out = k * (b[..., -1:] - b).to(acc).exp().unsqueeze(-1)                      # decay from j to chunk end
    gamma_C = b[..., -1].to(acc).exp()                                             # [B, H, N]
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(acc)
    o = []
    for n in range(N):
        U = U0[:, :, n] - W[:, :, n] @ S                                           # [B, H, C, V]
        o.append(q_in[:, :, n] @ S + A[:, :, n] @ U)                               # [B, H, C, V]
        S = gamma_C[:, :, n, None, None] * S + k_out[:, :, n].transpose(-1, -2) @ U
    o = torch.stack(o, 2).permute(0, 2, 3, 1, 4).reshape(B, N * C, H, V)[:, :T]    # [B, T, H, V]
    return o, S


def gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                scale: float | None = None, initial_state: torch.Tensor | None = None,
                output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise gated delta rule (the `naive` backend), in fp32 (fp64 for fp64 inputs).

    q, k: [B, T, H, K] (k L2-normalised per head for a contractive update); v: [B, T, H, V];
    g: [B, T, H] log-decay ≤ 0; beta: [B, T, H] in [0, 1]; initial_state: [B, H, K, V].
    Returns o [B, T, H, V] in v's dtype and, if asked, the final state [B, H, K, V] in fp32.
    """
    with torch.autocast(q.device.type, enabled=False):
        o, S = chunkwise_gated_delta(q, k, v, g, beta, scale, initial_state)
    return o.to(v.dtype), (S if output_final_state else None)
