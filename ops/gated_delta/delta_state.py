"""The delta rule's inter-chunk state recurrence, forward and backward, sequential over chunks.

With w, u from the WY stage (wy.py), b the chunk-local cumsum of the scalar log-decay, chunk n's
incoming state h_n and b_L the value of b at the chunk's last valid row:
    forward:   v_new = u − w h_n,    h_{n+1} = exp(b_L) h_n + (k ⊙ exp(b_L − b))ᵀ v_new
    backward:  dv_new = Aᵀ do + (k ⊙ exp(b_L − b)) dh_{n+1}
               dh_n   = exp(b_L) dh_{n+1} + scale · (q ⊙ exp(b))ᵀ do − wᵀ dv_new
A is the intra-chunk score matrix of the output stage (ops/chunkwise/intra.py). Unlike ops/chunkwise/state.py
the key dimension is not tiled: v_new needs the whole of w h_n, so one program holds a [K, BV] state (K ≤ 256)
and walks the chunks. Transposed operands (kᵀ, qᵀ, wᵀ, Aᵀ) are loaded transposed. The recurrence runs in fp32
registers. The forward stores h_n per chunk and v_new in the inputs' dtype; the backward stores dh_{n+1} per
chunk (the gradient of the state leaving chunk n, the layout ops/chunkwise/output.py expects) in the inputs'
dtype, as ops/chunkwise/state.py does, and dv_new in fp32 (the WY backward contracts it in fp32). state_dtype
stores h and dh in another dtype (fp32, for precision probes).
Initial and final states are fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.triton_utils import cdiv, load_rows, load_rows_t, next_power_of_2, row_offsets, store_rows
from ops.triton_utils import dot_precision, tile
from ops.gated_delta.wy import per_chunk, per_step
from ops.chunkwise.cumsum import residual_to_last
from ops.chunkwise.resets import reset_args, reset_bwd, reset_fwd, store_dh0, store_last
from ops.varlen import Documents

MAX_K = 256


@triton.jit
def delta_h_fwd_kernel(k, w, u, b, res, h, v_new, h0, ht, T, NT, H: tl.constexpr, K: tl.constexpr,
                       V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_H0: tl.constexpr,
                       STORE_HT: tl.constexpr, PREC: tl.constexpr, reset=None, HAS_RESET: tl.constexpr = False):
    """HAS_RESET (packed documents, B = 1; ops/chunkwise/resets.py): the state restarts at each document's first
    chunk from h0 [N, H, K, V] or zero, and ht [N, H, K, V] gets each document's final state. exp(b_L − b) adds
    r_L − r (res: b's residual, ops/chunkwise/cumsum.py), as the backward does."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_state = (i_bh * K + o_k[:, None]) * V + o_v[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0 and not HAS_RESET:
        b_h += tl.load(h0 + p_state, mask=m_kv, other=0.0).to(tl.float32)
    for i_t in range(NT):
        if HAS_RESET:
            b_h = reset_fwd(b_h, reset, h0, ht, i_t, i_h, o_k, o_v, m_kv, H, K, V, USE_H0, STORE_HT)
        tl.store(h + row_offsets(i_b, i_h, i_t, NT, H, K * V) + (o_k[:, None] * V + o_v[None, :]),
                 b_h.to(h.dtype.element_ty), mask=m_kv)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        last = tl.minimum(i_t * BT + BT, T) - 1
        b_w = load_rows(w, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)
        b_vn = load_rows(u, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V).to(tl.float32)
        b_vn -= tl.dot(b_w, b_h.to(b_w.dtype), input_precision=PREC)
        store_rows(v_new, b_vn, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)
        b_b = tl.load(b + row_offsets(i_b, i_h, o_t, T, H, 1), mask=m_t, other=0.0)
        b_bl = tl.load(b + row_offsets(i_b, i_h, last, T, H, 1))
        c_d = residual_to_last(res, i_b, i_h, last, o_t, m_t, T, H)
        b_kt = load_rows_t(k, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)
        b_kt = b_kt * tl.exp(tl.where(m_t, (b_bl - b_b) + c_d, 0.0))[None, :]
        b_h *= tl.exp(b_bl)
        b_h += tl.dot(b_kt.to(b_w.dtype), b_vn.to(b_w.dtype), input_precision=PREC)
    if STORE_HT:
        if HAS_RESET:
            store_last(b_h, reset, ht, NT, i_h, o_k, o_v, m_kv, H, K, V)
        else:
            tl.store(ht + p_state, b_h, mask=m_kv)


@triton.jit
def delta_h_bwd_kernel(q, k, w, b, res, A, do, dh, dv_new, dht, dh0, scale, T, NT, H: tl.constexpr,
                       K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                       USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, PREC: tl.constexpr, reset=None,
                       HAS_RESET: tl.constexpr = False):
    """HAS_RESET (packed documents; ops/chunkwise/resets.py): dh restarts from dht[d] at document d's last chunk,
    and dh0 [N, H, K, V] gets each document's start gradient. exp(b_L − b) adds r_L − r (res: b's residual,
    ops/chunkwise/cumsum.py)."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_c = tl.arange(0, BT)
    p_state = (i_bh * K + o_k[:, None]) * V + o_v[None, :]
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT and not HAS_RESET:
        b_dh += tl.load(dht + p_state, mask=m_kv, other=0.0).to(tl.float32)
    for j in range(NT):
        i_t = NT - 1 - j
        if HAS_RESET:
            b_dh = reset_bwd(b_dh, reset, dht, i_t, i_h, o_k, o_v, m_kv, H, K, V, USE_DHT)
        tl.store(dh + row_offsets(i_b, i_h, i_t, NT, H, K * V) + (o_k[:, None] * V + o_v[None, :]),
                 b_dh.to(dh.dtype.element_ty), mask=m_kv)
        o_t = i_t * BT + o_c
        m_t = o_t < T
        last = tl.minimum(i_t * BT + BT, T) - 1
        b_do = load_rows(do, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)
        b_At = tl.load(A + row_offsets(i_b, i_h, o_t[None, :], T, H, BT) + o_c[:, None], mask=m_t[None, :], other=0.0)
        b_dv = tl.dot(b_At.to(b_do.dtype), b_do, input_precision=PREC)
        b_b = tl.load(b + row_offsets(i_b, i_h, o_t, T, H, 1), mask=m_t, other=0.0)
        b_bl = tl.load(b + row_offsets(i_b, i_h, last, T, H, 1))
        # r read in every chunk: a branch on the decay here would keep the loop from being software-pipelined
        c_d = residual_to_last(res, i_b, i_h, last, o_t, m_t, T, H)
        b_k = load_rows(k, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)
        b_kd = b_k * tl.exp(tl.where(m_t, (b_bl - b_b) + c_d, 0.0))[:, None]
        b_dv += tl.dot(b_kd.to(b_do.dtype), b_dh.to(b_do.dtype), input_precision=PREC)
        tl.store(dv_new + row_offsets(i_b, i_h, o_t[:, None], T, H, V) + o_v[None, :], b_dv,
                 mask=m_t[:, None] & m_v[None, :])
        b_qt = load_rows_t(q, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)
        b_qt = b_qt * (tl.exp(b_b) * scale)[None, :]
        b_wt = load_rows_t(w, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)
        b_dh *= tl.exp(b_bl)
        b_dh += tl.dot(b_qt.to(b_do.dtype), b_do, input_precision=PREC)
        b_dh -= tl.dot(b_wt.to(b_do.dtype), b_dv.to(b_do.dtype), input_precision=PREC)
        if HAS_RESET:
            if STORE_DH0:
                store_dh0(b_dh, reset, dh0, i_t, i_h, o_k, o_v, m_kv, H, K, V)
    if STORE_DH0 and not HAS_RESET:
        tl.store(dh0 + p_state, b_dh, mask=m_kv)


def state_tiles(K: int, V: int, BV: int | None) -> tuple[int, int]:
    """(BK, BV): all of K in one program, V in tiles."""
    if K > MAX_K:
        raise ValueError(f"the delta-rule state kernels hold all of K in one program: K ≤ {MAX_K}, got {K}")
    return max(16, next_power_of_2(K)), BV or tile(V)


def delta_h_fwd(k: torch.Tensor, w: torch.Tensor, u: torch.Tensor, b: torch.Tensor, res: torch.Tensor,
                h0: torch.Tensor | None, output_final_state: bool, chunk_size: int, BV: int | None = None,
                num_warps: int = 8, state_dtype: torch.dtype | None = None, docs: Documents | None = None):
    """k, w: [B, T, H, K]; u: [B, T, H, V]; b: [B, T, H, 1] fp32 and res its residual
    (ops/chunkwise/cumsum.chunk_residual). Returns h [B, NT, H, K, V] in state_dtype
    (default k's dtype; the state entering each chunk), v_new [B, T, H, V] (u's dtype) and the final state
    [B, H, K, V] fp32, or None. docs: packed documents in the chunk-aligned layout (h0 and the final state
    [N, H, K, V])."""
    B, T, H, K = k.shape
    V, NT = u.shape[-1], cdiv(T, chunk_size)
    BK, BV = state_tiles(K, V, BV)
    h = torch.empty(B, NT, H, K, V, dtype=state_dtype or k.dtype, device=k.device)
    v_new = torch.empty_like(u)
    ht = torch.empty(B if docs is None else docs.n, H, K, V, dtype=torch.float32, device=k.device) \
        if output_final_state else None
    delta_h_fwd_kernel[(cdiv(V, BV), B * H)](k, w, u, b, res, h, v_new, h0, ht, T, NT, H, K, V, chunk_size, BK, BV,
                                                     h0 is not None, output_final_state, dot_precision(u),
                                                     num_warps=num_warps, **reset_args(docs))
    return h, v_new, ht


def delta_h_bwd(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, b: torch.Tensor, res: torch.Tensor,
                A: torch.Tensor, do: torch.Tensor, dht: torch.Tensor | None, need_dh0: bool, scale: float,
                chunk_size: int, BV: int | None = None, num_warps: int = 8, num_stages: int | None = None,
                state_dtype: torch.dtype | None = None, docs: Documents | None = None):
    """res: b's residual (ops/chunkwise/cumsum.chunk_residual); A: [B, T, H, C] intra-chunk scores;
    do: [B, T, H, V]. Returns dh [B, NT, H, K, V] in state_dtype (default q's dtype; the gradient of the state
    leaving each chunk), dv_new [B, T, H, V] fp32 and dh0 (fp32) or None. docs: packed documents as delta_h_fwd's
    (dht and dh0 [N, H, K, V]). num_stages: None picks 3, or 1 where fp32 tiles would not fit in shared memory
    pipelined."""
    B, T, H, K = q.shape
    V, NT = do.shape[-1], cdiv(T, chunk_size)
    BK, BV = state_tiles(K, V, BV)
    dh = torch.empty(B, NT, H, K, V, dtype=state_dtype or q.dtype, device=q.device)
    dv_new = torch.empty(B, T, H, V, dtype=torch.float32, device=q.device)
    dh0 = torch.empty(B if docs is None else docs.n, H, K, V, dtype=torch.float32, device=q.device) \
        if need_dh0 else None
    if num_stages is None:   # fp32 at K = V = 128: pipelined, the loop asked for 312 KB of shared memory (H100: 227)
        num_stages = 1 if do.element_size() == 4 and BK * BV > 4096 else 3
    delta_h_bwd_kernel[(cdiv(V, BV), B * H)](q, k, w, b, res, A, do, dh, dv_new, dht, dh0, scale, T, NT, H, K, V,
                                                     chunk_size, BK, BV, dht is not None, need_dh0,
                                                     dot_precision(do), num_warps=num_warps, num_stages=num_stages,
                                                     **reset_args(docs))
    return dh, dv_new, dh0


def _decays(b: torch.Tensor, T: int, C: int):
    """From b [B, T, H, 1]: exp(b) and exp(b_L − b) per row ([B, NT, H, C, 1], 0 past T), exp(b_L)."""
    bc = per_chunk(b, C)                                                          # [B, NT, H, C, 1]
    valid = (torch.arange(bc.shape[1] * C, device=b.device) < T).view(1, -1, 1, C, 1)
    last = torch.clamp(torch.arange(C - 1, bc.shape[1] * C, C, device=b.device), max=T - 1)
    bl = b.double()[:, last].unsqueeze(-1)                                   # [B, NT, H, 1, 1]
    return (bc.exp() * valid, ((bl - bc) * valid).exp() * valid, bl.exp())


def delta_h_fwd_ref(k, w, u, b, h0, chunk_size: int):
    """h [B, NT, H, K, V], v_new [B, T, H, V], final state, in fp64, chunk by chunk."""
    B, T, H, K = k.shape
    kc, wc, uc = per_chunk(k, chunk_size), per_chunk(w, chunk_size), per_chunk(u, chunk_size)
    _, kdecay, gamma_L = _decays(b, T, chunk_size)
    S = k.new_zeros(B, H, K, u.shape[-1], dtype=torch.float64) if h0 is None else h0.double()
    hs, vs = [], []
    for n in range(kc.shape[1]):
        hs.append(S)
        vs.append(uc[:, n] - wc[:, n] @ S)                                     # [B, H, C, V]
        S = gamma_L[:, n] * S + (kc[:, n] * kdecay[:, n]).transpose(-1, -2) @ vs[-1]
    return torch.stack(hs, 1), per_step(torch.stack(vs, 1), T), S


def delta_h_bwd_ref(q, k, w, b, A, do, dht, scale: float, chunk_size: int):
    """dh [B, NT, H, K, V] (state leaving each chunk), dv_new [B, T, H, V], dh0, in fp64."""
    B, T, H, K = q.shape
    qc, kc, wc, doc = (per_chunk(x, chunk_size) for x in (q, k, w, do))
    Ac = per_chunk(A, chunk_size)                                                 # [B, NT, H, C, C]
    gamma, kdecay, gamma_L = _decays(b, T, chunk_size)
    dS = q.new_zeros(B, H, K, do.shape[-1], dtype=torch.float64) if dht is None else dht.double()
    dhs, dvs = [], []
    for n in reversed(range(qc.shape[1])):
        dhs.append(dS)
        dvs.append(Ac[:, n].transpose(-1, -2) @ doc[:, n] + (kc[:, n] * kdecay[:, n]) @ dS)
        dS = gamma_L[:, n] * dS + (scale * qc[:, n] * gamma[:, n]).transpose(-1, -2) @ doc[:, n] \
            - wc[:, n].transpose(-1, -2) @ dvs[-1]
    return torch.stack(dhs[::-1], 1), per_step(torch.stack(dvs[::-1], 1), T), dS
