"""GLA oracles in PyTorch: the token-by-token recurrence and the materialised chunkwise form.

    S_t = diag(exp(gk_t)) S_{t-1} + k_tᵀ v_t,      o_t = (scale · q_t) S_t,      S ∈ R^{K×V}

`gla_recurrent` is the ground truth the tests compare against; `gla` (the `naive` backend) is the
chunkwise form that training runs. Both accept a per-key-dim decay gk [B, T, H, K] or a scalar
decay per head gk [B, T, H, 1] (Mamba-2 SSD is scalar-decay GLA).

Numerics: within a chunk, b = cumsum(gk) is non-increasing, so the classic factorisation
q·exp(b) and k·exp(−b) overflows for strong decays (exp(+320) at gk = −5, C = 64). Every
exponent below is instead a difference b_i − b_j with i ≥ j, i.e. ≤ 0, so nothing overflows for
any gk ≤ 0, however negative. b is accumulated in fp64 and differenced before the cast: with
mixed decays (−1e-4 next to −50) b reaches −1600, and an fp32 difference of two such numbers
that should be ~0 would carry ~1e-4 absolute error straight into exp().
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ops import backend_fn, varlen

CHUNK_SIZE = 64
CHUNK_SIZES = (16, 32, 64, 128, 256)    # multiples of SUB_CHUNK: the sizes the Triton backends run
SUB_CHUNK = 16


def gla_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor,
                  scale: float | None = None, initial_state: torch.Tensor | None = None,
                  output_final_state: bool = False,
                  cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step-by-step recurrence. q, k, gk: [B, T, H, K] (gk may be [B, T, H, 1]); v: [B, T, H, V];
    initial_state: [B, H, K, V]. Returns o [B, T, H, V] in v's dtype and the final state (fp32).
    With cu_seqlens (ops/varlen.py: B = 1, N documents) S restarts at each document's first token from zero or
    initial_state[n] ([N, H, K, V]), and the final state is [N, H, K, V], each document's last S."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, gk = (x.to(acc) for x in (q, k, v, gk))
    packed = cu_seqlens is not None
    starts, finals = varlen.document_starts(cu_seqlens, initial_state, B, T, "gla"), []
    S, o = varlen.start_state(initial_state, 0, packed, q, B, H, K, V), []        # [B, H, K, V]
    for t in range(T):
        if t in starts:                                                        # a document starts: S ← S_0
            if t:
                finals.append(S)
            S = varlen.start_state(initial_state, starts[t], packed, q, B, H, K, V)
        decay = gk[:, t].exp().unsqueeze(-1)                                   # [B, H, K|1, 1]
        S = decay * S + k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)          # [B, H, K, V]
        o.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))            # [B, H, V]
    S = torch.cat(finals + [S])                                                # [B or N, H, K, V]
    o = torch.stack(o, 1) if T else v.new_zeros(B, 0, H, V)                    # [B, T, H, V]
    return o.to(v.dtype), (S if output_final_state else None)


def _intra_chunk_scores(q: torch.Tensor, k: torch.Tensor, b: torch.Tensor, sub: int) -> torch.Tensor:
    """A[i, j] = Σ_d q_id k_jd exp(b_id − b_jd) for j ≤ i, else 0.

    q, k: [..., C, K]; b: [..., C, K|1] (fp64 cumulative log-decay within the chunk). Returns [..., C, C].
    """
    C, dt = q.shape[-2], q.dtype
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    if b.shape[-1] == 1:
        # scalar decay: the decay factors out of the dot product
        diff = (b - b.transpose(-1, -2)).masked_fill(~causal, float("-inf"))   # [..., C, C]
        return (q @ k.transpose(-1, -2)) * diff.to(dt).exp()
    # Per-key-dim decay: the decay cannot leave the dot product. Split the chunk into m sub-chunks
    # of `sub`; diagonal blocks use an explicit [sub, sub, K] tensor, off-diagonal blocks (I > J)
    # factorise around r_I, the first position of query block I:
    #   b_i − b_j = (b_i − b_{r_I}) + (b_{r_I} − b_j),  both terms ≤ 0 for i ≥ r_I > j.
    m = C // sub
    qs, ks, bs = (x.unflatten(-2, (m, sub)) for x in (q, k, b))                 # [..., m, sub, K]
    tril = causal[:sub, :sub]
    diff = bs.unsqueeze(-2) - bs.unsqueeze(-3)                                  # [..., m, sub, sub, K]
    diff = diff.masked_fill(~tril[..., None], float("-inf"))
    A_diag = (qs.unsqueeze(-2) * ks.unsqueeze(-3) * diff.to(dt).exp()).sum(-1)  # [..., m, sub, sub]
    b_ref = bs[..., :1, :]                                                      # [..., m, 1, K]
    q_ref = qs * (bs - b_ref).to(dt).exp()                                      # [..., m(I), sub, K]
    lower = torch.ones(m, m, dtype=torch.bool, device=q.device).tril(-1)        # I > J
    k_exp = b_ref.unsqueeze(-3) - bs.unsqueeze(-4)                              # [..., m(I), m(J), sub, K]
    k_exp = k_exp.masked_fill(~lower[:, :, None, None], float("-inf"))
    k_ref = ks.unsqueeze(-4) * k_exp.to(dt).exp()                               # [..., m(I), m(J), sub, K]
    A_off = q_ref.unsqueeze(-3) @ k_ref.transpose(-1, -2)                       # [..., m(I), m(J), sub, sub]
    eye = torch.eye(m, dtype=dt, device=q.device)[:, :, None, None]             # [m, m, 1, 1]
    A = A_off + A_diag.unsqueeze(-3) * eye                                      # [..., m, m, sub, sub]
    return A.transpose(-3, -2).reshape(*A.shape[:-4], C, C)                     # [..., C, C]


def chunkwise_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor,
               scale: float | None, initial_state: torch.Tensor | None, output_final_state: bool,
               chunk_size: int = CHUNK_SIZE, sub_chunk: int = SUB_CHUNK, cu_seqlens: torch.Tensor | None = None):
    """The chunkwise form; with cu_seqlens the documents run in ops/varlen.py's chunk-aligned layout, the state
    pass restarting at each document's first chunk and the final state [N, H, K, V] taken at its last."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    sub = min(sub_chunk, C)
    if C % sub:
        raise ValueError(f"chunk_size {C} must be a multiple of sub_chunk {sub}")
    scale = K ** -0.5 if scale is None else scale
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    starts, ends, dest = {0: 0}, {}, None
    if cu_seqlens is not None:
        cu = varlen.offsets(cu_seqlens, B, T, "gla")
        varlen.initial_for(initial_state, len(cu) - 1, "gla")
        dest, P, starts, ends = varlen.chunk_layout(cu, C, q.device)
        q, k, v, gk = (varlen.to_chunks(x.to(acc), dest, P) for x in (q, k, v, gk))     # [1, P, H, D]
        T_out, T = T, P
    pad = -T % C
    # Padding with k = v = 0 and gk = 0 (no decay) leaves outputs and the final state unchanged.
    q, k, v, gk = (F.pad(x.to(acc), (0, 0, 0, 0, 0, pad)) for x in (q, k, v, gk))
    N = (T + pad) // C
    q, k, v, gk = (x.view(B, N, C, H, -1).permute(0, 3, 1, 2, 4) for x in (q, k, v, gk))  # [B, H, N, C, D]
    q = q * scale
    b = gk.to(torch.float64).cumsum(-2)                                # [B, H, N, C, K|1]
    b_last = b[..., -1:, :]                                            # [B, H, N, 1, K|1]
    o = _intra_chunk_scores(q, k, b, sub) @ v                          # [B, H, N, C, V]
    q_in = q * b.to(acc).exp()                                         # decay from chunk start to i
    k_out = k * (b_last - b).to(acc).exp()                             # decay from j to chunk end
    b_last = b_last.to(acc)
    o_inter, finals = [], []
    # unbind once: indexing [:, :, n] in the loop would cost a full-size zero-fill per chunk in the backward
    for n, (q_n, b_n, k_n, v_n) in enumerate(zip(*(x.unbind(2) for x in (q_in, b_last, k_out, v)))):
        if n in starts:                                                # a document's first chunk: S ← S_0
            S = varlen.start_state(initial_state, starts[n], dest is not None, q, B, H, K, V)
        o_inter.append(q_n @ S)                                        # [B, H, C, V]
        S = b_n.exp().transpose(-1, -2) * S + k_n.transpose(-1, -2) @ v_n
        if n in ends:
            finals.append(S)
    if N == 0:
        S = varlen.start_state(initial_state, 0, False, q, B, H, K, V)
    o = o + torch.stack(o_inter, 2) if N else o                        # [B, H, N, C, V]
    o = o.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, V)[:, :T]        # [B, T, H, V]
    if dest is not None:
        return varlen.from_chunks(o, dest)[:, :T_out], torch.cat(finals)   # [1, L, H, V], [N, H, K, V]
    return o, S


@backend_fn(chunk_sizes=CHUNK_SIZES)
def gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor,
        scale: float | None = None, initial_state: torch.Tensor | None = None,
        output_final_state: bool = False, chunk_size: int = CHUNK_SIZE,
        cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise GLA (the `naive` backend), computed in fp32 (fp64 for fp64 inputs).

    q, k, gk: [B, T, H, K] (gk ≤ 0, or [B, T, H, 1] for a scalar decay); v: [B, T, H, V];
    initial_state: [B, H, K, V]. Returns o [B, T, H, V] in v's dtype and, if asked, the final
    state [B, H, K, V] in fp32. cu_seqlens: packed documents (ops/varlen.py: B = 1, states [N, H, K, V]).
    """
    with torch.autocast(q.device.type, enabled=False):  # the oracle stays fp32 inside bf16 training
        o, S = chunkwise_gla(q, k, v, gk, scale, initial_state, output_final_state, chunk_size,
                             cu_seqlens=cu_seqlens)
    return o.to(v.dtype), (S if output_final_state else None)


# Log-decay regimes of make_inputs: the model's gate, and the ranges the tests sweep (uniform in [lo, hi)).
DECAYS = {"model": "logsigmoid(N(0, 1)) / 16, the GLA layer's gate", "realistic": (-5.0, 0.0),
          "near0": (-1e-6, 0.0), "extreme": (-1e4, -1e2), "mixed": "per channel −1e-4 or −50, half each"}


def make_inputs(shape: dict, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                seed: int | None = 0, requires_grad: bool = True, decay: str = "model", scalar: bool = False,
                initial_state: bool = False) -> dict:
    """The keyword arguments of `gla` at shape {B, T, H, K, V}, shared by the tests and the benchmark:
    q, k [B, T, H, K] and v [B, T, H, V] in dtype; gk [B, T, H, K] (scalar: [B, T, H, 1]) and, with
    initial_state, initial_state [B, H, K, V], in fp32 (fp64 for fp64 inputs), as the model holds them.

    decay (DECAYS): 'model' the layer's gate logsigmoid(z)/16; 'realistic' uniform in [−5, 0); 'near0' in
    [−1e-6, 0) (no decay); 'extreme' in [−1e4, −1e2) (the state wiped each step); 'mixed' −1e-4 or −50 per
    channel (b reaches −1600 inside a chunk). Drawn on `device` from `seed`, or from a fresh seed when None;
    every tensor is a leaf, requiring grad if asked."""
    B, T, H, K, V = (shape[n] for n in "BTHKV")
    g = torch.Generator(device=device).manual_seed(torch.seed() % 2**31 if seed is None else seed)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    out = {n: torch.randn(B, T, H, D, generator=g, device=device, dtype=acc).to(dtype)
           for n, D in (("q", K), ("k", K), ("v", V))}
    size = (B, T, H, 1 if scalar else K)
    if decay == "model":
        gk = F.logsigmoid(torch.randn(size, generator=g, device=device, dtype=acc)) / 16
    elif decay == "mixed":
        gk = torch.where(torch.rand(size, generator=g, device=device) < 0.5, -1e-4, -50.0).to(acc)
    elif isinstance(DECAYS.get(decay), tuple):
        lo, hi = DECAYS[decay]
        gk = torch.rand(size, generator=g, device=device, dtype=acc) * (hi - lo) + lo
    else:
        raise ValueError(f"gla make_inputs: decay {decay!r}; one of {', '.join(DECAYS)}")
    out["gk"] = gk
    if initial_state:
        out["initial_state"] = torch.randn(B, H, K, V, generator=g, device=device, dtype=acc)
    return {n: t.requires_grad_(requires_grad) for n, t in out.items()}
