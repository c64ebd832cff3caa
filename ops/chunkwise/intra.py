"""Intra-chunk attention matrix and its backward, written to / read from HBM between kernels.

    A_ij = scale · Σ_d q_id k_jd exp(b_id − b_jd)   for j ≤ i in the same chunk, else 0
    dq_i = scale · Σ_{j<i} dA_ij k_j ⊙ exp(b_i − b_j),   dk_j = scale · Σ_{i>j} dA_ij q_i ⊙ exp(b_i − b_j)

The backward leaves out the diagonal pairs i = j (exp(0) = 1): output.py adds them, scale · dA_ii k_i
to dq_i and scale · dA_ii q_i to dk_i, only to the dq, dk it returns. The decay gradient
db = q ⊙ dq − k ⊙ dk is formed without them: a diagonal pair enters both terms equally, so it cancels
exactly, and at strong decay it is larger than the true db by up to exp(−g) per step (e^50), far past
what fp32 can subtract out. Every pair left carries at least one step of decay.

These kernels take a per-key-dim decay. A scalar one leaves the dot product, so each chunk is one masked GEMM,
formed inside output.py's kernels (chunk_fwd_o_scalar, chunk_bwd_dqkb) and never written here.
The chunk is split into BC-row sub-chunks. An off-diagonal block (I > J) is
a GEMM after factorising around r, the first row of block I: exp(b_i − b_r) ≤ 1 on the q side
and exp(b_r − b_j) ≤ 1 on the k side. A diagonal block is computed column by column,
elementwise. No exponent is ever positive, so no decay, however strong, overflows.
A is [B, T, H, C] in the inputs' dtype: row t holds its scores against the C positions of its chunk.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.chunkwise.cumsum import RESIDUAL_FROM, residual_launches, weak_chunk
from ops.triton_utils import cdiv, dot_precision, load_rows, load_rows_t, row_offsets, tile


@triton.jit
def diag_scores(q, k, b, i_b, i_h, t0, T, H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """A diagonal sub-block, unscaled, fp32 [BC, BC]: Σ_d q_id k_jd exp(b_id − b_jd) for rows
    i ≥ j of t0 + [0, BC), 0 elsewhere; elementwise, column by column, so no exponent is positive."""
    o_c = tl.arange(0, BC)
    o_i = t0 + o_c
    m_i = o_i < T
    b_A = tl.zeros([BC, BC], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = load_rows(q, i_b, i_h, o_i, m_i, o_k, m_k, T, H, K).to(tl.float32)
        b_bi = load_rows(b, i_b, i_h, o_i, m_i, o_k, m_k, T, H, K)
        for j in range(BC):
            t_j = t0 + j
            m_jk = m_k & ((o_k * 0 + t_j) < T)
            b_kj = tl.load(k + row_offsets(i_b, i_h, t_j, T, H, K) + o_k, mask=m_jk, other=0.0).to(tl.float32)
            b_bj = tl.load(b + row_offsets(i_b, i_h, t_j, T, H, K) + o_k, mask=m_jk, other=0.0)
            live = (o_c >= j)[:, None] & m_i[:, None]
            e = tl.exp(tl.where(live, b_bi - b_bj[None, :], float("-inf")))
            b_A += tl.where(o_c[None, :] == j, tl.sum(b_q * b_kj[None, :] * e, axis=1)[:, None], 0.0)
    return b_A


@triton.jit
def offdiag_scores(q, k, b, i_b, i_h, t_i, t_j, T, H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr,
                    BK: tl.constexpr, PREC: tl.constexpr):
    """An off-diagonal sub-block (rows t_i + [0, BC) after columns t_j + [0, BC)), unscaled, fp32 [BC, BC]:
    one GEMM after factorising around r = t_i, the first row of the row block, so both exponents are ≤ 0."""
    o_i = t_i + tl.arange(0, BC)
    o_j = t_j + tl.arange(0, BC)
    m_i, m_j = o_i < T, o_j < T
    b_A = tl.zeros([BC, BC], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = load_rows(q, i_b, i_h, o_i, m_i, o_k, m_k, T, H, K).to(tl.float32)
        b_kt = load_rows_t(k, i_b, i_h, o_j, m_j, o_k, m_k, T, H, K).to(tl.float32)     # [BK, BC]
        b_bi = load_rows(b, i_b, i_h, o_i, m_i, o_k, m_k, T, H, K)
        b_bjt = load_rows_t(b, i_b, i_h, o_j, m_j, o_k, m_k, T, H, K)
        b_br = tl.load(b + row_offsets(i_b, i_h, t_i, T, H, K) + o_k, mask=m_k, other=0.0)
        b_qg = b_q * tl.exp(tl.where(m_i[:, None], b_bi - b_br[None, :], 0.0))
        b_kgt = b_kt * tl.exp(b_br[:, None] - b_bjt)
        b_A += tl.dot(b_qg, b_kgt, input_precision=PREC)
    return b_A


@triton.jit
def chunk_intra_fwd_kernel(q, k, b, A, scale, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                           BC: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    i_t, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    NC: tl.constexpr = BT // BC
    i_i, i_j = i_c // NC, i_c % NC
    if i_t * BT + i_i * BC >= T:                                # sub-block wholly past the sequence
        return
    o_i = i_t * BT + i_i * BC + tl.arange(0, BC)
    m_i = o_i < T
    b_A = tl.zeros([BC, BC], dtype=tl.float32)
    if i_i >= i_j:
        if i_i > i_j:
            b_A = offdiag_scores(q, k, b, i_b, i_h, i_t * BT + i_i * BC, i_t * BT + i_j * BC, T, H, K, BC, BK, PREC)
        else:
            b_A = diag_scores(q, k, b, i_b, i_h, i_t * BT + i_i * BC, T, H, K, BC, BK)
    tl.store(A + row_offsets(i_b, i_h, o_i[:, None], T, H, BT) + (i_j * BC + tl.arange(0, BC))[None, :],
             (b_A * scale).to(A.dtype.element_ty), mask=m_i[:, None])


@triton.jit
def chunk_intra_bwd_kernel(q, k, b, res, dA, dq, dk, scale, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                           BC: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr, MAXR: tl.constexpr,
                           EXACT: tl.constexpr, REDO: tl.constexpr, HG: tl.constexpr = 1):
    """One program per (K tile, sub-chunk s, batch·head): dq for rows of s, dk for rows of s, the
    diagonal pairs left out (see the module docstring). EXACT adds r_i − r_j to every exponent b_i − b_j (res: b's
    residual, ops/chunkwise/cumsum.py). REDO returns at once from the chunks whose decay is at most MAXR, so that a
    launch without r over every chunk, then one with EXACT and REDO, costs the common path no test of the decay.
    HG: heads per q and k head (q, k [B, T, H / HG, K], head h reading their h // HG); dq, dk are per head."""
    i_kc, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    NC: tl.constexpr = BT // BC
    NK = tl.cdiv(K, BK)
    i_k, i_s = i_kc % NK, i_kc // NK
    if i_t * BT + i_s * BC >= T:                                # sub-block wholly past the sequence
        return
    if REDO:
        if weak_chunk(b, i_b, i_h, i_t, T, H, K, BT, BK, False, MAXR):
            return
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    o_s = i_t * BT + i_s * BC + tl.arange(0, BC)
    m_s = o_s < T
    b_dq = tl.zeros([BC, BK], dtype=tl.float32)
    b_dk = tl.zeros([BC, BK], dtype=tl.float32)
    o_c = tl.arange(0, BC)
    b_bs = load_rows(b, i_b, i_h, o_s, m_s, o_k, m_k, T, H, K)
    r_s = i_t * BT + i_s * BC                                          # first row of block s
    b_brs = tl.load(b + row_offsets(i_b, i_h, r_s, T, H, K) + o_k, mask=m_k, other=0.0)
    if EXACT:
        c_s = load_rows(res, i_b, i_h, o_s, m_s, o_k, m_k, T, H, K)
        c_rs = tl.load(res + row_offsets(i_b, i_h, r_s, T, H, K) + o_k, mask=m_k, other=0.0)
    for i_j in range(i_s):                                             # dq, off-diagonal J < s
        o_j = i_t * BT + i_j * BC + tl.arange(0, BC)
        b_k = load_rows(k, i_b, i_h // HG, o_j, o_j < T, o_k, m_k, T, H // HG, K).to(tl.float32)
        d = b_brs[None, :] - load_rows(b, i_b, i_h, o_j, o_j < T, o_k, m_k, T, H, K)
        if EXACT:
            d += c_rs[None, :] - load_rows(res, i_b, i_h, o_j, o_j < T, o_k, m_k, T, H, K)
        b_dA = tl.load(dA + row_offsets(i_b, i_h, o_s[:, None], T, H, BT) + (i_j * BC + o_c)[None, :],
                       mask=m_s[:, None], other=0.0)
        b_dq += tl.dot(b_dA, b_k * tl.exp(d), input_precision=PREC)
    d = b_bs - b_brs[None, :]
    if EXACT:
        d += c_s - c_rs[None, :]
    b_dq *= tl.exp(tl.where(m_s[:, None], d, 0.0))
    for i_i in range(i_s + 1, NC):                                     # dk, off-diagonal I > s
        o_i = i_t * BT + i_i * BC + tl.arange(0, BC)
        m_i = o_i < T
        r = i_t * BT + i_i * BC
        r_ok = (o_k * 0 + r) < T
        b_br = tl.load(b + row_offsets(i_b, i_h, r, T, H, K) + o_k, mask=m_k & r_ok, other=0.0)
        b_q = load_rows(q, i_b, i_h // HG, o_i, m_i, o_k, m_k, T, H // HG, K).to(tl.float32)
        d_i = load_rows(b, i_b, i_h, o_i, m_i, o_k, m_k, T, H, K) - b_br[None, :]     # q side, ≤ 0
        d_s = b_br[None, :] - b_bs                                                    # k side, ≤ 0
        if EXACT:
            c_r = tl.load(res + row_offsets(i_b, i_h, r, T, H, K) + o_k, mask=m_k & r_ok, other=0.0)
            d_i += load_rows(res, i_b, i_h, o_i, m_i, o_k, m_k, T, H, K) - c_r[None, :]
            d_s += c_r[None, :] - c_s
        b_dA = tl.load(dA + row_offsets(i_b, i_h, o_i[:, None], T, H, BT) + (i_s * BC + o_c)[None, :],
                       mask=m_i[:, None], other=0.0)
        b_qg = b_q * tl.exp(tl.where(m_i[:, None], d_i, 0.0))
        b_dk += tl.dot(tl.trans(b_dA), b_qg, input_precision=PREC) * \
            tl.exp(tl.where(m_s[:, None] & r_ok[None, :], d_s, float("-inf")))
    b_q = load_rows(q, i_b, i_h // HG, o_s, m_s, o_k, m_k, T, H // HG, K).to(tl.float32)
    for j in range(BC):                                # diagonal block, row by row, its diagonal left out
        t_j = i_t * BT + i_s * BC + j
        m_jk = m_k & ((o_k * 0 + t_j) < T)
        b_kj = tl.load(k + row_offsets(i_b, i_h // HG, t_j, T, H // HG, K) + o_k, mask=m_jk,
                       other=0.0).to(tl.float32)
        b_qj = tl.load(q + row_offsets(i_b, i_h // HG, t_j, T, H // HG, K) + o_k, mask=m_jk,
                       other=0.0).to(tl.float32)
        d = b_bs - tl.load(b + row_offsets(i_b, i_h, t_j, T, H, K) + o_k, mask=m_jk, other=0.0)[None, :]
        if EXACT:
            d += c_s - tl.load(res + row_offsets(i_b, i_h, t_j, T, H, K) + o_k, mask=m_jk, other=0.0)[None, :]
        # column j of dA (rows i > j of block s) → dq rows; row j of dA (cols < j) → dk rows
        dA_col = tl.load(dA + row_offsets(i_b, i_h, o_s, T, H, BT) + i_s * BC + j, mask=m_s, other=0.0)
        dA_row = tl.load(dA + row_offsets(i_b, i_h, t_j, T, H, BT) + i_s * BC + o_c, mask=(o_c * 0 + t_j) < T, other=0.0)
        e_col = tl.exp(tl.where((o_c > j)[:, None] & m_s[:, None], d, float("-inf")))
        e_row = tl.exp(tl.where((o_c < j)[:, None] & m_s[:, None] & ((o_c * 0 + t_j) < T)[:, None], -d,
                                float("-inf")))
        b_dq += dA_col[:, None] * b_kj[None, :] * e_col
        b_dk += dA_row[:, None] * b_qj[None, :] * e_row
    p = row_offsets(i_b, i_h, o_s[:, None], T, H, K) + o_k[None, :]
    m = m_s[:, None] & m_k[None, :]
    tl.store(dq + p, b_dq * scale, mask=m)
    tl.store(dk + p, b_dk * scale, mask=m)


def chunk_intra_fwd(q, k, b, scale: float, chunk_size: int, sub_chunk: int = 16, **launch) -> torch.Tensor:
    """q, k: [B, T, H, K]; b: [B, T, H, K] fp32 → A [B, T, H, C] in q's dtype (scale included;
    accumulated in fp32, stored in the dtype both of its consumers cast it to before their dots).
    launch: num_warps / num_stages for the kernel."""
    _per_key("chunk_intra_fwd", b, "output.chunk_fwd_o_scalar forms a scalar decay's A")
    B, T, H, K = q.shape
    BC = min(sub_chunk, chunk_size)
    A = torch.empty(B, T, H, chunk_size, dtype=q.dtype, device=q.device)
    NC = chunk_size // BC
    grid = (cdiv(T, chunk_size), NC * NC, B * H)
    chunk_intra_fwd_kernel[grid](q, k, b, A, scale, T, H, K, chunk_size, BC, tile(K), dot_precision(q),
                                 **(dict(num_warps=2, num_stages=2) | launch))   # the best of an H100 sweep
    return A


# The backward's launch, the best of an H100 sweep at the benchmark shapes: unpipelined 4-warp programs (0.85-0.93 of
# the kernel's time at Triton's default 3 stages).
INTRA_BWD_LAUNCH = dict(num_warps=4, num_stages=1)


def chunk_intra_bwd(q, k, b, res, dA, scale: float, chunk_size: int, sub_chunk: int = 16, **launch):
    """dA: [B, T, H, C] fp32 → the intra-chunk parts of dq, dk: [B, T, H, K] fp32, from the strictly lower
    pairs j < i (the diagonal's share is output.chunk_bwd_dqkb's). b: [B, T, H, K]; res: b's residual
    (cumsum.chunk_residual). sub_chunk: rows a program takes; launch: num_warps / num_stages.
    q, k may be shared by groups of heads ([B, T, G, K], as chunk_fwd_h's k); dq, dk are per head."""
    _per_key("chunk_intra_bwd", b, "output.chunk_bwd_dqkb forms a scalar decay's parts with dq_intra=None")
    B, T, G, K = q.shape
    H = dA.shape[2]
    BC, BK = min(sub_chunk, chunk_size), tile(K)
    dq = torch.empty(B, T, H, K, dtype=torch.float32, device=q.device)
    dk = torch.empty_like(dq)
    grid = (cdiv(K, BK) * (chunk_size // BC), cdiv(T, chunk_size), B * H)
    for exact, redo in residual_launches(False):
        chunk_intra_bwd_kernel[grid](q, k, b, res, dA, dq, dk, scale, T, H, K, chunk_size, BC, BK, dot_precision(q),
                                     RESIDUAL_FROM, exact, redo, HG=H // G, **(INTRA_BWD_LAUNCH | launch))
    return dq, dk


def _per_key(name: str, b: torch.Tensor, instead: str) -> None:
    if b.shape[-1] == 1:
        raise ValueError(f"{name}: takes a per-key-dim decay (b [B, T, H, K]), got a scalar one; {instead}")


def chunk_intra_fwd_ref(q, k, b, scale: float, chunk_size: int) -> torch.Tensor:
    from ops.chunkwise.state import pad_chunks

    B, T, H, K = q.shape
    qc, kc, bc = pad_chunks(q, chunk_size), pad_chunks(k, chunk_size), pad_chunks(b, chunk_size)   # [B, N, C, H, D]
    diff = bc[:, :, :, None] - bc[:, :, None, :]                                          # [B, N, C, C, H, D]
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    e = diff.masked_fill(~causal[:, :, None, None], float("-inf")).exp()
    A = (qc[:, :, :, None] * kc[:, :, None, :] * e).sum(-1) * scale                       # [B, N, C, C, H]
    return A.permute(0, 1, 2, 4, 3).reshape(B, -1, H, chunk_size)[:, :T]


def chunk_intra_bwd_ref(q, k, b, dA, scale: float, chunk_size: int):
    """dq, dk of the intra-chunk scores by autograd through chunk_intra_fwd_ref, the diagonal of dA
    (column t mod C of row t) left out, as the kernel leaves it."""
    qr, kr = q.detach().float().requires_grad_(), k.detach().float().requires_grad_()
    A = chunk_intra_fwd_ref(qr, kr, b.float(), scale, chunk_size)
    T = q.shape[1]
    diag = torch.arange(T, device=q.device)[:, None] % chunk_size == torch.arange(chunk_size, device=q.device)
    return torch.autograd.grad(A, (qr, kr), dA.float().masked_fill(diag[None, :, None, :], 0.0))
