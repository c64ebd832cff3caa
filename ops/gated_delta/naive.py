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

from ops import backend_fn, varlen

CHUNK_SIZE = 64
CHUNK_SIZES = (16, 32, 64)      # the Triton backends' sizes (see ops/gated_delta/chunk.py); the oracle runs any


def gated_delta_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          beta: torch.Tensor, scale: float | None = None,
                          initial_state: torch.Tensor | None = None,
                          output_final_state: bool = False,
                          cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step-by-step recurrence. q, k: [B, T, H, K]; v: [B, T, H, V]; g (log-decay ≤ 0), beta: [B, T, H];
    initial_state: [B, H, K, V]. Returns o [B, T, H, V] in v's dtype and the final state.
    With cu_seqlens (ops/varlen.py: B = 1, N documents) S restarts at each document's first token from zero or
    initial_state[n] ([N, H, K, V]); the final state is [N, H, K, V], each document's last S."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, g, beta = (x.to(acc) for x in (q, k, v, g, beta))
    packed = cu_seqlens is not None
    starts, finals = varlen.document_starts(cu_seqlens, initial_state, B, T, "gated_delta"), []
    S, o = varlen.start_state(initial_state, 0, packed, q, B, H, K, V), []            # [B, H, K, V]
    for t in range(T):
        if t in starts:                                                               # a document starts
            if t:
                finals.append(S)
            S = varlen.start_state(initial_state, starts[t], packed, q, B, H, K, V)
        kt, bt = k[:, t], beta[:, t, :, None, None]                                   # [B, H, K], [B, H, 1, 1]
        S = g[:, t, :, None, None].exp() * S                                           # α_t S_{t-1}
        S = S - bt * kt.unsqueeze(-1) * torch.einsum("bhk,bhkv->bhv", kt, S).unsqueeze(-2)  # (I − β k kᵀ) ·
        S = S + bt * kt.unsqueeze(-1) * v[:, t].unsqueeze(-2)                          # + β k vᵀ
        o.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))                   # [B, H, V]
    S = torch.cat(finals + [S])                                                       # [B or N, H, K, V]
    o = torch.stack(o, 1) if T else v.new_zeros(B, 0, H, V)
    return o.to(v.dtype), (S if output_final_state else None)


def chunkwise_gated_delta(q, k, v, g, beta, scale, initial_state, chunk_size: int = CHUNK_SIZE,
                          cu_seqlens: torch.Tensor | None = None):
    """The chunkwise form; with cu_seqlens the documents run in ops/varlen.py's chunk-aligned layout, the state
    pass restarting at each document's first chunk and the final state [N, H, K, V] taken at its last."""
    B, T, H, K = q.shape
    V, C = v.shape[-1], chunk_size
    scale = K ** -0.5 if scale is None else scale
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    starts, ends, dest = {0: 0}, {}, None
    if cu_seqlens is not None:
        cu = varlen.offsets(cu_seqlens, B, T, "gated_delta")
        varlen.initial_for(initial_state, len(cu) - 1, "gated_delta")
        dest, P, starts, ends = varlen.chunk_layout(cu, C, q.device)
        q, k, v, g, beta = (varlen.to_chunks(x.to(acc), dest, P) for x in (q, k, v, g, beta))   # [1, P, ...]
        T_out, T = T, P
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
    o, finals = [], []
    # unbind once: indexing [:, :, n] in the loop would cost a full-size zero-fill per chunk in the backward
    for n, (U0_n, W_n, q_n, A_n, g_n, k_n) in enumerate(zip(*(x.unbind(2) for x in (U0, W, q_in, A, gamma_C,
                                                                                     k_out)))):
        if n in starts:                                                            # a document's first chunk
            S = varlen.start_state(initial_state, starts[n], dest is not None, q, B, H, K, V)
        U = U0_n - W_n @ S                                                         # [B, H, C, V]
        o.append(q_n @ S + A_n @ U)                                                # [B, H, C, V]
        S = g_n[..., None, None] * S + k_n.transpose(-1, -2) @ U
        if n in ends:
            finals.append(S)
    if N == 0:
        return v.new_zeros(B, 0, H, V), varlen.start_state(initial_state, 0, False, q, B, H, K, V)
    o = torch.stack(o, 2).permute(0, 2, 3, 1, 4).reshape(B, N * C, H, V)[:, :T]    # [B, T, H, V]
    if dest is not None:
        return varlen.from_chunks(o, dest)[:, :T_out], torch.cat(finals)           # [1, L, H, V], [N, H, K, V]
    return o, S


@backend_fn(chunk_sizes=CHUNK_SIZES)
def gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                scale: float | None = None, initial_state: torch.Tensor | None = None,
                output_final_state: bool = False, chunk_size: int = CHUNK_SIZE,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise gated delta rule (the `naive` backend), in fp32 (fp64 for fp64 inputs).

    q, k: [B, T, H, K] (k L2-normalised per head for a contractive update); v: [B, T, H, V];
    g: [B, T, H] log-decay ≤ 0; beta: [B, T, H] in [0, 1]; initial_state: [B, H, K, V].
    Returns o [B, T, H, V] in v's dtype and, if asked, the final state [B, H, K, V] in fp32.
    cu_seqlens: packed documents (ops/varlen.py: B = 1, states [N, H, K, V]).
    """
    with torch.autocast(q.device.type, enabled=False):
        o, S = chunkwise_gated_delta(q, k, v, g, beta, scale, initial_state, chunk_size, cu_seqlens)
    return o.to(v.dtype), (S if output_final_state else None)


# Gate (log-decay g) and β regimes of make_inputs: the model's, and uniform ranges [lo, hi) the tests sweep
GATES = {"model": "−A · softplus(N(0, 1) − 3), A ∈ [1, 16): the layer's gate", "realistic": (-5.0, 0.0),
         "near0": (-1e-6, 0.0), "extreme": (-1e3, -50.0)}
BETAS = {"model": "sigmoid(N(0, 1))", "mid": (0.0, 1.0), "near0": (0.0, 1e-4), "near1": (1 - 1e-4, 1.0)}


def make_inputs(shape: dict, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, requires_grad: bool = True, decay: str = "model", beta: str = "model",
                initial_state: bool = False) -> dict:
    """The keyword arguments of `gated_delta` at shape {B, T, H, K, V}, shared by the tests and the benchmark:
    q, k [B, T, H, K] (k L2-normalised per head, as the layer feeds it) and v [B, T, H, V] in dtype; g, beta
    [B, T, H] and, with initial_state, initial_state [B, H, K, V] in fp32 (fp64 for fp64 inputs).

    decay (GATES): 'model' the layer's −exp(A_log)·softplus(x W_a + dt_bias); 'realistic' uniform in [−5, 0);
    'near0' in [−1e-6, 0); 'extreme' in [−1e3, −50). beta (BETAS): 'model' sigmoid(z); 'mid' [0, 1); 'near0'
    [0, 1e-4); 'near1' [1 − 1e-4, 1). Drawn on `device` from `seed`, or from a fresh seed when None; every tensor
    is a leaf, requiring grad if asked."""
    B, T, H, K, V = (shape[n] for n in "BTHKV")
    gen = torch.Generator(device=device).manual_seed(torch.seed() % 2**31 if seed is None else seed)
    acc = torch.float64 if dtype == torch.float64 else torch.float32

    def draw(*size, uniform=None):
        if uniform is not None:
            return torch.rand(size, generator=gen, device=device, dtype=acc) * (uniform[1] - uniform[0]) + uniform[0]
        return torch.randn(size, generator=gen, device=device, dtype=acc)

    for name, regimes, value in (("decay", GATES, decay), ("beta", BETAS, beta)):
        if value not in regimes:
            raise ValueError(f"gated_delta make_inputs: {name} {value!r}; one of {', '.join(regimes)}")
    q = draw(B, T, H, K).to(dtype)
    k = F.normalize(draw(B, T, H, K), dim=-1).to(dtype)
    v = draw(B, T, H, V).to(dtype)
    if decay == "model":
        g = -(draw(H, uniform=(1.0, 16.0))) * F.softplus(draw(B, T, H) - 3)
    else:
        g = draw(B, T, H, uniform=GATES[decay])
    b = draw(B, T, H).sigmoid() if beta == "model" else draw(B, T, H, uniform=BETAS[beta])
    out = {"q": q, "k": k, "v": v, "g": g, "beta": b}
    if initial_state:
        out["initial_state"] = draw(B, H, K, V)
    return {n: t.requires_grad_(requires_grad) for n, t in out.items()}
