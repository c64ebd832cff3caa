"""Triton kernels of the fused input projection; fused.py launches them.

Rows m = (b, t) flattened, M = B·T; d the model width; HK = H·K, HV = H·V, L the decay's low rank.
W_cat = [W_q; W_k; W_v; W_r; W_down] is a row-major [N, d] bf16 copy of the five weights (N = 2HK + 2HV + L),
so output column c of x W_catᵀ belongs to slice q (c < HK), k (< 2HK), v (< 2HK + HV), r (< C4 = 2HK + 2HV)
or low (< N; the prologue computes it). gemm_in_kernel writes q, k, v, r back to back into one buffer `out`,
each a contiguous [M, width] block (slice s starts at element M·start_s); fused.py's `triton` engine copies each
block into a tensor of its own (an operator's outputs may not share storage), the contiguous [B, T, H, D] tensor
the mixer wants.

    prologue_kernel  one pass over x: xc = bf16(x), low = xc W_downᵀ, gk = logsigmoid(low W_upᵀ + b) / normalizer
    gemm_in_kernel   xc[M, d] W_cat[:C4]ᵀ → q, k, v, r (out), each written once
    gk_bwd_kernel    dz = dgk · sigmoid(−z) / normalizer (z recomputed) in registers, reduced into partials of
                     dlow = dz W_up, dW_up = dzᵀ low and db: dz is never stored
    dgrad_kernel     dx = dq W_q + dk W_k + dv W_v + dr W_r + dlow W_down: one K loop per operand,
                     one accumulator, so the five gradients are never concatenated and dx is written once
    dgrad_tma_kernel the same on tensor descriptors, persistent: TMA loads and stores on Hopper, for widths TMA
                     can address

No dot accumulator is ever transposed (Triton < 3.7.1 miscompiles that on Hopper): W tiles that are needed
transposed are loaded transposed by their pointers, low by tl.trans of its loaded tile; dz (derived from the z
accumulator) enters dots untransposed.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ops.proj.gemm import dot_desc, dot_rows, grouped_tile, tile_of


@triton.jit
def _slice_start(c, HK, HV):
    """The first column of the slice (q, k, v or r) that column c belongs to; c < C4."""
    return tl.where(c < HK, 0, tl.where(c < 2 * HK, HK, tl.where(c < 2 * HK + HV, 2 * HK, 2 * HK + HV)))


@triton.jit
def gemm_in_kernel(x, w, out, M, D, HK, HV, PREC: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    """[M, C4] = x[M, D] W_cat[:C4, D]ᵀ, fp32 accumulation, each column stored in its slice (module docstring).
    The main loop is ops/proj/gemm.py's (shared with proj_out); only the epilogue knows about slices."""
    C4 = 2 * HK + 2 * HV
    pid_m, pid_n = grouped_tile(M, C4, BM, BN, GROUP)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    acc = dot_rows(tl.zeros([BM, BN], dtype=tl.float32), x, w, rows % M, cols % C4, D, PREC, BK)
    mask = (rows < M)[:, None] & (cols < C4)[None, :]
    c0 = pid_n * BN
    c1 = tl.minimum(c0 + BN, C4) - 1                                     # the tile's last real column
    acc = acc.to(out.dtype.element_ty)
    if _slice_start(c0, HK, HV) == _slice_start(c1, HK, HV):
        # one slice (always so when BN divides HK and HV): scalar start and width, so the addresses are
        # affine in the columns and the stores vectorise
        # (names differ from the else branch's: Triton 3.6 wants one type per name across if/else)
        s0 = _slice_start(c0, HK, HV)
        width0 = tl.where(c0 < 2 * HK, HK, HV)
        tl.store(out + s0 * M + rows[:, None] * width0 + (cols - s0)[None, :], acc, mask=mask)
    else:                                            # a tile across a slice boundary: per-column addresses
        s = _slice_start(cols, HK, HV)
        widths = tl.where(cols < 2 * HK, HK, HV)
        tl.store(out + s[None, :] * M + rows[:, None] * widths[None, :] + (cols - s)[None, :], acc, mask=mask)


@triton.jit
def _logsigmoid(z):
    """min(z, 0) − log(1 + exp(−|z|)): no overflow at either tail. (Without log1p the z ≫ 0 tail, |gk| < 6e-8,
    reads 0: an absolute error far below bf16's resolution of the gk values that matter.)"""
    return tl.minimum(z, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(z)))


@triton.jit
def _z_tile(low_t, w_up, b_up, cols, ll, mc, HK, L, PREC: tl.constexpr):
    """z[BR, BN] = low_t[BR, BL] W_up[cols, :]ᵀ + b[cols] in fp32 (W_upᵀ's tile loaded transposed)."""
    wt = tl.load(w_up + cols[None, :] * L + ll[:, None], mask=mc[None, :] & (ll < L)[:, None], other=0.0)
    b = tl.load(b_up + cols, mask=mc, other=0.0).to(tl.float32)
    return tl.dot(low_t, wt, input_precision=PREC) + b[None, :]


@triton.jit
def prologue_kernel(x, xc, w_down, low, w_up, b_up, gk, M, D, HK, L, inv_norm, STORE_XC: tl.constexpr,
                    PREC: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr, BL: tl.constexpr):
    """One program per BR rows, in one pass over x: xc = x in the GEMMs' dtype (stored if STORE_XC, else x is
    already that), low = xc W_downᵀ (fp32 accumulation over d, rounded to low's dtype as a GEMM would), then
    gk = logsigmoid(low W_upᵀ + b) · inv_norm across HK in BN-wide blocks, stored fp32. Replaces a cast kernel,
    the rank-L GEMM (which read xc again) and the gk kernel: 670 MB instead of 805 at the seed shape."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    ll, kk = tl.arange(0, BL), tl.arange(0, BK)
    mr, ml = rows < M, ll < L
    acc = tl.zeros([BR, BL], dtype=tl.float32)
    for k0 in range(0, D, BK):
        mk = (k0 + kk) < D
        at = rows[:, None] * D + (k0 + kk)[None, :]
        xt = tl.load(x + at, mask=mr[:, None] & mk[None, :], other=0.0).to(xc.dtype.element_ty)
        if STORE_XC:
            tl.store(xc + at, xt, mask=mr[:, None] & mk[None, :])
        wt = tl.load(w_down + ll[None, :] * D + (k0 + kk)[:, None], mask=ml[None, :] & mk[:, None], other=0.0)
        acc = tl.dot(xt, wt, acc, input_precision=PREC)
    low_t = acc.to(low.dtype.element_ty)
    tl.store(low + rows[:, None] * L + ll[None, :], low_t, mask=mr[:, None] & ml[None, :])
    for c0 in range(0, HK, BN):
        cols = c0 + tl.arange(0, BN)
        mc = cols < HK
        z = _z_tile(low_t, w_up, b_up, cols, ll, mc, HK, L, PREC)
        tl.store(gk + rows[:, None] * HK + cols[None, :], _logsigmoid(z) * inv_norm, mask=mr[:, None] & mc[None, :])


@triton.jit
def gk_bwd_kernel(low, w_up, b_up, dgk, dlow_p, dwu_p, db_p, M, HK, L, inv_norm, ROWS,
                  PREC: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr, BL: tl.constexpr):
    """Program (column block c, row range s of ROWS rows), walking its rows BR at a time: recomputes z, forms
    dz = dgk·σ(−z)·inv_norm in registers and reduces it three ways, so dz never reaches HBM:
        dlow_p[c, rows] = dz W_up[cols]       (fp32 partials, summed over c by the caller)
        dwu_p[s, :, cols] += lowᵀ dz           (dW_upᵀ partials, summed over s)
        db_p[s, cols] += Σ_rows dz
    W_up's two tiles and b are loaded once per program. low is transposed as loaded, never an accumulator;
    dz enters both dots in bf16, as a cuBLAS dW_up = dzᵀ low would read it."""
    pid_c, pid_s = tl.program_id(0), tl.program_id(1)
    cols = pid_c * BN + tl.arange(0, BN)
    ll = tl.arange(0, BL)
    mc, ml = cols < HK, ll < L
    wt = tl.load(w_up + cols[None, :] * L + ll[:, None], mask=mc[None, :] & ml[:, None], other=0.0)   # [BL, BN]
    wu = tl.load(w_up + cols[:, None] * L + ll[None, :], mask=mc[:, None] & ml[None, :], other=0.0)   # [BN, BL]
    b = tl.load(b_up + cols, mask=mc, other=0.0).to(tl.float32)
    acc_w = tl.zeros([BL, BN], dtype=tl.float32)
    acc_b = tl.zeros([BN], dtype=tl.float32)
    r_end = tl.minimum(M, (pid_s + 1) * ROWS)
    for r0 in range(pid_s * ROWS, r_end, BR):
        rows = r0 + tl.arange(0, BR)
        mr = rows < r_end
        low_t = tl.load(low + rows[:, None] * L + ll[None, :], mask=mr[:, None] & ml[None, :], other=0.0)
        z = tl.dot(low_t, wt, input_precision=PREC) + b[None, :]
        g = tl.load(dgk + rows[:, None] * HK + cols[None, :], mask=mr[:, None] & mc[None, :], other=0.0)
        d = g.to(tl.float32) * tl.sigmoid(-z) * inv_norm          # d logsigmoid(z)/dz = σ(−z); 0 where masked
        acc_b += tl.sum(d, axis=0)
        dh = d.to(wu.dtype)
        tl.store(dlow_p + (pid_c * M + rows[:, None]) * L + ll[None, :], tl.dot(dh, wu, input_precision=PREC),
                 mask=mr[:, None] & ml[None, :])
        acc_w = tl.dot(tl.trans(low_t), dh, acc_w, input_precision=PREC)
    tl.store(dwu_p + (pid_s * L + ll[:, None]) * HK + cols[None, :], acc_w, mask=ml[:, None] & mc[None, :])
    tl.store(db_p + pid_s * HK + cols, acc_b, mask=mc)


@triton.jit
def _segment(acc, a, KW, w, k_row, D, ra, cb, PREC: tl.constexpr, BK: tl.constexpr):
    """acc += a[ra, :KW] W_cat[k_row : k_row + KW, cb]: one operand's pipelined K loop (a is [M, KW] contiguous)."""
    kk = tl.arange(0, BK)
    a_ptr = a + ra[:, None] * KW + kk[None, :]                                              # [BM, BK]
    w_ptr = w + (k_row + kk)[:, None] * D + cb[None, :]                                     # [BK, BN]
    for k0 in range(0, KW, BK):
        mk = kk < KW - k0                   # rows of W_cat past this slice belong to the next one: masked
        acc = tl.dot(tl.load(a_ptr, mask=mk[None, :], other=0.0), tl.load(w_ptr, mask=mk[:, None], other=0.0),
                     acc, input_precision=PREC)
        a_ptr += BK
        w_ptr += BK * D
    return acc


@triton.jit
def dgrad_kernel(dq, dk, dv, dr, dlow, w, dx, M, D, HK, HV, L, PREC: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    """dx[M, D] = Σ_s dA_s[M, w_s] W_cat[slice s, :] over the five slices, fp32 accumulation, stored in dx's dtype."""
    pid_m, pid_n = grouped_tile(M, D, BM, BN, GROUP)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    ra, cb = rows % M, cols % D
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    acc = _segment(acc, dq, HK, w, 0, D, ra, cb, PREC, BK)
    acc = _segment(acc, dk, HK, w, HK, D, ra, cb, PREC, BK)
    acc = _segment(acc, dv, HV, w, 2 * HK, D, ra, cb, PREC, BK)
    acc = _segment(acc, dr, HV, w, 2 * HK + HV, D, ra, cb, PREC, BK)
    acc = _segment(acc, dlow, L, w, 2 * HK + 2 * HV, D, ra, cb, PREC, BK)
    mask = (rows < M)[:, None] & (cols < D)[None, :]
    tl.store(dx + rows[:, None] * D + cols[None, :], acc.to(dx.dtype.element_ty), mask=mask)


@triton.jit
def dgrad_tma_kernel(dq, dk, dv, dr, dlow, w, w_low, dx, M, D, HK, HV, L, PREC: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BL: tl.constexpr, GROUP: tl.constexpr,
                     PER_SM: tl.constexpr):
    """dgrad_kernel's product with every operand a tensor descriptor: dq, dk, dv, dr blocks [BM, BK], dlow [BM, BL];
    w (W_cat) [BK, BN] and w_low (W_cat again, for the rank-L slice) [BL, BN]; dx [BM, BN / 2], whose stores clip
    the edges. Persistent: each program walks tiles num_programs apart, so one tile's fp32 stores (issued as two
    halves: a [BM, BN] fp32 staging buffer would not fit beside three pipeline stages) drain under the next
    tile's loads (faster on the H100 than one program per tile).
    PER_SM: programs per SM, read by the launch grid only (an autotuned choice)."""
    for t in tl.range(tl.program_id(0), tl.cdiv(M, BM) * tl.cdiv(D, BN), tl.num_programs(0)):
        pid_m, pid_n = tile_of(t, M, D, BM, BN, GROUP)
        m0, n0 = pid_m * BM, pid_n * BN
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        acc = dot_desc(acc, dq, w, HK, 0, m0, n0, PREC, BK)
        acc = dot_desc(acc, dk, w, HK, HK, m0, n0, PREC, BK)
        acc = dot_desc(acc, dv, w, HV, 2 * HK, m0, n0, PREC, BK)
        acc = dot_desc(acc, dr, w, HV, 2 * HK + HV, m0, n0, PREC, BK)
        acc = dot_desc(acc, dlow, w_low, L, 2 * HK + 2 * HV, m0, n0, PREC, BL)
        left, right = acc.to(dx.dtype).reshape(BM, 2, BN // 2).permute(0, 2, 1).split()
        dx.store([m0, n0], left)
        dx.store([m0, n0 + BN // 2], right)
