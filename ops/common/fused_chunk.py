"""The fused output kernel of issue [F] (per-key-dim decay, GLA), forward: one launch per
(V tile, chunk) forms the intra-chunk scores in registers and writes o, where `chunk` writes A
[B, T, H, C] to HBM in one kernel and reads it back in the next.

    o_i = scale (q_i ⊙ exp(b_i)) h_n  +  Σ_{j ≤ i in the chunk} S̃_ij v_j,
    S̃_ij = scale Σ_d q_id k_jd exp(b_id − b_jd)

S̃ is built one key block J (BC rows) at a time, never with a positive exponent:
- rows below block J (i > last row ℓ of J): factorised around ℓ, q_i ⊙ exp(b_i − b_ℓ) against
  k_j ⊙ exp(b_ℓ − b_j); both factors ≤ 1 since b is non-increasing. One [C, BC] dot per K tile
  covers every such row, where chunk_intra.py factorises per (row block, key block) pair.
- inside block J (j ≤ i, both in J): chunk_intra.py's elementwise _diag_scores, then moved to
  the block's rows of o through a [C, BC] 0/1 selection matrix (a tensor-core dot; Triton cannot
  assign into a slice of a tile).
Not yet a backend: it needs the H100 checks of ../shared/GPU.md (tests/ops/test_fused_chunk.py runs
it under the interpreter against chunk_intra_fwd + chunk_fwd_o, which are tested against naive).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.common.chunk_intra import _diag_scores, _load_rows, _load_rows_t
from ops.common.tiles import dot_precision, tile


@triton.jit
def fused_chunk_fwd_kernel(q, k, v, b, h, o, scale, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                           BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           PREC: tl.constexpr):
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    m_t = o_t < T
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):                                  # the incoming state's share
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = _load_rows(q, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)
        b_qd = b_q * tl.exp(_load_rows(b, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)) * scale
        b_h = tl.load(h + ((i_b * NT + i_t) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_o += tl.dot(b_qd.to(b_q.dtype), b_h.to(b_q.dtype), input_precision=PREC)
    o_s = tl.arange(0, BC)
    for i_j in range(BT // BC):
        j0 = i_t * BT + i_j * BC
        if j0 < T:
            o_j = j0 + o_s
            m_j = o_j < T
            last = tl.minimum(j0 + BC, T) - 1                          # ℓ: block J's last valid row
            b_vj = _load_rows(v, i_b, i_h, o_j, m_j, o_v, m_v, T, H, V)
            b_s = tl.zeros([BT, BC], dtype=tl.float32)                 # rows below J
            below = (o_c >= (i_j + 1) * BC) & m_t
            for i_k in range(tl.cdiv(K, BK)):
                o_k = i_k * BK + tl.arange(0, BK)
                m_k = o_k < K
                b_q = _load_rows(q, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K).to(tl.float32)
                b_bq = _load_rows(b, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)
                b_bl = tl.load(b + ((i_b * T + last) * H + i_h) * K + o_k, mask=m_k, other=0.0)
                b_kt = _load_rows_t(k, i_b, i_h, o_j, m_j, o_k, m_k, T, H, K).to(tl.float32)     # [BK, BC]
                b_bjt = _load_rows_t(b, i_b, i_h, o_j, m_j, o_k, m_k, T, H, K)
                b_qg = b_q * tl.exp(tl.where(below[:, None], b_bq - b_bl[None, :], float("-inf")))
                b_kg = b_kt * tl.exp(tl.where(m_j[None, :], b_bl[:, None] - b_bjt, float("-inf")))
                b_s += tl.dot(b_qg, b_kg, input_precision=PREC)
            b_d = _diag_scores(q, k, b, i_b, i_h, j0, T, H, K, BC, BK)                         # inside J
            b_o += tl.dot((b_s * scale).to(b_vj.dtype), b_vj, input_precision=PREC)
            b_dv = tl.dot((b_d * scale).to(b_vj.dtype), b_vj, input_precision=PREC)                 # [BC, BV]
            select = tl.where(o_c[:, None] == (i_j * BC + o_s)[None, :], 1.0, 0.0)               # [BT, BC]
            b_o += tl.dot(select, b_dv, input_precision="ieee")
    tl.store(o + ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])


def fused_chunk_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, h: torch.Tensor,
                    scale: float, chunk_size: int, sub_chunk: int = 16, **launch) -> torch.Tensor:
    """q, k, b: [B, T, H, K] (b fp32, the chunk-local cumsum of the log-decay, per key dim);
    v: [B, T, H, V]; h: [B, NT, H, K, V] the state entering each chunk (chunk_h.chunk_fwd_h).
    Returns o [B, T, H, V] in v's dtype, equal to chunk_fwd_o(q, v, b, h, chunk_intra_fwd(q, k, b))."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if b.shape[-1] != K:
        raise ValueError(f"fused_chunk_fwd takes a per-key-dim decay [B, T, H, {K}]; a scalar decay already "
                         "forms A inside chunk_o.chunk_fwd_o_scalar")
    BC, BK, BV = min(sub_chunk, chunk_size), tile(K), tile(V)
    o = torch.empty_like(v)
    grid = (triton.cdiv(V, BV), triton.cdiv(T, chunk_size), B * H)
    fused_chunk_fwd_kernel[grid](q, k, v, b, h, o, scale, T, h.shape[1], H, K, V, chunk_size, BC, BK, BV,
                                 dot_precision(v), **launch)
    return o
