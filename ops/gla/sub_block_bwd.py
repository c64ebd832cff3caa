"""The sub-block backward kernels of fused GLA (per-key-dim decay): the backward of the chunks whose
decay is too strong for scan_bwd.py's factorised scores (that module launches them with its
threshold; at min_range < 0 they take every chunk, as the tests run them). Two launches that recompute
the scores instead of reading A, and form dA = do vᵀ in registers instead of writing it: dv (per V tile)
and dq, dk, db (per K tile; `chunk` needs four launches and two C-wide round trips).

    o_i = scale (q_i ⊙ exp(b_i)) h_n  +  Σ_{j ≤ i in the chunk} S̃_ij v_j,
    S̃_ij = scale Σ_d q_id k_jd exp(b_id − b_jd)

S̃ is built one key block J (BC rows) at a time, never with a positive exponent:
- rows below block J (i > last row ℓ of J): factorised around ℓ, q_i ⊙ exp(b_i − b_ℓ) against
  k_j ⊙ exp(b_ℓ − b_j); both factors ≤ 1 since b is non-increasing. One [C, BC] dot per K tile
  covers every such row, where ops/chunkwise/intra.py factorises per (row block, key block) pair.
- inside block J (j ≤ i, both in J): elementwise, as ops/chunkwise/intra.py, then moved to the block's rows
  through a [C, BC] 0/1 selection matrix (a tensor-core dot; Triton cannot assign into a slice of a tile).
Each kernel is tested against the `chunk` stages it replaces, and inside the `fused` backend.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.chunkwise.cumsum import RESIDUAL_FROM, chunk_decay, residual_mask, residual_tile
from ops.chunkwise.intra import diag_scores
from ops.chunkwise.output import state_grads
from ops.triton_utils import cdiv, dot_precision, load_rows, load_rows_t, row_offsets, store_rows, tile


@triton.jit
def fused_chunk_bwd_dv_kernel(q, k, b, g, do, dh, dv, res, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                              V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                              BV: tl.constexpr, PREC: tl.constexpr, MINR: tl.constexpr, MAXR: tl.constexpr,
                              RES: tl.constexpr):
    """dv_j = Σ_{i ≥ j} A_ij do_i + (k_j ⊙ exp(b_L − b_j)) dh_{n+1}, one key block J at a time: the
    rows of J are exactly the rows of dv it finishes, so it stores them directly. RES: the first V tile's program
    also writes b's residual from g (cumsum.residual_tile) where the chunk's decay exceeds MAXR, as
    cumsum.chunk_residual would, for the dq, dk kernel launched after it."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    decay = chunk_decay(b, i_b, i_h, i_t, T, H, K, BT, BK)
    if RES:
        if (i_v == 0) & (decay > MAXR):
            for i_k in range(tl.cdiv(K, BK)):
                residual_tile(g, b, res, i_b, i_h, i_t, i_k, T, H, K, BT, BK)
    if decay > MINR:   # every chunk at MINR < 0
        o_c = tl.arange(0, BT)
        o_t = i_t * BT + o_c
        m_t = o_t < T
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        chunk_last = tl.minimum(i_t * BT + BT, T) - 1
        b_do = load_rows(do, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V)
        o_s = tl.arange(0, BC)
        for i_j in range(BT // BC):
            j0 = i_t * BT + i_j * BC
            if j0 < T:
                o_j = j0 + o_s
                m_j = o_j < T
                last = tl.minimum(j0 + BC, T) - 1
                below = (o_c >= (i_j + 1) * BC) & m_t
                b_st = tl.zeros([BC, BT], dtype=tl.float32)                # A[below rows, J]ᵀ, unscaled
                b_dv = tl.zeros([BC, BV], dtype=tl.float32)
                for i_k in range(tl.cdiv(K, BK)):
                    o_k = i_k * BK + tl.arange(0, BK)
                    m_k = o_k < K
                    b_k = load_rows(k, i_b, i_h, o_j, m_j, o_k, m_k, T, H, K)
                    b_bj = load_rows(b, i_b, i_h, o_j, m_j, o_k, m_k, T, H, K)
                    b_bl = tl.load(b + row_offsets(i_b, i_h, last, T, H, K) + o_k, mask=m_k, other=0.0)
                    b_qt = load_rows_t(q, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K).to(tl.float32)  # [BK, BT]
                    b_bqt = load_rows_t(b, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)
                    b_kg = b_k.to(tl.float32) * tl.exp(tl.where(m_j[:, None], b_bl[None, :] - b_bj, float("-inf")))
                    b_qgt = b_qt * tl.exp(tl.where(below[None, :], b_bqt - b_bl[:, None], float("-inf")))
                    b_st += tl.dot(b_kg, b_qgt, input_precision=PREC)
                    b_bL = tl.load(b + row_offsets(i_b, i_h, chunk_last, T, H, K) + o_k, mask=m_k, other=0.0)
                    b_kd = b_k * tl.exp(tl.where(m_j[:, None], b_bL[None, :] - b_bj, 0.0))
                    b_dh = tl.load(dh + row_offsets(i_b, i_h, i_t, NT, H, K * V) + o_k[:, None] * V + o_v[None, :],
                                   mask=m_k[:, None] & m_v[None, :], other=0.0)
                    b_dv += tl.dot(b_kd.to(b_do.dtype), b_dh.to(b_do.dtype), input_precision=PREC)
                b_dv += tl.dot((b_st * scale).to(b_do.dtype), b_do, input_precision=PREC)
                b_d = diag_scores(q, k, b, i_b, i_h, j0, T, H, K, BC, BK)                          # inside J
                b_doj = load_rows(do, i_b, i_h, o_j, m_j, o_v, m_v, T, H, V)
                b_dv += tl.dot(tl.trans((b_d * scale).to(b_doj.dtype)), b_doj, input_precision=PREC)
                store_rows(dv, b_dv, i_b, i_h, o_j, m_j, o_v, m_v, T, H, V)


@triton.jit
def _col(x, j, BC: tl.constexpr):
    """Column j of a [BC, BC] register tile, as a [BC] vector (Triton tiles cannot be indexed)."""
    return tl.sum(tl.where(tl.arange(0, BC)[None, :] == j, x, 0.0), axis=1)


@triton.jit
def _row(x, j, BC: tl.constexpr):
    return tl.sum(tl.where(tl.arange(0, BC)[:, None] == j, x, 0.0), axis=0)


@triton.jit
def fused_chunk_bwd_dqk_kernel(q, k, v, b, res, h, do, dh, dq, dk, db, scale, T, NT, H: tl.constexpr,
                               K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                               BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, MINR: tl.constexpr,
                               MAXR: tl.constexpr):
    """dq, dk, db for one K tile of one chunk: the intra-chunk terms from dA = do vᵀ, formed here one
    key block J at a time ([BT, BC], all V tiles summed) and factorised around J's last row ℓ as in
    the forward, then the state terms (output._state_grads, as chunk_bwd_dqkb). Each key
    block's contributions reach the chunk-wide accumulators through 0/1 selection dots. The diagonal pairs
    i = j, and the last row's state term of dk, are left out of the dq, dk that db is formed from and added
    after it (ops/chunkwise/output.py). Every exponent b_i − b_j adds r_i − r_j (res: b's residual,
    ops/chunkwise/cumsum.py), read where the tile's decay exceeds MAXR (in training, every chunk these kernels
    take: they are the strongly decaying ones)."""
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    if chunk_decay(b, i_b, i_h, i_t, T, H, K, BT, BK) > MINR:   # every chunk at MINR < 0
        o_c = tl.arange(0, BT)
        o_t = i_t * BT + o_c
        m_t = o_t < T
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        chunk_last = tl.minimum(i_t * BT + BT, T) - 1
        b_bL = tl.load(b + row_offsets(i_b, i_h, chunk_last, T, H, K) + o_k, mask=m_k, other=0.0)
        m_c = residual_mask(m_k, b_bL, MAXR)
        b_q = load_rows(q, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K).to(tl.float32)
        b_k = load_rows(k, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K).to(tl.float32)
        b_b = load_rows(b, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)
        c_b = load_rows(res, i_b, i_h, o_t, m_t, o_k, m_c, T, H, K)
        b_dq = tl.zeros([BT, BK], dtype=tl.float32)             # intra-chunk, unscaled
        b_dk = tl.zeros([BT, BK], dtype=tl.float32)
        o_s = tl.arange(0, BC)
        for i_j in range(BT // BC):
            j0 = i_t * BT + i_j * BC
            if j0 < T:
                o_j = j0 + o_s
                m_j = o_j < T
                last = tl.minimum(j0 + BC, T) - 1
                below = (o_c >= (i_j + 1) * BC) & m_t
                b_dA = tl.zeros([BT, BC], dtype=tl.float32)     # do vᵀ, column block J
                b_dAd = tl.zeros([BC, BC], dtype=tl.float32)    # its rows inside J
                for i_v in range(tl.cdiv(V, BV)):
                    o_v = i_v * BV + tl.arange(0, BV)
                    m_v = o_v < V
                    b_vt = load_rows_t(v, i_b, i_h, o_j, m_j, o_v, m_v, T, H, V)                   # [BV, BC]
                    b_dA += tl.dot(load_rows(do, i_b, i_h, o_t, m_t, o_v, m_v, T, H, V), b_vt, input_precision=PREC)
                    b_dAd += tl.dot(load_rows(do, i_b, i_h, o_j, m_j, o_v, m_v, T, H, V), b_vt, input_precision=PREC)
                b_dA = tl.where(below[:, None], b_dA, 0.0)
                b_dAd = tl.where((o_s[:, None] > o_s[None, :]) & m_j[:, None], b_dAd, 0.0)      # off the diagonal
                b_kj = load_rows(k, i_b, i_h, o_j, m_j, o_k, m_k, T, H, K).to(tl.float32)
                b_bj = load_rows(b, i_b, i_h, o_j, m_j, o_k, m_k, T, H, K)
                c_j = load_rows(res, i_b, i_h, o_j, m_j, o_k, m_c, T, H, K)
                b_bl = tl.load(b + row_offsets(i_b, i_h, last, T, H, K) + o_k, mask=m_k, other=0.0)
                c_l = tl.load(res + row_offsets(i_b, i_h, last, T, H, K) + o_k, mask=m_c, other=0.0)
                e_j = tl.exp(tl.where(m_j[:, None], (b_bl[None, :] - b_bj) + (c_l[None, :] - c_j), float("-inf")))
                e_i = tl.exp(tl.where(below[:, None], (b_b - b_bl[None, :]) + (c_b - c_l[None, :]), float("-inf")))
                b_dq += e_i * tl.dot(b_dA, b_kj * e_j, input_precision=PREC)
                b_dkj = e_j * tl.dot(tl.trans(b_dA), b_q * e_i, input_precision=PREC)                 # [BC, BK]
                b_dqj = tl.zeros([BC, BK], dtype=tl.float32)
                for j in range(BC):                             # inside J but off its diagonal, as chunk_intra_bwd
                    t_j = j0 + j
                    m_jk = m_k & ((o_k * 0 + t_j) < T)
                    b_kr = tl.load(k + row_offsets(i_b, i_h, t_j, T, H, K) + o_k, mask=m_jk, other=0.0).to(tl.float32)
                    b_qr = tl.load(q + row_offsets(i_b, i_h, t_j, T, H, K) + o_k, mask=m_jk, other=0.0).to(tl.float32)
                    b_br = tl.load(b + row_offsets(i_b, i_h, t_j, T, H, K) + o_k, mask=m_jk, other=0.0)
                    c_r = tl.load(res + row_offsets(i_b, i_h, t_j, T, H, K) + o_k, mask=m_jk & m_c, other=0.0)
                    d = (b_bj - b_br[None, :]) + (c_j - c_r[None, :])
                    live = (o_s * 0 + t_j) < T
                    e_col = tl.exp(tl.where((o_s > j)[:, None] & m_j[:, None], d, float("-inf")))
                    e_row = tl.exp(tl.where((o_s < j)[:, None] & m_j[:, None] & live[:, None], -d, float("-inf")))
                    b_dqj += _col(b_dAd, j, BC)[:, None] * b_kr[None, :] * e_col
                    b_dkj += _row(b_dAd, j, BC)[:, None] * b_qr[None, :] * e_row
                select = tl.where(o_c[:, None] == (i_j * BC + o_s)[None, :], 1.0, 0.0)               # [BT, BC]
                b_dq += tl.dot(select, b_dqj, input_precision="ieee")
                b_dk += tl.dot(select, b_dkj, input_precision="ieee")
        # the state terms, as chunk_bwd_dqkb forms them; after the key-block loop, so their two [BT, BK]
        # accumulators are not live through it
        b_dq_in, b_dk_in, b_hdh, b_diag = state_grads(v, h, dh, do, i_b, i_h, i_t, o_t, m_t, o_k, m_k, T, NT, H, K,
                                                      V, BT, BK, BV, PREC)
        c_L = tl.load(res + row_offsets(i_b, i_h, chunk_last, T, H, K) + o_k, mask=m_c, other=0.0)
        b_dk_in *= tl.exp(tl.where(m_t[:, None], (b_bL[None, :] - b_b) + (c_L[None, :] - c_b), 0.0))
        is_last = (o_t == chunk_last)[:, None]
        b_dkl = tl.where(is_last, b_dk_in, 0.0)               # the last row's state pair: only after db (output.py)
        b_dk_in -= b_dkl
        b_dq = (b_dq + b_dq_in * tl.exp(b_b)) * scale
        b_dk = b_dk * scale + b_dk_in
        tail = b_hdh * tl.exp(b_bL) + tl.sum(b_k * b_dk_in, axis=0)     # the chunk's last row's extra terms
        p = row_offsets(i_b, i_h, o_t[:, None], T, H, K) + o_k[None, :]
        b_db = b_q * b_dq - b_k * b_dk + tl.where(is_last, tail[None, :], 0.0)
        tl.store(db + p, b_db, mask=m_tk)
        b_diag = (b_diag * scale)[:, None]                    # the diagonal pairs, only after db (output.py)
        tl.store(dq + p, (b_dq + b_diag * b_k).to(dq.dtype.element_ty), mask=m_tk)
        tl.store(dk + p, (b_dk + b_dkl + b_diag * b_q).to(dk.dtype.element_ty), mask=m_tk)


def fused_chunk_bwd_dv(q, k, b, do, dh, scale: float, chunk_size: int, sub_chunk: int = 16, min_range: float = -1.0,
                       out: torch.Tensor | None = None, g: torch.Tensor | None = None, res: torch.Tensor | None = None,
                       **launch) -> torch.Tensor:
    """dv [B, T, H, V] in do's dtype; dh [B, NT, H, K, V]: the gradient leaving each chunk
    (state.chunk_bwd_dh). Equal to output.chunk_bwd_dv(k, b, chunk_intra_fwd(q, k, b), do, dh).
    min_range ≥ 0: only the chunks whose decay −b_L exceeds it, written into `out` (scan_bwd.py).
    g, res: the log-decays b was summed from, and a [B, T, H, K] fp32 tensor that receives b's residual as
    cumsum.chunk_residual(g, b, chunk_size) forms it (every chunk whose decay exceeds RESIDUAL_FROM, whatever
    min_range), saving that launch.
    Tiles: the chunk stages' (≤ 64; movement.fused_bwd_plan counts what larger ones would save);
    launch may override BK, BV, num_warps, num_stages."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    BC, BK, BV = min(sub_chunk, chunk_size), launch.pop("BK", tile(K)), launch.pop("BV", tile(V))
    dv = torch.empty_like(do) if out is None else out
    grid = (cdiv(V, BV), cdiv(T, chunk_size), B * H)
    if (g is None) != (res is None):
        raise ValueError("fused_chunk_bwd_dv: pass g and res together (res receives b's residual formed from g)")
    g, res_out = (b, b) if res is None else (g.contiguous(), res)        # b stands in where RES is off
    fused_chunk_bwd_dv_kernel[grid](q, k, b, g, do, dh, dv, res_out, scale, T, dh.shape[1], H, K, V, chunk_size, BC,
                                    BK, BV, dot_precision(do), float(min_range), RESIDUAL_FROM, res is not None,
                                    **launch)
    return dv


def fused_chunk_bwd_dqk(q, k, v, b, res, h, do, dh, scale: float, chunk_size: int, sub_chunk: int = 16,
                        min_range: float = -1.0, out: tuple | None = None,
                        **launch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk (input dtypes) and db [B, T, H, K] fp32, as output.chunk_bwd_dqkb given the intra-chunk
    gradients of chunk_intra_bwd(q, k, b, res, chunk_bwd_dA(do, v)): the three stages in one launch.
    res: b's residual (ops/chunkwise/cumsum.chunk_residual).
    min_range and out as fused_chunk_bwd_dv's (out: dq, dk, db)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BC, BK, BV = min(sub_chunk, chunk_size), launch.pop("BK", tile(K)), launch.pop("BV", tile(V))
    dq, dk, db = out or (torch.empty_like(q), torch.empty_like(k),
                         torch.empty(B, T, H, K, dtype=torch.float32, device=q.device))
    grid = (cdiv(K, BK), cdiv(T, chunk_size), B * H)
    # num_stages=1 by default: output.chunk_bwd_dA's do vᵀ loop over V tiles miscompiled on the H100
    # when software-pipelined (bf16, ≥ 3 V tiles); this kernel runs the same loop.
    fused_chunk_bwd_dqk_kernel[grid](q, k, v, b, res, h, do, dh, dq, dk, db, scale, T, dh.shape[1], H, K, V, chunk_size,
                                     BC, BK, BV, dot_precision(do), float(min_range), RESIDUAL_FROM,
                                     **(dict(num_stages=1) | launch))
    return dq, dk, db
