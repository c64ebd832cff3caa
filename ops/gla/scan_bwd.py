"""The backward of scan.py, one program per chunk and tile: dq, dk, dv and db from the same factorised
scores as the forward, recomputed rather than stored, with dA = do vᵀ formed in registers. With
q̃ = scale · q ⊙ exp(b − b_L), k̃ = k ⊙ exp(b_L − b), A = mask(q̃ k̃ᵀ) and h, dh the states entering and
the gradient leaving the chunk:

    dv = Aᵀ do + k̃ dh                 dq' = scale · exp(b − b_L) ⊙ (dA' k̃) + scale · exp(b) ⊙ (do hᵀ)
    dk' = exp(b_L − b) ⊙ (dA'ᵀ q̃ + v dhᵀ)          dA' = dA strictly below its diagonal
    db = q ⊙ dq' − k ⊙ dk', plus at the last row L exp(b_L) ⊙ Σ_v h ⊙ dh + Σ_{rows < L} k ⊙ exp(b_L − b) ⊙ (v dhᵀ)
    dq = dq' + scale · dA_tt k_t,      dk = dk' + scale · dA_tt q_t

(b_L cancels out of A, so only the state update adds to the last row.) The diagonal pairs t = t enter
q ⊙ dq and k ⊙ dk equally and cancel in db; at strong decay they are nearly all of either, so db is
formed without them and they are added to the returned dq, dk only; so is row L's state term in dk' (its key
and the state leaving the chunk, undecayed: ops/chunkwise/output.py says more). Aᵀ and dAᵀ are dots of their
own rather than tl.trans of an accumulator: Triton < 3.7.1 miscompiles that on Hopper.

dq, dk and db need only their own key columns of q̃ and k̃ (and dA, summed over all of V); dv needs Aᵀ,
summed over all of K. So one kernel per (K tile, chunk) forms dq, dk, db, and where K fits one tile it
also forms dv (WITH_DV, one launch in all); else a second kernel per (V tile, chunk) forms dv.

A chunk whose decay exceeds scan.MAX_RANGE is left to sub_block_bwd.py's kernels,
launched after this one with the same threshold so that they do exactly the chunks this one skips.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.chunkwise.cumsum import chunk_decay
from ops.gla.sub_block_bwd import fused_chunk_bwd_dqk, fused_chunk_bwd_dv
from ops.gla.scan import MAX_RANGE, dot_split, load_chunk_keys
from ops.gla.movement import bwd_key_tile
from ops.triton_utils import cdiv, dot_precision, next_power_of_2, row_offsets


@triton.jit
def fused_scan_bwd_dqk_kernel(q, k, v, b, h, do, dh, dq, dk, dv, db, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                              V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                              MAXR: tl.constexpr, WITH_DV: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr):
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    if chunk_decay(b, i_b, i_h, i_t, T, H, K, BT, BK) <= MAXR:
        o_c = tl.arange(0, BT)
        o_t = i_t * BT + o_c
        m_t = o_t < T
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        last = tl.minimum(i_t * BT + BT, T) - 1
        p_tk = row_offsets(i_b, i_h, o_t[:, None], T, H, K) + o_k[None, :]
        b_q, b_k, b_b, b_bl = load_chunk_keys(q, k, b, p_tk, m_tk, row_offsets(i_b, i_h, last, T, H, K) + o_k, m_k)
        e_q = tl.exp(b_b - b_bl[None, :])                            # ≤ exp(MAXR)
        e_k = tl.exp(b_bl[None, :] - b_b)                            # ≤ 1
        b_kd = (b_k * e_k).to(b_k.dtype)
        upper = o_c[:, None] <= o_c[None, :]
        if WITH_DV:                                                  # Aᵀ over all of K: this tile
            b_At = tl.where(upper, dot_split(b_k * e_k, tl.trans(b_q * e_q * scale), b_q, PREC, SPLIT), 0.0)
        b_dA = tl.zeros([BT, BT], dtype=tl.float32)
        b_dAt = tl.zeros([BT, BT], dtype=tl.float32)
        b_dqs = tl.zeros([BT, BK], dtype=tl.float32)                # do hᵀ
        b_dks = tl.zeros([BT, BK], dtype=tl.float32)                # v dhᵀ
        b_hdh = tl.zeros([BK], dtype=tl.float32)
        p_kv = row_offsets(i_b, i_h, i_t, NT, H, K * V)
        for i_v in range(tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < V
            m_tv = m_t[:, None] & m_v[None, :]
            p_tv = row_offsets(i_b, i_h, o_t[:, None], T, H, V) + o_v[None, :]
            m_kv = m_k[:, None] & m_v[None, :]
            b_v = tl.load(v + p_tv, mask=m_tv, other=0.0)
            b_do = tl.load(do + p_tv, mask=m_tv, other=0.0)
            b_hn = tl.load(h + p_kv + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
            b_dhn = tl.load(dh + p_kv + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
            if WITH_DV:
                b_dv = tl.dot(b_At.to(b_do.dtype), b_do, input_precision=PREC)
                b_dv += tl.dot(b_kd, b_dhn.to(b_kd.dtype), input_precision=PREC)
                tl.store(dv + p_tv, b_dv.to(dv.dtype.element_ty), mask=m_tv)
            b_dA += tl.dot(b_do, tl.trans(b_v), input_precision=PREC)
            b_dAt += tl.dot(b_v, tl.trans(b_do), input_precision=PREC)
            b_dqs += tl.dot(b_do, tl.trans(b_hn.to(b_do.dtype)), input_precision=PREC)
            b_dks += tl.dot(b_v, tl.trans(b_dhn.to(b_v.dtype)), input_precision=PREC)
            b_hdh += tl.sum(b_hn.to(tl.float32) * b_dhn.to(tl.float32), axis=1)
        # the diagonal pairs (module docstring): dA_tt read off the tile, the dots below strictly off-diagonal
        b_diag = tl.sum(tl.where(o_c[:, None] == o_c[None, :], b_dA, 0.0), axis=1) * scale
        b_dA = tl.where(o_c[:, None] > o_c[None, :], b_dA, 0.0)
        b_dAt = tl.where(o_c[:, None] < o_c[None, :], b_dAt, 0.0)
        b_dq = (dot_split(b_dA, b_k * e_k, b_q, PREC, SPLIT) * e_q + b_dqs * tl.exp(b_b)) * scale
        is_last = (o_t == last)[:, None]
        b_dks = b_dks * e_k
        b_dkl = tl.where(is_last, b_dks, 0.0)                       # the last row's state pair, added after db
        b_dks -= b_dkl
        b_dk = dot_split(b_dAt, b_q * e_q * scale, b_q, PREC, SPLIT) * e_k + b_dks
        tail = b_hdh * tl.exp(b_bl) + tl.sum(b_k.to(tl.float32) * b_dks, axis=0)
        b_db = b_q * b_dq - b_k * b_dk + tl.where(is_last, tail[None, :], 0.0)
        b_dk += b_dkl
        tl.store(db + p_tk, b_db, mask=m_tk)
        tl.store(dq + p_tk, (b_dq + b_diag[:, None] * b_k).to(dq.dtype.element_ty), mask=m_tk)
        tl.store(dk + p_tk, (b_dk + b_diag[:, None] * b_q).to(dk.dtype.element_ty), mask=m_tk)


@triton.jit
def fused_scan_bwd_dv_kernel(q, k, b, do, dh, dv, scale, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                             BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, MAXR: tl.constexpr,
                             PREC: tl.constexpr, SPLIT: tl.constexpr):
    """dv = Aᵀ do + k̃ dh for one V tile of one chunk, Aᵀ and k̃ dh summed over the K tiles."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    if chunk_decay(b, i_b, i_h, i_t, T, H, K, BT, BK) <= MAXR:
        o_c = tl.arange(0, BT)
        o_t = i_t * BT + o_c
        m_t = o_t < T
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_tv = m_t[:, None] & m_v[None, :]
        last = tl.minimum(i_t * BT + BT, T) - 1
        p_kv = row_offsets(i_b, i_h, i_t, NT, H, K * V)
        b_At = tl.zeros([BT, BT], dtype=tl.float32)
        b_dv = tl.zeros([BT, BV], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            m_tk = m_t[:, None] & m_k[None, :]
            p_tk = row_offsets(i_b, i_h, o_t[:, None], T, H, K) + o_k[None, :]
            b_q, b_k, b_b, b_bl = load_chunk_keys(q, k, b, p_tk, m_tk, row_offsets(i_b, i_h, last, T, H, K) + o_k, m_k)
            b_kd = b_k * tl.exp(b_bl[None, :] - b_b)
            b_At += dot_split(b_kd, tl.trans(b_q * tl.exp(b_b - b_bl[None, :]) * scale), b_q, PREC, SPLIT)
            b_dhn = tl.load(dh + p_kv + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
            b_dv += tl.dot(b_kd.to(b_k.dtype), b_dhn.to(b_k.dtype), input_precision=PREC)
        b_At = tl.where(o_c[:, None] <= o_c[None, :], b_At, 0.0)
        p_tv = row_offsets(i_b, i_h, o_t[:, None], T, H, V) + o_v[None, :]
        b_do = tl.load(do + p_tv, mask=m_tv, other=0.0)
        b_dv += tl.dot(b_At.to(b_do.dtype), b_do, input_precision=PREC)
        tl.store(dv + p_tv, b_dv.to(dv.dtype.element_ty), mask=m_tv)


def fused_scan_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, g: torch.Tensor,
                   h: torch.Tensor, do: torch.Tensor, dh: torch.Tensor, scale: float, chunk_size: int,
                   max_range: float = MAX_RANGE, **launch) -> tuple[torch.Tensor, ...]:
    """q, k: [B, T, H, K]; v, do: [B, T, H, V]; b: [B, T, H, K] fp32 and h [B, NT, H, K, V] as
    fused_scan_fwd saves them; g: the log-decays b was summed from, whose residual (ops/chunkwise/cumsum.py) the
    sub-block dv kernel forms for the sub-block dq, dk kernel, the only reader (in a factorised chunk
    |b| ≤ max_range, where b's rounding stays near 1e-7 relative);
    dh [B, NT, H, K, V] the gradient leaving each chunk (ops/chunkwise/state.py's chunk_bwd_dh). Returns dq, dk, dv
    (input dtypes) and db [B, T, H, K] fp32, the gradient of b (the caller reverse-cumsums it into dg). launch may
    override BK, BV (the dq/dk kernel's), num_warps, num_stages (sweeps; both kernels)."""
    B, T, H, K = q.shape
    V, NT = v.shape[-1], h.shape[1]
    # the H100 sweeps' best (movement.bwd_key_tile). BV 32 with BK 64 and 4 warps hits an illegal memory access
    # on the H100 (Triton 3.6's 64-row Hopper miscompile); the defaults never run into it.
    BK = launch.pop("BK", bwd_key_tile(K))
    BV = launch.pop("BV", min(64, max(16, next_power_of_2(V))))
    with_dv = BK >= K
    # the dq, dk kernel on 8 warps where it also forms dv (K in one tile): it holds dA, dAᵀ, the state terms and
    # Aᵀ at once and spills at 4 (H100, B16 T2048 H12 K = V = 64: 0.94 of its time); at K = 128 (32-wide key
    # tiles, dv apart) 8 warps take 1.65× as long
    dqk_launch = dict(num_warps=8 if with_dv else 4, num_stages=2) | launch
    dv_launch = dict(num_warps=4, num_stages=2) | launch
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    db = torch.empty(B, T, H, K, dtype=torch.float32, device=q.device)
    args = (float(max_range), dot_precision(v), v.dtype != torch.float32)
    fused_scan_bwd_dqk_kernel[(cdiv(K, BK), NT, B * H)](q, k, v, b, h, do, dh, dq, dk, dv, db, scale, T, NT,
                                                               H, K, V, chunk_size, BK, BV, args[0], with_dv,
                                                               *args[1:], **dqk_launch)
    if not with_dv:
        fused_scan_bwd_dv_kernel[(cdiv(V, BV), NT, B * H)](q, k, b, do, dh, dv, scale, T, NT, H, K, V,
                                                                  chunk_size, BK, BV, *args, **dv_launch)
    # the chunks skipped above (decay beyond max_range), by the sub-block kernels; every other
    # program of theirs returns at once
    res = torch.empty_like(b)
    fused_chunk_bwd_dv(q, k, b, do, dh, scale, chunk_size, min_range=max_range, out=dv, g=g, res=res)
    fused_chunk_bwd_dqk(q, k, v, b, res, h, do, dh, scale, chunk_size, min_range=max_range, out=(dq, dk, db))
    return dq, dk, dv, db
