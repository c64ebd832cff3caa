"""The UT transform / WY representation of the gated delta rule's per-chunk Householder products,
forward and backward.

Within one chunk (b = chunk-local cumsum of the scalar log-decay g, γ = exp(b), β the write
strengths), with L strictly lower triangular,
    L_ij = β_i exp(b_i − b_j) (k_i · k_j)   for j < i,      Tm = (I + L)⁻¹
    w = Tm diag(β) (γ ⊙ k)   [C, K],        u = Tm diag(β) v   [C, V]
Backward, given dw and du (du = dv_new; dw = −dv_new h_nᵀ is formed here from the states):
    dTm = dw (diag(β) γ⊙k)ᵀ + du (diag(β) v)ᵀ,   dL = −Tmᵀ dTm Tmᵀ  (used on the strictly lower part)
    dv  = β ⊙ Tmᵀ du
    dk  = β γ ⊙ Tmᵀ dw + (M + Mᵀ) k,           M_ij = dL_ij β_i exp(b_i − b_j)   (j < i)
    dβ  = γ k·(Tmᵀ dw) + v·(Tmᵀ du) + Σ_j dL_ij exp(b_i − b_j) (k_i·k_j)
    db_i = β_i γ_i k_i·(Tmᵀ dw)_i + Σ_j Q_ij − Σ_j Q_ji,   Q = dL ⊙ L
Every exponent is b_i − b_j with i ≥ j, or b itself (chunk-local, ≤ 0): nothing overflows.

Tm is solved in fp32 in registers, in four row blocks (fla's fused kkt + solve has the same shape):
the diagonal blocks by forward substitution, then the blocks below from the block recurrence (wy_fwd_kernel).
The backward never feeds tl.trans of a dot accumulator into tl.dot (Triton < 3.7.1 miscompiles that on Hopper):
transposed operands are loaded transposed from memory, and Mᵀ is re-read by a second kernel. Tm is stored as
[B, T, H, C] in the inputs' dtype: row t holds its chunk's row of Tm (like A in ops/chunkwise/intra.py).
Warps, the best of an H100 sweep: the forward 2 (its tiles are 16 × 16), the backward 4. A 4-warp, 64-row
backward kernel is the shape fla's Hopper miscompile took, so its tests run on the GPU too.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.triton_utils import cdiv, load_rows, load_rows_t, row_offsets, store_rows
from ops.triton_utils import dot_precision, tile


@triton.jit
def _kkt_block(k, b, res, beta, i_b, i_h, t_i, t_j, T, H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr,
               BK: tl.constexpr, DIAG: tl.constexpr, PREC: tl.constexpr):
    """The block of L with rows t_i and columns t_j: β_i exp(b_i − b_j) (k_i · k_j), strictly lower when
    DIAG (a diagonal block), 0 past T. The exponent adds r_i − r_j (res: b's residual)."""
    m_i, m_j = t_i < T, t_j < T
    b_L = tl.zeros([BC, BC], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_L += tl.dot(load_rows(k, i_b, i_h, t_i, m_i, o_k, m_k, T, H, K),
                      load_rows_t(k, i_b, i_h, t_j, m_j, o_k, m_k, T, H, K), input_precision=PREC)
    keep = m_i[:, None] & m_j[None, :]
    if DIAG:
        keep = keep & (t_i[:, None] > t_j[None, :])
    b_bi = tl.load(b + row_offsets(i_b, i_h, t_i, T, H, 1), mask=m_i, other=0.0)
    b_bj = tl.load(b + row_offsets(i_b, i_h, t_j, T, H, 1), mask=m_j, other=0.0)
    c_i = tl.load(res + row_offsets(i_b, i_h, t_i, T, H, 1), mask=m_i, other=0.0)
    c_j = tl.load(res + row_offsets(i_b, i_h, t_j, T, H, 1), mask=m_j, other=0.0)
    b_betai = tl.load(beta + row_offsets(i_b, i_h, t_i, T, H, 1), mask=m_i, other=0.0).to(tl.float32)
    b_e = (b_bi[:, None] - b_bj[None, :]) + (c_i[:, None] - c_j[None, :])
    return b_L * b_betai[:, None] * tl.exp(tl.where(keep, b_e, float("-inf")))


@triton.jit
def _substitute_row(L, X, o, r):
    """Row r of X = (I + L)⁻¹ by forward substitution (rows < r final, row r still e_r)."""
    l_r = tl.sum(tl.where(o[:, None] == r, L, 0.0), 0)
    return tl.where(o[:, None] == r, X - tl.sum(l_r[:, None] * X, 0)[None, :], X)


@triton.jit
def _store_block(Ai, X, i_b, i_h, t_i, col0, T, H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    o_j = col0 + tl.arange(0, BC)
    tl.store(Ai + row_offsets(i_b, i_h, t_i[:, None], T, H, BT) + o_j[None, :], X.to(Ai.dtype.element_ty),
             mask=(t_i < T)[:, None])


@triton.jit
def _scaled_rows(x, b, beta, i_b, i_h, t_i, o_d, m_d, T, H: tl.constexpr, D: tl.constexpr, DECAY: tl.constexpr):
    """x's rows t_i times β (and γ = exp(b) when DECAY), fp32."""
    m_i = t_i < T
    s = tl.load(beta + row_offsets(i_b, i_h, t_i, T, H, 1), mask=m_i, other=0.0).to(tl.float32)
    if DECAY:
        s *= tl.exp(tl.load(b + row_offsets(i_b, i_h, t_i, T, H, 1), mask=m_i, other=0.0))
    return load_rows(x, i_b, i_h, t_i, m_i, o_d, m_d, T, H, D).to(tl.float32) * s[:, None]


@triton.jit
def _apply_tm(x, out, b, beta, i_b, i_h, t0, T, H: tl.constexpr, D: tl.constexpr, BC: tl.constexpr,
              NB: tl.constexpr, BD: tl.constexpr, DECAY: tl.constexpr, PREC: tl.constexpr,
              X0, X1, X2, X3, T10, T20, T21, T30, T31, T32):
    """out = Tm diag(β) (γ ⊙) x over the chunk's NB row blocks, Tm block lower triangular."""
    for i_d in range(tl.cdiv(D, BD)):
        o_d = i_d * BD + tl.arange(0, BD)
        m_d = o_d < D
        x0 = _scaled_rows(x, b, beta, i_b, i_h, t0, o_d, m_d, T, H, D, DECAY)
        _store_rows(out, tl.dot(X0, x0, input_precision=PREC), i_b, i_h, t0, o_d, m_d, T, H, D)
        if NB >= 2:
            x1 = _scaled_rows(x, b, beta, i_b, i_h, t0 + BC, o_d, m_d, T, H, D, DECAY)
            y1 = tl.dot(T10, x0, input_precision=PREC) + tl.dot(X1, x1, input_precision=PREC)
            _store_rows(out, y1, i_b, i_h, t0 + BC, o_d, m_d, T, H, D)
        if NB >= 4:
            x2 = _scaled_rows(x, b, beta, i_b, i_h, t0 + 2 * BC, o_d, m_d, T, H, D, DECAY)
            x3 = _scaled_rows(x, b, beta, i_b, i_h, t0 + 3 * BC, o_d, m_d, T, H, D, DECAY)
            y2 = tl.dot(T20, x0, input_precision=PREC) + tl.dot(T21, x1, input_precision=PREC) \
                + tl.dot(X2, x2, input_precision=PREC)
            y3 = tl.dot(T30, x0, input_precision=PREC) + tl.dot(T31, x1, input_precision=PREC) \
                + tl.dot(T32, x2, input_precision=PREC) + tl.dot(X3, x3, input_precision=PREC)
            _store_rows(out, y2, i_b, i_h, t0 + 2 * BC, o_d, m_d, T, H, D)
            _store_rows(out, y3, i_b, i_h, t0 + 3 * BC, o_d, m_d, T, H, D)


@triton.jit
def _store_rows(out, y, i_b, i_h, t_i, o_d, m_d, T, H: tl.constexpr, D: tl.constexpr):
    tl.store(out + row_offsets(i_b, i_h, t_i[:, None], T, H, D) + o_d[None, :], y.to(out.dtype.element_ty),
             mask=(t_i < T)[:, None] & m_d[None, :])


@triton.jit
def wy_fwd_kernel(k, v, b, res, beta, Ai, w, u, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BC: tl.constexpr, NB: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  PREC: tl.constexpr):
    """One program per chunk, in NB ∈ {1, 2, 4} row blocks of BC rows (explicit, as Triton has no
    arrays of tiles): the diagonal blocks of Tm by forward substitution, all NB in one loop, then the
    blocks below them from Tm_IJ = −Tm_II Σ_{J≤M<I} L_IM Tm_MJ (fp32, exact "ieee" dots)."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o = tl.arange(0, BC)
    t0 = i_t * BT + o
    t1, t2, t3 = t0 + BC, t0 + 2 * BC, t0 + 3 * BC
    eye = tl.where(o[:, None] == o[None, :], 1.0, 0.0)
    zero = tl.zeros([BC, BC], dtype=tl.float32)
    L00 = _kkt_block(k, b, res, beta, i_b, i_h, t0, t0, T, H, K, BC, BK, True, PREC)
    X0, X1, X2, X3 = eye, eye, eye, eye
    T10, T20, T21, T30, T31, T32 = zero, zero, zero, zero, zero, zero
    L11, L22, L33 = zero, zero, zero
    if NB >= 2:
        L11 = _kkt_block(k, b, res, beta, i_b, i_h, t1, t1, T, H, K, BC, BK, True, PREC)
    if NB >= 4:
        L22 = _kkt_block(k, b, res, beta, i_b, i_h, t2, t2, T, H, K, BC, BK, True, PREC)
        L33 = _kkt_block(k, b, res, beta, i_b, i_h, t3, t3, T, H, K, BC, BK, True, PREC)
    for r in range(1, BC):               # the NB substitutions are independent: one loop, four chains
        X0 = _substitute_row(L00, X0, o, r)
        if NB >= 2:
            X1 = _substitute_row(L11, X1, o, r)
        if NB >= 4:
            X2 = _substitute_row(L22, X2, o, r)
            X3 = _substitute_row(L33, X3, o, r)
    if NB >= 2:
        L10 = _kkt_block(k, b, res, beta, i_b, i_h, t1, t0, T, H, K, BC, BK, False, PREC)
        T10 = -tl.dot(X1, tl.dot(L10, X0, input_precision="ieee"), input_precision="ieee")
    if NB >= 4:
        L20 = _kkt_block(k, b, res, beta, i_b, i_h, t2, t0, T, H, K, BC, BK, False, PREC)
        L21 = _kkt_block(k, b, res, beta, i_b, i_h, t2, t1, T, H, K, BC, BK, False, PREC)
        L30 = _kkt_block(k, b, res, beta, i_b, i_h, t3, t0, T, H, K, BC, BK, False, PREC)
        L31 = _kkt_block(k, b, res, beta, i_b, i_h, t3, t1, T, H, K, BC, BK, False, PREC)
        L32 = _kkt_block(k, b, res, beta, i_b, i_h, t3, t2, T, H, K, BC, BK, False, PREC)
        T21 = -tl.dot(X2, tl.dot(L21, X1, input_precision="ieee"), input_precision="ieee")
        T32 = -tl.dot(X3, tl.dot(L32, X2, input_precision="ieee"), input_precision="ieee")
        T20 = -tl.dot(X2, tl.dot(L20, X0, input_precision="ieee") + tl.dot(L21, T10, input_precision="ieee"),
                      input_precision="ieee")
        T31 = -tl.dot(X3, tl.dot(L31, X1, input_precision="ieee") + tl.dot(L32, T21, input_precision="ieee"),
                      input_precision="ieee")
        T30 = -tl.dot(X3, tl.dot(L30, X0, input_precision="ieee") + tl.dot(L31, T10, input_precision="ieee")
                      + tl.dot(L32, T20, input_precision="ieee"), input_precision="ieee")
    _store_block(Ai, X0, i_b, i_h, t0, 0, T, H, BT, BC)
    if NB >= 2:
        _store_block(Ai, zero, i_b, i_h, t0, BC, T, H, BT, BC)
        _store_block(Ai, T10, i_b, i_h, t1, 0, T, H, BT, BC)
        _store_block(Ai, X1, i_b, i_h, t1, BC, T, H, BT, BC)
    if NB >= 4:
        for J in tl.static_range(2, 4):
            _store_block(Ai, zero, i_b, i_h, t0, J * BC, T, H, BT, BC)
            _store_block(Ai, zero, i_b, i_h, t1, J * BC, T, H, BT, BC)
        _store_block(Ai, zero, i_b, i_h, t2, 3 * BC, T, H, BT, BC)
        _store_block(Ai, T20, i_b, i_h, t2, 0, T, H, BT, BC)
        _store_block(Ai, T21, i_b, i_h, t2, BC, T, H, BT, BC)
        _store_block(Ai, X2, i_b, i_h, t2, 2 * BC, T, H, BT, BC)
        _store_block(Ai, T30, i_b, i_h, t3, 0, T, H, BT, BC)
        _store_block(Ai, T31, i_b, i_h, t3, BC, T, H, BT, BC)
        _store_block(Ai, T32, i_b, i_h, t3, 2 * BC, T, H, BT, BC)
        _store_block(Ai, X3, i_b, i_h, t3, 3 * BC, T, H, BT, BC)
    _apply_tm(k, w, b, beta, i_b, i_h, t0, T, H, K, BC, NB, BK, True, PREC, X0, X1, X2, X3, T10, T20, T21, T30, T31, T32)
    _apply_tm(v, u, b, beta, i_b, i_h, t0, T, H, V, BC, NB, BV, False, PREC, X0, X1, X2, X3, T10, T20, T21, T30, T31, T32)


@triton.jit
def wy_bwd_kernel(k, v, b, res, beta, Ai, h, dv_new, dk_wy, dv, dbeta, db, M, T, NT, H: tl.constexpr,
                  K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  PREC: tl.constexpr):
    """Everything but the (M + Mᵀ) k part of dk, which needs M transposed (wy_bwd_dk_kernel). exp(b_i − b_j) adds
    r_i − r_j (res: b's residual, ops/chunkwise/cumsum.py)."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    m_t = o_t < T
    b_b = tl.load(b + row_offsets(i_b, i_h, o_t, T, H, 1), mask=m_t, other=0.0)
    b_beta = tl.load(beta + row_offsets(i_b, i_h, o_t, T, H, 1), mask=m_t, other=0.0).to(tl.float32)
    b_s = b_beta * tl.exp(b_b)                                           # β γ
    p_A = row_offsets(i_b, i_h, o_t[:, None], T, H, BT) + o_c[None, :]
    b_Tt = tl.load(Ai + row_offsets(i_b, i_h, o_t[None, :], T, H, BT) + o_c[:, None], mask=m_t[None, :],
                   other=0.0).to(tl.float32)
    b_dT = tl.zeros([BT, BT], dtype=tl.float32)
    b_dbeta = tl.zeros([BT], dtype=tl.float32)
    b_db = tl.zeros([BT], dtype=tl.float32)
    p_h = h + row_offsets(i_b, i_h, i_t, NT, H, K * V)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_dw = tl.zeros([BT, BK], dtype=tl.float32)                     # dw = −dv_new h_nᵀ
        for i_v in range(tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < V
            b_dvn = load_rows(dv_new, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)
            b_ht = tl.load(p_h + o_k[None, :] * V + o_v[:, None], mask=m_v[:, None] & m_k[None, :], other=0.0)
            b_dw -= tl.dot(b_dvn, b_ht.to(tl.float32), input_precision=PREC)
        b_k = load_rows(k, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K).to(tl.float32)
        b_kt = load_rows_t(k, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K).to(tl.float32)
        b_dT += tl.dot(b_dw, b_kt * b_s[None, :], input_precision=PREC)
        b_dkb = tl.dot(b_Tt, b_dw, input_precision=PREC)               # Tmᵀ dw
        tl.store(dk_wy + row_offsets(i_b, i_h, o_t[:, None], T, H, K) + o_k[None, :], b_dkb * b_s[:, None],
                 mask=m_t[:, None] & m_k[None, :])
        b_kdkb = tl.sum(b_k * b_dkb, 1)
        b_dbeta += tl.exp(b_b) * b_kdkb
        b_db += b_s * b_kdkb
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_du = load_rows(dv_new, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)
        b_vt = load_rows_t(v, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V).to(tl.float32)
        b_dT += tl.dot(b_du, b_vt * b_beta[None, :], input_precision=PREC)
        b_dvb = tl.dot(b_Tt, b_du, input_precision=PREC)               # Tmᵀ du
        store_rows(dv, b_dvb * b_beta[:, None], i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)
        b_v = load_rows(v, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V).to(tl.float32)
        b_dbeta += tl.sum(b_v * b_dvb, 1)
    strict = (o_c[:, None] > o_c[None, :]) & m_t[:, None] & m_t[None, :]
    c_b = tl.load(res + row_offsets(i_b, i_h, o_t, T, H, 1), mask=m_t, other=0.0)     # one a row, every chunk
    b_E = tl.exp(tl.where(strict, (b_b[:, None] - b_b[None, :]) + (c_b[:, None] - c_b[None, :]), float("-inf")))
    b_dLE = -tl.dot(tl.dot(b_Tt, b_dT, input_precision=PREC), b_Tt, input_precision=PREC) * b_E
    b_KK = tl.zeros([BT, BT], dtype=tl.float32)                         # k kᵀ, after dTm is dead (registers)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_k = load_rows(k, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K).to(tl.float32)
        b_KK += tl.dot(b_k, load_rows_t(k, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K).to(tl.float32), input_precision=PREC)
    b_P = b_dLE * b_KK                                                   # dL ⊙ L / β_i
    b_dbeta += tl.sum(b_P, 1)
    b_Q = b_P * b_beta[:, None]
    b_db += tl.sum(b_Q, 1) - tl.sum(b_Q, 0)
    tl.store(M + p_A, b_dLE * b_beta[:, None], mask=m_t[:, None])
    tl.store(dbeta + row_offsets(i_b, i_h, o_t, T, H, 1), b_dbeta, mask=m_t)
    tl.store(db + row_offsets(i_b, i_h, o_t, T, H, 1), b_db, mask=m_t)


@triton.jit
def wy_bwd_dk_kernel(k, M, dk_wy, dk_in, dk, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                     BK: tl.constexpr, PREC: tl.constexpr):
    """dk = dk_in + β γ ⊙ Tmᵀ dw + (M + Mᵀ) k, with Mᵀ read transposed from memory."""
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    m_t = o_t < T
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    b_M = tl.load(M + row_offsets(i_b, i_h, o_t[:, None], T, H, BT) + o_c[None, :], mask=m_t[:, None], other=0.0)
    b_M += tl.load(M + row_offsets(i_b, i_h, o_t[None, :], T, H, BT) + o_c[:, None], mask=m_t[None, :], other=0.0)
    b_k = load_rows(k, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K).to(tl.float32)
    b_dk = tl.dot(b_M, b_k, input_precision=PREC)
    b_dk += load_rows(dk_wy, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)
    b_dk += load_rows(dk_in, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K).to(tl.float32)
    store_rows(dk, b_dk, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)


def wy_fwd(k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, res: torch.Tensor, beta: torch.Tensor,
           chunk_size: int, num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k: [B, T, H, K]; v: [B, T, H, V]; b: [B, T, H, 1] fp32 chunk-local cumsum and res its residual
    (ops/chunkwise/cumsum.chunk_residual), added to every exponent b_i − b_j of L; beta: [B, T, H].
    Returns Tm [B, T, H, C], w [B, T, H, K], u [B, T, H, V], all in k's dtype (Tm is solved and applied
    in fp32; stored for the backward in bf16 for bf16 inputs, as fla stores it, halving its traffic).
    num_warps: 2 for 16-row blocks (C ≤ 64), 8 for C = 128's 32-row blocks (module docstring)."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    Ai = torch.empty(B, T, H, chunk_size, dtype=k.dtype, device=k.device)
    w, u = torch.empty_like(k), torch.empty_like(v)
    BC = max(16, chunk_size // 4)
    wy_fwd_kernel[(cdiv(T, chunk_size), B * H)](k, v, b, res, beta, Ai, w, u, T, H, K, V, chunk_size, BC,
                                                        chunk_size // BC, tile(K), tile(V), dot_precision(k),
                                                        num_warps=num_warps or (2 if BC == 16 else 8))
    return Ai, w, u


def wy_bwd(k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, res: torch.Tensor, beta: torch.Tensor,
           Ai: torch.Tensor, h: torch.Tensor, dv_new: torch.Tensor, dk_in: torch.Tensor, chunk_size: int,
           num_warps: int | None = None):
    """res: b's residual (ops/chunkwise/cumsum.chunk_residual); Ai: Tm from wy_fwd; h: [B, NT, H, K, V] the state
    entering each chunk; dv_new: [B, T, H, V] fp32 (= du; dw = −dv_new h_nᵀ); dk_in: [B, T, H, K], the rest of dk.
    Returns dk (k's dtype, dk_in included), dv (v's dtype), dβ [B, T, H] fp32 and the WY part of db [B, T, H] fp32.
    num_warps: None picks 4, or 8 for fp32 at C = 128: there the [C, C] fp32 dots (no tensor cores) at 4 warps keep
    Triton 3.6's PTX lowering busy for minutes; at 8 it compiles in under one."""
    B, T, H, K = k.shape
    V, NT = v.shape[-1], cdiv(T, chunk_size)
    BK, BV = tile(K), tile(V)
    prec = dot_precision(k)
    if num_warps is None:
        num_warps = 8 if prec == "ieee" and chunk_size == 128 else 4
    dk_wy = torch.empty(B, T, H, K, dtype=torch.float32, device=k.device)
    M = torch.empty(B, T, H, chunk_size, dtype=torch.float32, device=k.device)
    dv, dk = torch.empty_like(v), torch.empty_like(k)
    dbeta = torch.empty(B, T, H, dtype=torch.float32, device=k.device)
    db = torch.empty_like(dbeta)
    wy_bwd_kernel[(NT, B * H)](k, v, b, res, beta, Ai, h, dv_new, dk_wy, dv, dbeta, db, M, T, NT, H, K, V,
                               chunk_size, BK, BV, prec, num_warps=num_warps)
    wy_bwd_dk_kernel[(cdiv(K, BK), NT, B * H)](k, M, dk_wy, dk_in, dk, T, H, K, chunk_size, BK, prec,
                                                      num_warps=num_warps)
    return dk, dv, dbeta, db


def per_chunk(x: torch.Tensor, C: int) -> torch.Tensor:
    """[B, T, H, D] → [B, NT, H, C, D] fp64, zero-padded."""
    B, T, H, D = x.shape
    x = torch.nn.functional.pad(x.double(), (0, 0, 0, 0, 0, -T % C))
    return x.view(B, -1, C, H, D).transpose(2, 3)


def per_step(x: torch.Tensor, T: int) -> torch.Tensor:
    """[B, NT, H, C, D] → [B, T, H, D]."""
    B, NT, H, C, D = x.shape
    return x.transpose(2, 3).reshape(B, NT * C, H, D)[:, :T]


def wy_fwd_ref(k, v, b, beta, chunk_size: int):
    """Tm, w, u as wy_fwd, in fp64 PyTorch (differentiable: wy_bwd_ref takes its gradients)."""
    T, C = k.shape[1], chunk_size
    kc, vc, bc, betac = per_chunk(k, C), per_chunk(v, C), per_chunk(b, C)[..., 0], per_chunk(beta[..., None], C)[..., 0]
    valid = (torch.arange(kc.shape[1] * C, device=k.device) < T).view(-1, 1, C)      # [NT, 1, C]
    strict = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1) & valid[..., None] & valid[..., None, :]
    decay = (bc[..., :, None] - bc[..., None, :]).masked_fill(~strict, float("-inf")).exp()   # [B, NT, H, C, C]
    L = betac[..., None] * (kc @ kc.transpose(-1, -2)) * decay
    eye = torch.eye(C, dtype=L.dtype, device=k.device)
    Tm = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False, unitriangular=True)
    w = Tm @ (betac[..., None] * bc.exp()[..., None] * kc)
    u = Tm @ (betac[..., None] * vc)
    return per_step(Tm, T), per_step(w, T), per_step(u, T)


def wy_bwd_ref(k, v, b, beta, h, dv_new, chunk_size: int):
    """dk (WY part only), dv, dβ, db of wy_fwd_ref's (w, u) for du = dv_new, dw = −dv_new h_nᵀ."""
    T, C = k.shape[1], chunk_size
    dw = per_step(-per_chunk(dv_new, C) @ h.double().transpose(-1, -2), T)          # [B, T, H, K]
    xs = [x.detach().double().requires_grad_() for x in (k, v, b, beta)]
    _, w, u = wy_fwd_ref(*xs, C)
    dk, dv, db, dbeta = torch.autograd.grad((w, u), xs, (dw, dv_new.double()))
    return dk, dv, dbeta, db[..., 0]
