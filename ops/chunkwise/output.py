"""Output and its gradients, chunk by chunk, given the states (state.py) and A (intra.py).

    o    = scale · (q ⊙ exp(b)) h_n + A v
    dA   = do vᵀ on the causal chunk block
    dv   = Aᵀ do + (k ⊙ exp(b_L − b)) dh_{n+1}
    dq'  = dq_intra + scale · exp(b) ⊙ (do h_nᵀ)         (dq_intra, dk_intra: the pairs j < i, intra.py)
    dk'  = dk_intra + exp(b_L − b) ⊙ (v dh_{n+1}ᵀ)
    db_t = q_t ⊙ dq'_t − k_t ⊙ dk'_t, and at the chunk's last row L also        (dk_inter: dk's state term)
           exp(b_L) ⊙ Σ_v h_n ⊙ dh_{n+1} + Σ_{j<L} k_j ⊙ dk_inter_j, where dk'_L leaves out dk_inter_L
    dq   = dq' + scale · dA_tt k_t,   dk = dk' + scale · dA_tt q_t (+ dk_inter_L),   dA_tt = do_t · v_t
    dg   = reverse cumsum of db within the chunk (cumsum.py, a scan of its own: no total minus prefix)
With a scalar decay, db sums over the key dimension: each K tile writes a partial, summed after.

db is the sum, over the pairs (query t, key s) each term of the output holds, of that pair's share, with
the sign of how b_t − b_s moves: + for t, − for s, so that dg_u = Σ_{t≥u} db_t adds exactly the pairs s < u ≤ t.
A diagonal pair (s = t, the dA_tt term) has b_t − b_t = 0 and enters q ⊙ dq and k ⊙ dk equally; at strong
decay it is all either holds (the pairs s < t carry exp(b_t − b_s) ≤ e^g per step), so a db formed from the
full dq and dk would be two near-equal numbers subtracted, fp32's rounding of them left where the true db is
e^−50 smaller. It is therefore never in the dq', dk' db is formed from, and is added only to the dq, dk
returned. dA_tt is read off the diagonal of dA (chunk_bwd_dA keeps it). The last row's key and the state
leaving the chunk are such a pair too (exp(b_L − b_L) = 1; undecayed where dh_{n+1} is the final state's
gradient), entering the tail and −k_L ⊙ dk_L equally: it is left out of both.
Every pair left in db carries at least one step of decay.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.chunkwise.cumsum import RESIDUAL_FROM, key_residual_to_last, residual_launches, residual_to_last, weak_chunk
from ops.chunkwise.state import pad_chunks, chunk_last
from ops.triton_utils import cdiv, load_rows, load_rows_t, row_offsets, store_rows
from ops.triton_utils import dot_precision, sum_partials, tile


@triton.jit
def chunk_fwd_o_kernel(q, k, v, b, h, A, o, scale, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SCALAR: tl.constexpr,
                       INLINE_A: tl.constexpr, PREC: tl.constexpr, res=None, EXACT: tl.constexpr = False,
                       HG: tl.constexpr = 1):
    """INLINE_A (scalar decay only): form A = scale (q kᵀ) ⊙ exp(b_i − b_j) here instead of reading it,
    and store it for the backward from the first V tile's program; EXACT: the exponent adds r_i − r_j (res:
    b's residual, cumsum.py). HG: heads per q and k head (q, k [B, T, H / HG, K]; head h reads their h // HG)."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    b_v = load_rows(v, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    if SCALAR:
        b_b = tl.load(b + row_offsets(i_b, i_h, o_t, T, H, 1), mask=m_t, other=0.0)
    if INLINE_A:
        b_s = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = load_rows(q, i_b, i_h // HG, o_t, m_t, o_k, m_k, T, H // HG, K)
        if INLINE_A:
            b_s += tl.dot(b_q, load_rows_t(k, i_b, i_h // HG, o_t, m_t, o_k, m_k, T, H // HG, K),
                          input_precision=PREC)
        if SCALAR:
            b_qd = b_q * (tl.exp(b_b) * scale)[:, None]
        else:
            b_qd = b_q * tl.exp(load_rows(b, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)) * scale
        b_h = tl.load(h + row_offsets(i_b, i_h, i_t, NT, H, K * V) + o_k[:, None] * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_o += tl.dot(b_qd.to(b_v.dtype), b_h.to(b_v.dtype), input_precision=PREC)
    p_A = A + row_offsets(i_b, i_h, o_t[:, None], T, H, BT) + tl.arange(0, BT)[None, :]
    if INLINE_A:
        keep = (o_t[:, None] >= o_t[None, :]) & m_t[:, None] & m_t[None, :]
        b_e = b_b[:, None] - b_b[None, :]
        if EXACT:
            c_b = tl.load(res + row_offsets(i_b, i_h, o_t, T, H, 1), mask=m_t, other=0.0)
            b_e += c_b[:, None] - c_b[None, :]
        b_A = (b_s * tl.exp(tl.where(keep, b_e, float("-inf"))) * scale).to(A.dtype.element_ty)
        if i_v == 0:
            tl.store(p_A, b_A, mask=m_t[:, None])
    else:
        b_A = tl.load(p_A, mask=m_t[:, None], other=0.0)
    b_o += tl.dot(b_A.to(b_v.dtype), b_v, input_precision=PREC)
    store_rows(o, b_o, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)


@triton.jit
def chunk_bwd_dA_kernel(do, v, dA, T, H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                        PREC: tl.constexpr):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_do = load_rows(do, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)
        b_vt = load_rows_t(v, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)                  # [BV, BT]
        b_dA += tl.dot(b_do, b_vt, input_precision=PREC)
    keep = o_t[:, None] >= o_t[None, :]
    tl.store(dA + row_offsets(i_b, i_h, o_t[:, None], T, H, BT) + tl.arange(0, BT)[None, :],
             tl.where(keep, b_dA, 0.0), mask=m_t[:, None])


@triton.jit
def chunk_bwd_dv_kernel(k, b, A, do, dh, dv, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SCALAR: tl.constexpr,
                        PREC: tl.constexpr, HG: tl.constexpr = 1):
    """HG: heads per k head, as chunk_fwd_o_kernel's."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    last = tl.minimum(i_t * BT + BT, T) - 1
    b_do = load_rows(do, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)
    b_A = tl.load(A + row_offsets(i_b, i_h, o_t[:, None], T, H, BT) + tl.arange(0, BT)[None, :], mask=m_t[:, None], other=0.0)
    b_dv = tl.dot(tl.trans(b_A.to(b_do.dtype)), b_do, input_precision=PREC)
    if SCALAR:
        b_b = tl.load(b + row_offsets(i_b, i_h, o_t, T, H, 1), mask=m_t, other=0.0)
        b_bl = tl.load(b + row_offsets(i_b, i_h, last, T, H, 1))
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_k = load_rows(k, i_b, i_h // HG, o_t, m_t, o_k, m_k, T, H // HG, K)
        if SCALAR:
            b_kd = b_k * tl.exp(tl.where(m_t, b_bl - b_b, 0.0))[:, None]
        else:
            b_bk = load_rows(b, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)
            b_blk = tl.load(b + row_offsets(i_b, i_h, last, T, H, K) + o_k, mask=m_k, other=0.0)
            b_kd = b_k * tl.exp(tl.where(m_t[:, None], b_blk[None, :] - b_bk, 0.0))
        b_dh = tl.load(dh + row_offsets(i_b, i_h, i_t, NT, H, K * V) + o_k[:, None] * V + o_v[None, :],
                       mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_dv += tl.dot(b_kd.to(b_do.dtype), b_dh.to(b_do.dtype), input_precision=PREC)
    store_rows(dv, b_dv, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)


@triton.jit
def state_grads(v, h, dh, do, i_b, i_h, i_t, o_t, m_t, o_k, m_k, T, NT, H: tl.constexpr, K: tl.constexpr,
                V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                DIAG: tl.constexpr = True):
    """The state terms of dq and dk for one K tile of one chunk, before their decay factors:
    do h_nᵀ and v dh_{n+1}ᵀ [BT, BK] fp32, Σ_v h_n ⊙ dh_{n+1} [BK], and with DIAG the diagonal of do vᵀ,
    dA_tt = do_t · v_t [BT] fp32 (the diagonal pairs' share of dq and dk, module docstring; zeros without)."""
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    b_dAd = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        p_state_t = row_offsets(i_b, i_h, i_t, NT, H, K * V) + o_v[:, None] + o_k[None, :] * V
        m_vk = m_v[:, None] & m_k[None, :]
        b_ht = tl.load(h + p_state_t, mask=m_vk, other=0.0)                    # [BV, BK]
        b_dht = tl.load(dh + p_state_t, mask=m_vk, other=0.0)
        b_do = load_rows(do, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)
        b_v = load_rows(v, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)
        b_dq += tl.dot(b_do, b_ht.to(b_do.dtype), input_precision=PREC)
        b_dk += tl.dot(b_v, b_dht.to(b_v.dtype), input_precision=PREC)
        b_hdh += tl.sum(b_ht.to(tl.float32) * b_dht.to(tl.float32), axis=0)
        if DIAG:
            b_dAd += tl.sum(b_do.to(tl.float32) * b_v.to(tl.float32), axis=1)
    return b_dq, b_dk, b_hdh, b_dAd


@triton.jit
def chunk_bwd_dqkb_kernel(q, k, v, b, res, h, dh, do, dA, dq_intra, dk_intra, dq, dk, db, scale, T, NT,
                          H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                          BK: tl.constexpr, BV: tl.constexpr, SCALAR: tl.constexpr, PREC: tl.constexpr,
                          MAXR: tl.constexpr, EXACT: tl.constexpr, REDO: tl.constexpr, HG: tl.constexpr = 1,
                          INTRA: tl.constexpr = False):
    """EXACT: exp(b_L − b) adds r_L − r (res: b's residual, ops/chunkwise/cumsum.py); REDO: returns at once from
    the chunks whose decay is at most MAXR (cumsum.residual_launches). HG: heads per q and k head, as
    chunk_fwd_o_kernel's; dq, dk and the intra-chunk parts are per head. INTRA (scalar decay): the intra-chunk
    parts are formed here, M = dA ⊙ exp(b_i − b_j) over the strictly lower pairs j < i of the chunk, dq += scale M k
    and dk += scale Mᵀ q (chunk_intra_bwd's sums as two dots; the exponents add r_i − r_j with EXACT), instead of
    read from dq_intra and dk_intra. M is rounded to q's dtype for the dots: bf16 operands take the kernel about a
    quarter less time than TF32 on fp32 copies at the SSD and Gated DeltaNet layers (H200); fp32 inputs stay exact."""
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    if REDO:
        if weak_chunk(b, i_b, i_h, i_t, T, H, K, BT, BK, SCALAR, MAXR):
            return
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    last = tl.minimum(i_t * BT + BT, T) - 1
    b_dq, b_dk, b_hdh, b_dAd = state_grads(v, h, dh, do, i_b, i_h, i_t, o_t, m_t, o_k, m_k, T, NT, H, K, V, BT, BK, BV,
                                           PREC, False)
    b_dAd = tl.load(dA + row_offsets(i_b, i_h, o_t, T, H, BT) + (o_t - i_t * BT), mask=m_t, other=0.0)   # dA_tt
    b_q16 = load_rows(q, i_b, i_h // HG, o_t, m_t, o_k, m_k, T, H // HG, K)
    b_k16 = load_rows(k, i_b, i_h // HG, o_t, m_t, o_k, m_k, T, H // HG, K)
    b_q, b_k = b_q16.to(tl.float32), b_k16.to(tl.float32)
    if SCALAR:
        b_b = tl.load(b + row_offsets(i_b, i_h, o_t, T, H, 1), mask=m_t, other=0.0)
        b_bl = tl.load(b + row_offsets(i_b, i_h, last, T, H, 1))
        d = b_bl - b_b
        if EXACT:
            d += residual_to_last(res, i_b, i_h, last, o_t, m_t, T, H)
        b_dq *= (tl.exp(b_b) * scale)[:, None]
        b_dk *= tl.exp(tl.where(m_t, d, 0.0))[:, None]
        b_hdh *= tl.exp(b_bl)
    else:
        b_b = load_rows(b, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)
        b_bl = tl.load(b + row_offsets(i_b, i_h, last, T, H, K) + o_k, mask=m_k, other=0.0)
        d = b_bl[None, :] - b_b
        if EXACT:
            d += key_residual_to_last(res, i_b, i_h, last, o_t, m_t, o_k, m_k, T, H, K)
        b_dq *= tl.exp(b_b) * scale
        b_dk *= tl.exp(tl.where(m_t[:, None], d, 0.0))
        b_hdh *= tl.exp(b_bl)
    p = row_offsets(i_b, i_h, o_t[:, None], T, H, K) + o_k[None, :]
    is_last = (o_t == last)[:, None]
    b_dks = tl.where(is_last, 0.0, b_dk)                      # the last row's state pair, out of db (docstring)
    tail = b_hdh + tl.sum(b_k * b_dks, axis=0)                # the last row's extra terms, per key dim
    if INTRA:
        b_M = tl.load(dA + row_offsets(i_b, i_h, o_t[:, None], T, H, BT) + tl.arange(0, BT)[None, :],
                      mask=m_t[:, None], other=0.0)
        d = b_b[:, None] - b_b[None, :]
        if EXACT:
            c = tl.load(res + row_offsets(i_b, i_h, o_t, T, H, 1), mask=m_t, other=0.0)
            d += c[:, None] - c[None, :]
        keep = (o_t[:, None] > o_t[None, :]) & m_t[:, None] & m_t[None, :]
        # M rounded to q's dtype, as the forward rounds A for A v: bf16 tensor-core dots, not TF32 on fp32 copies
        b_M = (b_M * tl.exp(tl.where(keep, d, float("-inf")))).to(q.dtype.element_ty)
        b_dq += tl.dot(b_M, b_k16.to(b_M.dtype), input_precision=PREC) * scale
        b_dki = tl.dot(tl.trans(b_M), b_q16, input_precision=PREC) * scale
    else:
        b_dq += tl.load(dq_intra + p, mask=m_tk, other=0.0)
        b_dki = tl.load(dk_intra + p, mask=m_tk, other=0.0)
    b_db = b_q * b_dq - b_k * (b_dks + b_dki)
    b_dk += b_dki
    if SCALAR:
        row = tl.sum(b_db, axis=1) + tl.where(o_t == last, tl.sum(tail, axis=0), 0.0)
        tl.store(db + ((i_k * (tl.num_programs(2) // H) + i_b) * T + o_t) * H + i_h, row, mask=m_t)
    else:
        tl.store(db + p, b_db + tl.where(is_last, tail[None, :], 0.0), mask=m_tk)
    b_dAd = (b_dAd * scale)[:, None]                          # the diagonal pairs, after db (module docstring)
    tl.store(dq + p, (b_dq + b_dAd * b_k).to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + p, (b_dk + b_dAd * b_q).to(dk.dtype.element_ty), mask=m_tk)


# Launch configs, the best of a sweep on the H100: 8 warps unpipelined for the output stage (a quarter faster at the
# GLA-340M layer, no worse at the small-head shape); 4 warps, 3 stages for the scalar-decay kernel that forms A
# itself (every config's output bit-identical).
O_LAUNCH = dict(num_warps=8, num_stages=1)
O_SCALAR_LAUNCH = dict(num_warps=4, num_stages=3)


def chunk_fwd_o(q, v, b, h, A, scale: float, chunk_size: int, **launch) -> torch.Tensor:
    """o [B, T, H, V] from A [B, T, H, C] (intra.py). launch: num_warps / num_stages."""
    return _fwd_o(q, q, v, b, h, A, scale, chunk_size, False, O_LAUNCH | launch)


def chunk_fwd_o_scalar(q, k, v, b, h, scale: float, chunk_size: int, res: torch.Tensor | None = None,
                       **launch) -> tuple[torch.Tensor, torch.Tensor]:
    """Scalar decay (b [B, T, H, 1]): A is one masked GEMM, so the output kernel forms it itself, one
    launch and one A read fewer than chunk_intra_fwd + chunk_fwd_o. Returns o and A (q's dtype, for
    the backward). res: b's residual, added to A's exponents, or None (b alone). q, k: [B, T, H, K], or
    [B, T, G, K] shared by groups of H / G heads (chunk_fwd_h's k)."""
    A = torch.empty(*v.shape[:3], chunk_size, dtype=q.dtype, device=q.device)
    return _fwd_o(q, k, v, b, h, A, scale, chunk_size, True, O_SCALAR_LAUNCH | launch, res), A


def _fwd_o(q, k, v, b, h, A, scale, chunk_size, inline_a, launch, res=None):
    B, T, G, K = q.shape
    H, V = v.shape[2:]
    BK, BV = tile(K), tile(V)
    o = torch.empty_like(v)
    grid = (cdiv(V, BV), cdiv(T, chunk_size), B * H)
    chunk_fwd_o_kernel[grid](q, k, v, b, h, A, o, scale, T, h.shape[1], H, K, V, chunk_size, BK, BV,
                             b.shape[-1] == 1, inline_a, dot_precision(v), res, res is not None, HG=H // G, **launch)
    return o


def chunk_bwd_dA(do, v, chunk_size: int) -> torch.Tensor:
    B, T, H, V = v.shape
    dA = torch.empty(B, T, H, chunk_size, dtype=torch.float32, device=v.device)
    # num_stages=1: software-pipelined (2 or 3 stages), Triton 3.6 miscompiles this loop on Hopper with bf16
    # operands and three or more V tiles (relative error 0.9); unpipelined it is right at every V.
    chunk_bwd_dA_kernel[(cdiv(T, chunk_size), B * H)](do, v, dA, T, H, V, chunk_size, tile(V), dot_precision(v),
                                                             num_stages=1)
    return dA


def chunk_bwd_dv(k, b, A, do, dh, chunk_size: int, num_warps: int = 4) -> torch.Tensor:
    """dv [B, T, H, V] (do's dtype); k as chunk_fwd_h's (grouped or not)."""
    B, T, G, K = k.shape
    H, V = do.shape[2:]
    BK, BV = tile(K), tile(V)
    dv = torch.empty_like(do)
    grid = (cdiv(V, BV), cdiv(T, chunk_size), B * H)
    chunk_bwd_dv_kernel[grid](k, b, A, do, dh, dv, T, dh.shape[1], H, K, V, chunk_size, BK, BV,
                              b.shape[-1] == 1, dot_precision(do), HG=H // G, num_warps=num_warps)
    return dv


def chunk_bwd_dqkb(q, k, v, b, res, h, dh, do, dA, dq_intra, dk_intra, scale: float, chunk_size: int,
                   num_warps: int = 4, num_stages: int | None = None):
    """dq_intra, dk_intra: chunk_intra_bwd's, without the diagonal pairs, which this kernel adds (module docstring)
    from the diagonal of dA = chunk_bwd_dA(do, v); None with a scalar decay: the kernel forms them from dA itself
    (INTRA), one launch and two [B, T, H, K] fp32 round trips through HBM fewer. res: b's residual
    (cumsum.chunk_residual).
    Returns dq, dk per head ([B, T, H, K], the inputs' dtypes, also where q and k are shared by groups of heads, as
    chunk_fwd_h's k) and db (fp32: [B, T, H, K], or [B, T, H, 1] for a scalar decay).
    num_stages: None picks 1 for a scalar decay, else Triton's default. Software-pipelined, the scalar-decay
    kernel races on the H100 at K = V = 128 with two V tiles (about one call in 600 gives different dk and db bits
    on identical inputs); unpipelined it never does. The per-key kernel runs the same V loop and keeps the default:
    thousands of pipelined calls at K128 V256 never differed."""
    B, T, G, K = q.shape
    H, V = v.shape[2:]
    scalar = b.shape[-1] == 1
    num_stages = 1 if num_stages is None and scalar else num_stages
    intra = dq_intra is None
    if intra and not scalar:
        raise ValueError("chunk_bwd_dqkb: the intra-chunk parts are formed in the kernel only for a scalar decay; "
                         "pass chunk_intra_bwd's dq_intra and dk_intra for a per-key one")
    # bf16 intra dots on K tiles under 64 wide come out wrong on Hopper at 4 warps (Triton 3.6: dq 0.3 and db 0.7
    # off at K = 16-32; right at 8 warps or 64 wide), so those take one 64-wide masked tile
    BK, BV = (64 if intra and q.dtype != torch.float32 else tile(K)), tile(V)
    NK = cdiv(K, BK)
    dq, dk = (torch.empty(B, T, H, K, dtype=x.dtype, device=x.device) for x in (q, k))
    if intra:
        dq_intra, dk_intra = dq, dk                          # unread (INTRA)
    db = torch.empty(NK, B, T, H, 1, dtype=torch.float32, device=q.device) if scalar else \
        torch.empty(B, T, H, K, dtype=torch.float32, device=q.device)
    grid = (NK, cdiv(T, chunk_size), B * H)
    for exact, redo in residual_launches(scalar):
        chunk_bwd_dqkb_kernel[grid](q, k, v, b, res, h, dh, do, dA, dq_intra, dk_intra, dq, dk, db, scale, T,
                                    h.shape[1], H, K, V, chunk_size, BK, BV, scalar, dot_precision(do), RESIDUAL_FROM,
                                    exact, redo, HG=H // G, INTRA=intra, num_warps=num_warps,
                                    **({} if num_stages is None else {"num_stages": num_stages}))
    return dq, dk, (sum_partials(db) if scalar else db)


def chunk_fwd_o_ref(q, v, b, h, A, scale: float, chunk_size: int) -> torch.Tensor:
    B, T, H, _ = q.shape
    qc, vc, bc, Ac = (pad_chunks(x, chunk_size) for x in (q, v, b, A))                # [B, N, C, H, D]
    o = torch.einsum("bnchk,bnhkv->bnchv", qc * bc.exp() * scale, h.float()) + \
        torch.einsum("bnihj,bnjhv->bnihv", Ac, vc)
    return o.reshape(B, -1, H, v.shape[-1])[:, :T]


def chunk_bwd_dA_ref(do, v, chunk_size: int) -> torch.Tensor:
    B, T, H, _ = v.shape
    dA = torch.einsum("bnihv,bnjhv->bnihj", pad_chunks(do, chunk_size), pad_chunks(v, chunk_size))
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=v.device).tril()
    return (dA * causal[:, None, :]).reshape(B, -1, H, chunk_size)[:, :T]


def _k_to_end(k, b, chunk_size: int) -> torch.Tensor:
    """k ⊙ exp(b_L − b) per chunk, zero on padded rows: [B, N, C, H, K]."""
    B, T = k.shape[:2]
    kc, bc = pad_chunks(k, chunk_size), pad_chunks(b, chunk_size)
    valid = (torch.arange(kc.shape[1] * chunk_size, device=k.device) < T).view(1, -1, chunk_size, 1, 1)
    return kc * torch.where(valid, (chunk_last(b, T, chunk_size)[:, :, None] - bc).exp(), 0.0)


def chunk_bwd_dv_ref(k, b, A, do, dh, chunk_size: int) -> torch.Tensor:
    B, T, H, _ = k.shape
    dv = torch.einsum("bnihj,bnihv->bnjhv", pad_chunks(A, chunk_size), pad_chunks(do, chunk_size)) + \
        torch.einsum("bnchk,bnhkv->bnchv", _k_to_end(k, b, chunk_size), dh.float())
    return dv.reshape(B, -1, H, do.shape[-1])[:, :T]


def chunk_bwd_dqkb_ref(q, k, v, b, h, dh, do, dq_intra, dk_intra, scale: float, chunk_size: int):
    B, T, H, K = q.shape
    C = chunk_size
    dq_in = torch.einsum("bnchv,bnhkv->bnchk", pad_chunks(do, C), h.float()) * pad_chunks(b, C).exp() * scale
    dk_in = torch.einsum("bnchv,bnhkv->bnchk", pad_chunks(v, C), dh.float()) * _k_to_end(torch.ones_like(k), b, C)
    dq = dq_in.reshape(B, -1, H, K)[:, :T] + dq_intra
    dk_in = dk_in.reshape(B, -1, H, K)[:, :T]
    ends = torch.clamp(torch.arange(C - 1, T + C - 1, C, device=q.device)[:cdiv(T, C)], max=T - 1)
    dk_off = dk_in.clone()
    dk_off[:, ends] = 0.0                                                               # the last row's state pair
    db = q.float() * dq - k.float() * (dk_off + dk_intra)
    tail = chunk_last(b, T, C).exp() * (h.float() * dh.float()).sum(-1) + pad_chunks(k.float() * dk_off, C).sum(2)
    db[:, ends] += tail                                                                 # [B, N, H, K]
    dk = dk_in + dk_intra
    dA_diag = (do.float() * v.float()).sum(-1, keepdim=True) * scale                  # the diagonal pairs
    return dq + dA_diag * k.float(), dk + dA_diag * q.float(), (db.sum(-1, keepdim=True) if b.shape[-1] == 1 else db)
