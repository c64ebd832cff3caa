"""Triton kernels of the fused output projection (issue [H]); ops/proj_out/fused.py launches them.

Rows m = (b, t) flattened, M = B·T; HV = H·V; N = d. Every tensor is row-major.

Forward, one program per (BM rows, BN output columns), K loop over heads h (and BV-wide slices of
each head when V > BV):
    prologue   a = o[m, h] · rsqrt(mean_V(o[m, h]²) + eps) · w_norm ⊙ silu(r[m, h])     [BM, BV]
    main loop  acc += a W_o[n, h]ᵀ                                                    [BM, BN]
    epilogue   y = acc + residual                                                     written once
With BV = V a head's whole row is in the tile, so its RMS comes from the tile itself; for V > BV
the head's sum of squares is taken in a first pass over its slices (they stay in L1/L2).

Backward, one program per (BM rows, head h): the dgrad GEMM dg = dy W_o[:, h] with the whole head
(V columns) in the accumulator, so the RMSNorm backward's per-row reduction happens in its epilogue:
    n = ô·w, s = silu(r), g = n ⊙ s             recomputed from o, r (never stored by the forward)
    dr = dg ⊙ n ⊙ silu'(r);  dô = dg ⊙ s ⊙ w;  do = rstd (dô − ô · mean_V(dô ⊙ ô));  dw += Σ_m dg ⊙ s ⊙ ô
and g is written for the weight gradient dW_o = dyᵀ g, which runs as a plain GEMM (cuBLAS).
No dot accumulator is ever transposed (the Hopper miscompile in ../shared/GPU.md).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rows(x, rows, mm, col, vv, HV: tl.constexpr):
    """x[rows, col + vv] of a row-major [M, HV] tensor as fp32 [BM, BV]; rows past M read 0."""
    return tl.load(x + rows[:, None] * HV + col + vv[None, :], mask=mm[:, None], other=0.0).to(tl.float32)


@triton.jit
def _gated_dot(acc, ob, rstd, r, nw, w, rows, mm, cols, mn, col, v0, vv, HV: tl.constexpr, PREC: tl.constexpr):
    """acc + (ô·w ⊙ silu(r)) W_o[cols, col + vv]ᵀ for one BV-wide slice (channels v0 + vv of its head)."""
    rb = _rows(r, rows, mm, col, vv, HV)
    wn = tl.load(nw + v0 + vv).to(tl.float32)
    a = ob * rstd[:, None] * wn[None, :] * (rb * tl.sigmoid(rb))                                  # [BM, BV]
    wt = tl.load(w + cols[None, :] * HV + col + vv[:, None], mask=mn[None, :], other=0.0)        # [BV, BN]
    return tl.dot(a.to(wt.dtype), wt, acc, input_precision=PREC)


@triton.jit
def proj_out_fwd_kernel(o, r, nw, w, res, y, M, N, eps,
                        H: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HAS_RES: tl.constexpr,
                        PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    HV: tl.constexpr = H * V
    # grouped launch order: GROUP row tiles share each column tile's W_o slice while it is in L2
    pid = tl.program_id(0)
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP * num_n
    first_m = (pid // per_group) * GROUP
    size_m = tl.minimum(num_m - first_m, GROUP)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    mm, mn = rows < M, cols < N
    vv = tl.arange(0, BV)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for h in range(H):
        if BV == V:       # the head's whole row is in the tile: its RMS comes from the tile itself
            ob = _rows(o, rows, mm, h * V, vv, HV)
            rstd = tl.rsqrt(tl.sum(ob * ob, axis=1) / V + eps)                                   # [BM]
            acc = _gated_dot(acc, ob, rstd, r, nw, w, rows, mm, cols, mn, h * V, 0, vv, HV, PREC)
        else:             # a first pass over the head's slices for its sum of squares
            ss = tl.zeros([BM], dtype=tl.float32)
            for c in range(V // BV):
                ob = _rows(o, rows, mm, h * V + c * BV, vv, HV)
                ss += tl.sum(ob * ob, axis=1)
            rstd = tl.rsqrt(ss / V + eps)
            for c in range(V // BV):
                ob = _rows(o, rows, mm, h * V + c * BV, vv, HV)
                acc = _gated_dot(acc, ob, rstd, r, nw, w, rows, mm, cols, mn, h * V + c * BV, c * BV, vv, HV, PREC)
    if HAS_RES:
        acc += tl.load(res + rows[:, None] * N + cols[None, :], mask=mm[:, None] & mn[None, :], other=0.0).to(tl.float32)
    tl.store(y + rows[:, None] * N + cols[None, :], acc.to(y.dtype.element_ty), mask=mm[:, None] & mn[None, :])


@triton.jit
def proj_out_bwd_kernel(dy, w, o, r, nw, g, do, dr, dnw, M, N, eps,
                        H: tl.constexpr, V: tl.constexpr, PREC: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    HV: tl.constexpr = H * V
    # heads vary fastest, so the H programs of one row tile run together and read its dy rows from L2
    h, pid_m = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    mm = rows < M
    vv = tl.arange(0, V)
    acc = tl.zeros([BM, V], dtype=tl.float32)                                                 # dg = dy W_o[:, h]
    for k0 in range(0, N, BK):
        kk = k0 + tl.arange(0, BK)
        mk = kk < N
        dyt = tl.load(dy + rows[:, None] * N + kk[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
        wt = tl.load(w + kk[:, None] * HV + h * V + vv[None, :], mask=mk[:, None], other=0.0)
        acc = tl.dot(dyt, wt, acc, input_precision=PREC)
    at = rows[:, None] * HV + h * V + vv[None, :]
    ob = _rows(o, rows, mm, h * V, vv, HV)
    rb = _rows(r, rows, mm, h * V, vv, HV)
    wn = tl.load(nw + vv).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(ob * ob, axis=1) / V + eps)
    oh = ob * rstd[:, None]                                                                   # ô
    sg = tl.sigmoid(rb)
    s = rb * sg                                                                               # silu(r)
    n = oh * wn[None, :]
    tl.store(g + at, (n * s).to(g.dtype.element_ty), mask=mm[:, None])
    tl.store(dr + at, (acc * n * sg * (1.0 + rb * (1.0 - sg))).to(dr.dtype.element_ty), mask=mm[:, None])
    dn = acc * s
    doh = dn * wn[None, :]
    c = tl.sum(doh * oh, axis=1) / V
    tl.store(do + at, (rstd[:, None] * (doh - oh * c[:, None])).to(do.dtype.element_ty), mask=mm[:, None])
    tl.store(dnw + (pid_m * H + h) * V + vv, tl.sum(dn * oh, axis=0))                           # masked rows add 0
