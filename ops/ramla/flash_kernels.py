"""Flash-style RA+MLA in latent space: Triton kernels for the `fused` backend.

The kernels see the attention after the query-to-latent map and before the V up-projection:

    q: [H, B, T, L] (q_lat, head-major: it is the batched GEMM's own output layout), k, v: [B, T, L]
    (K_lat, V_lat, shared by every head)
    s_ij = scale q_i·k_j (j ≤ i)  +  α scale q_j·k_i (0 ≤ i − j ≤ W, the reciprocal band)
    o_i = softmax_j(s_i) v                                              o: [H, B, T, L], lse: [H, B, T]

The band term is the transposed score S_ji. A tile of it is the dot of the key rows' q with the
query rows' k, so the kernels form it directly instead of transposing a score tile: `tl.trans` of
a `tl.dot` result fed into another `tl.dot` is miscompiled on Hopper by Triton < 3.7.1.
For the same reason the dk/dv kernel computes the scores transposed, keys on rows (as Triton's
flash-attention tutorial does).

Backward (FlashAttention-2: recompute p from lse, ds = p ⊙ (dp − δ), δ_i = do_i·o_i):
    dv_j = Σ_h Σ_i p_ij do_i        dk_j += scale Σ_h Σ_i ds_ij q_i      (`ramla_bwd_dkv_kernel`, per key block)
    dq_j += α scale Σ_i [band] ds_ij k_i     dα = scale Σ [band] ds_ij q_j·k_i   (same kernel: column sums)
    dq_i += scale Σ_j ds_ij k_j     dk_i += α scale Σ_h Σ_j [band] ds_ij q_j     (`ramla_bwd_dq_kernel`, per query block)
Each kernel owns its rows, so there are no atomics: the dq kernel runs second and adds the dk/dv kernel's column
sums (dq_band) to its row sums. That recomputes the scores and dp once more (7 tile GEMMs against
FlashAttention-2's 5), yet the one-kernel form with dq summed by fp32 atomic adds is slower on the H100 at every
tile. The memory-bound passes around these kernels are in bwd_passes.py. k and v are shared by all heads, so a backward program takes a group
of HP heads and sums their dk and dv on chip; `ramla_bwd_reduce_kernel` adds the groups' partial sums (H / HP of
them) in one pass. HP trades that summing against parallelism: all heads in one program leave only B·T/64 programs
(256 at GPT-2's B8 T2048, under two per SM, the causal ones uneven). The causal programs' work differs up to
T/64-fold, so the backward grids put the block index slowest and launch the longest blocks first; launched block-
fastest, the longest programs start late and run alone at the end.

FAR (the split form, ops/ramla/fused.py): the keys j < i − W carry no band term, so their part of the
attention is plain causal attention shifted by W + 1, which SDPA's kernels compute (o_far, lse_far). The
kernels then cover only the band 0 ≤ i − j ≤ W: the forward continues SDPA's online softmax from
(o_far, lse_far) over the band's key blocks, and the backward kernels take the band's tiles alone (their
dq kernel also adds SDPA's dq_far, already rounded to the input dtype, in fp32 before its store).
"""
from __future__ import annotations

import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def _rows(p, i_s, o_t, m_t, o_l, T, L: tl.constexpr):
    """Rows o_t of sequence i_s of a [S, T, L] tensor → [len(o_t), L]; masked rows are 0."""
    return tl.load(p + (i_s * T + o_t[:, None]) * L + o_l[None, :], mask=m_t[:, None], other=0.0)


@triton.jit
def _in_band(d, W):
    return (d >= 0) & (d <= W)


@triton.jit
def _keep(d, W, FAR: tl.constexpr):
    """The scores these kernels own: causal, and with FAR only the band (SDPA has the rest)."""
    if FAR:
        return _in_band(d, W)
    return d >= 0


@triton.jit
def _far_rows(o_m, m_m, W):
    """Where query rows o_m sit in SDPA's far-field tensors: row t ≥ W + 1 is far row t − W − 1 (int64: those
    tensors' offsets can pass 2³¹); `far` masks the rows that have one."""
    far = m_m & (o_m > W)
    return far, tl.where(far, o_m - W - 1, 0).to(tl.int64)


@triton.jit
def _scores(b_q, b_kq, a, k, v, q, i_b, i_q, o_m, o_n, o_l, qk, T, W, L: tl.constexpr, MASKED: tl.constexpr,
            BAND: tl.constexpr, PREC: tl.constexpr, FAR: tl.constexpr):
    """Scores of query rows o_m against key rows o_n [BM, BN] (the forward's and the dq kernel's
    orientation) in log2 units (qk = scale·log2 e), with the band and the masks where MASKED; also the key
    rows' k, v and, with the band, their q (else k again, unused)."""
    m_n = o_n < T
    b_k = _rows(k, i_b, o_n, m_n, o_l, T, L)
    b_v = _rows(v, i_b, o_n, m_n, o_l, T, L)
    b_qn = b_k
    s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk
    if MASKED:
        d = o_m[:, None] - o_n[None, :]
        if BAND:
            b_qn = _rows(q, i_q, o_n, m_n, o_l, T, L)                    # q at the key rows
            st = tl.dot(b_kq, tl.trans(b_qn), input_precision=PREC)     # k_i·q_j
            s += tl.where(_in_band(d, W), (a * qk) * st, 0.0)
        s = tl.where(_keep(d, W, FAR) & m_n[None, :], s, float("-inf"))
    return s, b_k, b_v, b_qn


@triton.jit
def _fwd_inner(acc, m_i, l_i, b_q, b_kq, a, k, v, q, i_b, i_q, o_m, o_l, qk, T, W, lo, hi,
               L: tl.constexpr, BN: tl.constexpr, MASKED: tl.constexpr, BAND: tl.constexpr,
               PREC: tl.constexpr, FAR: tl.constexpr):
    """Online softmax over the key blocks in [lo, hi), base 2 (m_i in log2 units). MASKED: the blocks at the
    diagonal and the band."""
    for start in range(lo, hi, BN):
        o_n = start + tl.arange(0, BN)
        s, b_k, b_v, b_qn = _scores(b_q, b_kq, a, k, v, q, i_b, i_q, o_m, o_n, o_l, qk, T, W, L, MASKED, BAND,
                                    PREC, FAR)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        corr = tl.exp2(m_i - m_new)
        l_i = l_i * corr + tl.sum(p, 1)
        acc = acc * corr[:, None] + tl.dot(p.to(b_v.dtype), b_v, input_precision=PREC)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def ramla_fwd_kernel(q, k, v, o, lse, alpha, scale, NB, T, W, o_far, lse_far, sfb, sfh, sft, slb, slh, slt,
                     H: tl.constexpr, L: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BAND: tl.constexpr,
                     PREC: tl.constexpr, FAR: tl.constexpr):
    """W = 0 when there is no band (BAND false). With FAR, row t ≥ W + 1 starts from SDPA's o_far and
    lse_far at row t − W − 1 (strides sf*, sl* over batch, head, row; o_far's last dim is contiguous)."""
    # heads vary fastest across programs, so the H programs of a query tile run together and read the
    # shared k, v tiles from L2; the last (longest) query tiles start first
    i_h, i_m, i_b = tl.program_id(0), tl.cdiv(T, BM) - 1 - tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_q = i_h * NB + i_b
    o_m = i_m * BM + tl.arange(0, BM)
    m_m = o_m < T
    o_l = tl.arange(0, L)
    b_q = _rows(q, i_q, o_m, m_m, o_l, T, L)
    qk = scale * LOG2E           # base-2 softmax: exp2 of scores pre-scaled by log2 e saves a multiply per score
    if BAND:
        b_kq = _rows(k, i_b, o_m, m_m, o_l, T, L)                            # k at the query rows
        a = tl.load(alpha).to(tl.float32)
    else:
        b_kq, a = b_q, 0.0
    # key blocks before `lo` are strictly below the diagonal and outside the band: no masks there
    lo = tl.maximum(i_m * BM - W, 0) // BN * BN
    hi = tl.minimum((i_m + 1) * BM, T)
    if FAR:
        # SDPA's normalised result is the online softmax's state (acc, m, l) = (o_far, lse_far·log2 e, 1); rows
        # t ≤ W have no keys outside the band and start empty; rows past T, which may see no key at all,
        # start from a finite m so that they stay NaN-free
        far, t_f = _far_rows(o_m, m_m, W)
        m_i = tl.load(lse_far + i_b * slb + tl.cast(i_h, tl.int64) * slh + t_f * slt, mask=far, other=float("-inf"))
        m_i = tl.where(m_m, m_i * LOG2E, 0.0)
        l_i = tl.where(far | ~m_m, 1.0, 0.0)
        p_far = o_far + i_b * sfb + tl.cast(i_h, tl.int64) * sfh + t_f[:, None] * sft + o_l[None, :]
        acc = tl.load(p_far, mask=far[:, None], other=0.0).to(tl.float32)
    else:
        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, L], dtype=tl.float32)
        acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, b_q, b_kq, a, k, v, q, i_b, i_q, o_m, o_l, qk, T, W, 0, lo,
                                   L, BN, False, BAND, PREC, FAR)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, b_q, b_kq, a, k, v, q, i_b, i_q, o_m, o_l, qk, T, W, lo, hi,
                               L, BN, True, BAND, PREC, FAR)
    acc = acc / l_i[:, None]
    tl.store(o + (i_q * T + o_m[:, None]) * L + o_l[None, :], acc.to(o.dtype.element_ty),
             mask=m_m[:, None])
    tl.store(lse + i_q * T + o_m, (m_i + tl.log2(l_i)) * LN2, mask=m_m)      # natural log, as SDPA's


@triton.jit
def _dkv_inner(b_dk, b_dv, b_dqb, b_da, b_k, b_v, b_qn, a, q, k, do, lse, delta, i_b, i_q, o_n, o_l, qk, T, W,
               lo, hi, L: tl.constexpr, BM: tl.constexpr, MASKED: tl.constexpr,
               BAND: tl.constexpr, PREC: tl.constexpr, FAR: tl.constexpr):
    """One head's query blocks in [lo, hi) against key block o_n, scores transposed (keys on rows).
    Rows past T load as zeros (q, do, lse, δ), which makes their p·do and ds exactly 0."""
    for start in range(lo, hi, BM):
        o_m = start + tl.arange(0, BM)
        m_m = o_m < T
        b_q = _rows(q, i_q, o_m, m_m, o_l, T, L)
        b_do = _rows(do, i_q, o_m, m_m, o_l, T, L)
        b_lse = tl.load(lse + i_q * T + o_m, mask=m_m, other=0.0) * LOG2E
        b_delta = tl.load(delta + i_q * T + o_m, mask=m_m, other=0.0)
        st = tl.dot(b_k, tl.trans(b_q), input_precision=PREC) * qk          # sᵀ (log2 units): [BN keys, BM queries]
        if MASKED:
            d = o_m[None, :] - o_n[:, None]
            if BAND:
                b_kq = _rows(k, i_b, o_m, m_m, o_l, T, L)
                stb = tl.dot(b_qn, tl.trans(b_kq), input_precision=PREC)        # q_j·k_i
                st += tl.where(_in_band(d, W), (a * qk) * stb, 0.0)
            st = tl.where(_keep(d, W, FAR) & m_m[None, :], st, float("-inf"))
        pt = tl.exp2(st - b_lse[None, :])
        b_dv += tl.dot(pt.to(b_do.dtype), b_do, input_precision=PREC)
        dpt = tl.dot(b_v, tl.trans(b_do), input_precision=PREC)
        dst = pt * (dpt - b_delta[None, :])
        b_dk += tl.dot(dst.to(b_q.dtype), b_q, input_precision=PREC)
        if MASKED:
            if BAND:
                dsb = tl.where(_in_band(d, W), dst, 0.0)
                b_dqb += tl.dot(dsb.to(b_kq.dtype), b_kq, input_precision=PREC)
                b_da += tl.sum(dsb * stb, 1)
    return b_dk, b_dv, b_dqb, b_da


@triton.jit
def ramla_bwd_dkv_kernel(q, k, v, do, lse, delta, alpha, dk, dv, dq_band, dalpha, scale, NB, T, W,
                         H: tl.constexpr, HP: tl.constexpr, KS: tl.constexpr, L: tl.constexpr, BM: tl.constexpr,
                         BN: tl.constexpr, BAND: tl.constexpr, PREC: tl.constexpr, FAR: tl.constexpr):
    """Per key block and group of HP heads: dk's column part (scale Σ ds q) and dv, summed over the
    group's heads on chip (dk: [B, T, KS, L], dv: [B, T, H / HP, L], fp32, slot i_g for group i_g);
    with the band also dq_band [H, B, T, L] and one partial of dα per program (dalpha:
    [B, cdiv(T, BN), H / HP])."""
    # key blocks vary slowest across programs and the first (longest: every later query block) start first
    i_g, i_b, i_n = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < T
    o_l = tl.arange(0, L)
    b_k = _rows(k, i_b, o_n, m_n, o_l, T, L)
    b_v = _rows(v, i_b, o_n, m_n, o_l, T, L)
    b_dk = tl.zeros([BN, L], dtype=tl.float32)
    b_dv = tl.zeros([BN, L], dtype=tl.float32)
    b_da = tl.zeros([BN], dtype=tl.float32)
    a = tl.load(alpha).to(tl.float32) if BAND else 0.0
    qk = scale * LOG2E
    # query blocks from the one holding this key block's first row; from `hi` on they are past the
    # band and wholly below the diagonal: no masks there
    first = i_n * BN // BM * BM
    hi = tl.minimum(((i_n + 1) * BN + W + BM - 1) // BM * BM, T)
    for i_h in range(i_g * HP, i_g * HP + HP):
        i_q = i_h * NB + i_b
        b_dqb = tl.zeros([BN, L], dtype=tl.float32)
        b_qn = _rows(q, i_q, o_n, m_n, o_l, T, L) if BAND else b_k
        b_dk, b_dv, b_dqb, b_da = _dkv_inner(b_dk, b_dv, b_dqb, b_da, b_k, b_v, b_qn, a, q, k, do, lse, delta,
                                             i_b, i_q, o_n, o_l, qk, T, W, first, hi, L, BM, True, BAND, PREC, FAR)
        if not FAR:
            b_dk, b_dv, b_dqb, b_da = _dkv_inner(b_dk, b_dv, b_dqb, b_da, b_k, b_v, b_qn, a, q, k, do, lse, delta,
                                                 i_b, i_q, o_n, o_l, qk, T, W, hi, T, L, BM, False, BAND, PREC,
                                                 FAR)
        if BAND:
            tl.store(dq_band + (i_q * T + o_n[:, None]) * L + o_l[None, :], b_dqb * (a * scale),
                     mask=m_n[:, None])
    row = i_b * T + o_n[:, None]
    tl.store(dk + (row * KS + i_g) * L + o_l[None, :], b_dk * scale, mask=m_n[:, None])
    tl.store(dv + (row * (H // HP) + i_g) * L + o_l[None, :], b_dv, mask=m_n[:, None])
    if BAND:
        tl.store(dalpha + (i_b * tl.cdiv(T, BN) + i_n) * (H // HP) + i_g, tl.sum(b_da, 0) * scale)


@triton.jit
def _dq_inner(b_dq, b_dkb, b_q, b_do, b_lse, b_delta, b_kq, a, q, k, v, i_b, i_q, o_m, o_l, qk, T, W, lo, hi,
              L: tl.constexpr, BN: tl.constexpr, MASKED: tl.constexpr, BAND: tl.constexpr,
              PREC: tl.constexpr, FAR: tl.constexpr):
    """One head's key blocks in [lo, hi) against query block o_m (b_lse in log2 units)."""
    for start in range(lo, hi, BN):
        o_n = start + tl.arange(0, BN)
        s, b_k, b_v, b_qn = _scores(b_q, b_kq, a, k, v, q, i_b, i_q, o_m, o_n, o_l, qk, T, W, L, MASKED, BAND,
                                    PREC, FAR)
        p = tl.exp2(s - b_lse[:, None])
        dp = tl.dot(b_do, tl.trans(b_v), input_precision=PREC)
        ds = p * (dp - b_delta[:, None])
        b_dq += tl.dot(ds.to(b_k.dtype), b_k, input_precision=PREC)
        if MASKED:
            if BAND:
                dsb = tl.where(_in_band(o_m[:, None] - o_n[None, :], W), ds, 0.0)
                b_dkb += tl.dot(dsb.to(b_qn.dtype), b_qn, input_precision=PREC)
    return b_dq, b_dkb


@triton.jit
def ramla_bwd_dq_kernel(q, k, v, do, lse, delta, alpha, dq_band, dq, dk, scale, NB, T, W, dq_far, sfb, sfh, sft,
                        H: tl.constexpr, HP: tl.constexpr, KS: tl.constexpr, L: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr, BAND: tl.constexpr, PREC: tl.constexpr, FAR: tl.constexpr):
    """Per query block and group of HP heads: dq of each head (its row part plus the dk/dv kernel's
    dq_band, and with FAR SDPA's dq_far at row t − W − 1), and with the band the group's row part of dk
    (dk: [B, T, KS, L] fp32, slot H / HP + i_g, after the dk/dv kernel's slots)."""
    # query blocks vary slowest across programs and the last (longest) start first
    i_g, i_b, i_m = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.cdiv(T, BM) - 1 - tl.program_id(2)
    o_m = i_m * BM + tl.arange(0, BM)
    m_m = o_m < T
    o_l = tl.arange(0, L)
    if BAND:
        b_kq = _rows(k, i_b, o_m, m_m, o_l, T, L)
        a = tl.load(alpha).to(tl.float32)
    else:
        b_kq, a = tl.zeros([BM, L], dtype=k.dtype.element_ty), 0.0
    b_dkb = tl.zeros([BM, L], dtype=tl.float32)
    qk = scale * LOG2E
    lo = tl.maximum(i_m * BM - W, 0) // BN * BN
    hi = tl.minimum((i_m + 1) * BM, T)
    for i_h in range(i_g * HP, i_g * HP + HP):
        i_q = i_h * NB + i_b
        b_q = _rows(q, i_q, o_m, m_m, o_l, T, L)
        b_do = _rows(do, i_q, o_m, m_m, o_l, T, L)
        b_lse = tl.load(lse + i_q * T + o_m, mask=m_m, other=0.0) * LOG2E
        b_delta = tl.load(delta + i_q * T + o_m, mask=m_m, other=0.0)
        b_dq = tl.zeros([BM, L], dtype=tl.float32)
        if not FAR:
            b_dq, b_dkb = _dq_inner(b_dq, b_dkb, b_q, b_do, b_lse, b_delta, b_kq, a, q, k, v, i_b, i_q, o_m, o_l,
                                    qk, T, W, 0, lo, L, BN, False, BAND, PREC, FAR)
        b_dq, b_dkb = _dq_inner(b_dq, b_dkb, b_q, b_do, b_lse, b_delta, b_kq, a, q, k, v, i_b, i_q, o_m, o_l, qk,
                                T, W, lo, hi, L, BN, True, BAND, PREC, FAR)
        p_dq = (i_q * T + o_m[:, None]) * L + o_l[None, :]
        b_dq = b_dq * scale
        if BAND:
            b_dq += tl.load(dq_band + p_dq, mask=m_m[:, None], other=0.0)
        if FAR:
            far, t_f = _far_rows(o_m, m_m, W)
            p_far = dq_far + i_b * sfb + tl.cast(i_h, tl.int64) * sfh + t_f[:, None] * sft + o_l[None, :]
            b_dq += tl.load(p_far, mask=far[:, None], other=0.0).to(tl.float32)
        tl.store(dq + p_dq, b_dq.to(dq.dtype.element_ty), mask=m_m[:, None])
    if BAND:
        p_dk = ((i_b * T + o_m[:, None]) * KS + H // HP + i_g) * L + o_l[None, :]
        tl.store(dk + p_dk, b_dkb * (a * scale), mask=m_m[:, None])
