"""The intra-chunk scores of the fused GLA forward where it runs chunk's parallel stages (K = 256, one long
sequence; ops.gla.fused.scan_forward): A as ops/chunkwise/intra.py defines it, in one program per chunk instead of
one per 16-row block pair.

A tame chunk (−b_L ≤ max_range for every key dim, scan.MAX_RANGE) takes the scan's factorisation:

    A = mask(q̃ k̃ᵀ),   q̃ = scale · q ⊙ exp(b − b_L),   k̃ = k ⊙ exp(b_L − b)

one [C, BK]·[BK, C] dot per key tile, with both operands in bf16 hi/lo parts (scan.dot_split).
ops/chunkwise/intra.py forms each diagonal 16 × 16 block elementwise over K instead, [16, 16, BK] exponentials and
products per column; at K = 256 that makes its kernel the forward's slowest stage. A wild chunk (the tests'
−50 per step) takes intra.py's exact sub-block helpers in the same program, so no decay overflows.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.chunkwise.intra import diag_scores, offdiag_scores
from ops.chunkwise.cumsum import chunk_decay
from ops.gla.scan import MAX_RANGE, dot_split, load_chunk_keys
from ops.triton_utils import cdiv, dot_precision, row_offsets, tile


@triton.jit
def fused_intra_fwd_kernel(q, k, b, A, scale, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                           BC: tl.constexpr, BK: tl.constexpr, MAXR: tl.constexpr, PREC: tl.constexpr,
                           SPLIT: tl.constexpr):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    m_t = o_t < T
    if chunk_decay(b, i_b, i_h, i_t, T, H, K, BT, BK) <= MAXR:
        last = tl.minimum(i_t * BT + BT, T) - 1
        b_A = tl.zeros([BT, BT], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            m_tk = m_t[:, None] & m_k[None, :]
            p_tk = row_offsets(i_b, i_h, o_t[:, None], T, H, K) + o_k[None, :]
            b_q, b_k, b_b, b_bl = load_chunk_keys(q, k, b, p_tk, m_tk, row_offsets(i_b, i_h, last, T, H, K) + o_k, m_k)
            b_A += dot_split(b_q * tl.exp(b_b - b_bl[None, :]), tl.trans(b_k * tl.exp(b_bl[None, :] - b_b)), b_q,
                             PREC, SPLIT)
        b_A = tl.where(o_c[:, None] >= o_c[None, :], b_A * scale, 0.0)
        tl.store(A + row_offsets(i_b, i_h, o_t[:, None], T, H, BT) + o_c[None, :], b_A.to(A.dtype.element_ty),
                 mask=m_t[:, None])
    else:
        NC: tl.constexpr = BT // BC
        o_s = tl.arange(0, BC)
        for i_i in range(NC):
            t_i = i_t * BT + i_i * BC
            m_i = (t_i + o_s) < T
            for i_j in range(NC):
                if i_j < i_i:
                    b_blk = offdiag_scores(q, k, b, i_b, i_h, t_i, i_t * BT + i_j * BC, T, H, K, BC, BK, PREC)
                elif i_j == i_i:
                    b_blk = diag_scores(q, k, b, i_b, i_h, t_i, T, H, K, BC, BK)
                else:
                    b_blk = tl.zeros([BC, BC], dtype=tl.float32)
                tl.store(A + row_offsets(i_b, i_h, t_i + o_s[:, None], T, H, BT) + (i_j * BC + o_s)[None, :],
                         (b_blk * scale).to(A.dtype.element_ty), mask=m_i[:, None])


def fused_intra_fwd(q: torch.Tensor, k: torch.Tensor, b: torch.Tensor, scale: float, chunk_size: int,
                    max_range: float = MAX_RANGE, **launch) -> torch.Tensor:
    """q, k: [B, T, H, K]; b: [B, T, H, K] fp32 (chunk-local cumsum) → A [B, T, H, C] in q's dtype, scale
    included, as intra.chunk_intra_fwd returns it. max_range < 0 takes the exact path in every chunk
    (tests); launch may override BK, num_warps, num_stages and SPLIT (one bf16 dot instead of three)."""
    B, T, H, K = q.shape
    if b.shape[-1] != K:
        raise ValueError(f"fused_intra_fwd takes a per-key decay b [B, T, H, {K}], got {tuple(b.shape)}")
    q, k, b = (x.contiguous() for x in (q, k, b))                # free where they already are
    BK = launch.pop("BK", tile(K))
    split = launch.pop("SPLIT", q.dtype != torch.float32)
    # the [C, C] fp32 scores and two [C, BK] operands in registers: 8 warps from C = 128
    launch = dict(num_warps=4 if chunk_size <= 64 else 8, num_stages=2) | launch
    A = torch.empty(B, T, H, chunk_size, dtype=q.dtype, device=q.device)
    fused_intra_fwd_kernel[(cdiv(T, chunk_size), B * H)](q, k, b, A, scale, T, H, K, chunk_size,
                                                                min(16, chunk_size), BK, float(max_range),
                                                                dot_precision(q), split, **launch)
    return A
