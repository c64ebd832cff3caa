"""Triton kernels of the fused output projection; fused.py launches them.

Rows m = (b, t) flattened, M = B·T; K = H·V; N = d. Every tensor is row-major. A [M, H·V] activation
is also a row-major [M·H, V] matrix whose rows are single heads, so the per-head RMSNorm is a plain
row norm over R = M·H rows of V channels: the two elementwise kernels read fully contiguous tiles.
r alone may have a row stride RS ≥ H·V: it is the gate's column slice of the input projection's wide
GEMM output (Gated DeltaNet's r, Mamba-2's z), read in place rather than copied and saved twice.

    gate_fwd_kernel   g = ô·w ⊙ s,  ô = o · rsqrt(mean_V(o²) + eps)               [R, V] → bf16 g, once
                      GATE_FIRST (Mamba-2): g = û·w,  û = u · rsqrt(mean_V(u²) + eps),  u = o ⊙ s
    gemm_res_kernel   y = g W_oᵀ + residual                                      [M, K] × [N, K]ᵀ → [M, N]
    gate_bwd_kernel   from dg = dy W_o (cuBLAS), o, r:  g again (for dW_o = dyᵀ g), and
                      dr = dg ⊙ n ⊙ silu'(r);  dô = dg ⊙ s ⊙ w;  do = rstd (dô − ô · mean_V(dô ⊙ ô));
                      per-program partial sums of dw = Σ_rows dg ⊙ s ⊙ ô          (n = ô·w, s = silu(r))
                      GATE_FIRST: dû = dg ⊙ w;  du = rstd (dû − û · mean_V(dû ⊙ û));  do = du ⊙ s;
                      dr = du ⊙ o ⊙ silu'(r);  dw = Σ_rows dg ⊙ û

Why three kernels and not one GEMM with the gate in its prologue: that GEMM would form its A tile in
registers for every BN-wide output tile, recomputing the norm and the gate d/BN times and keeping the
pipeliner from streaming A into shared memory (it ran slower than the unfused chain). Writing g once (one
extra [M, H·V] bf16 write and read) lets the GEMM be a plain, pipelined tl.dot loop; the residual add stays
in its epilogue, so y never round-trips through HBM. No dot accumulator is ever transposed (Triton < 3.7.1
miscompiles that on Hopper): W_oᵀ's tile is loaded transposed by its pointers.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ops.proj.gemm import dot_rows, grouped_tile


@triton.jit
def _head_rows(x, rows, vv, mask, V: tl.constexpr):
    """x[rows, vv] of a row-major [R, V] tensor as fp32 [BR, BV]; masked entries (rows past R,
    channels past V when V is not a power of two) read 0."""
    return tl.load(x + rows[:, None] * V + vv[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _gate_rows(r, rows, vv, mask, RS, H: tl.constexpr, V: tl.constexpr):
    """r[rows, vv] as fp32 [BR, BV], head-row m·H + h at m·RS + h·V (RS = H·V when r is contiguous)."""
    return tl.load(r + ((rows // H) * RS + (rows % H) * V)[:, None] + vv[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def gate_fwd_kernel(o, r, nw, g, R, RS, eps, H: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr,
                    GATE_FIRST: tl.constexpr):
    """One program per BR head-rows: g[R, V] = RMSNorm(o)·w ⊙ silu(r), or RMSNorm(o ⊙ silu(r))·w when
    GATE_FIRST, in g's dtype (fp32 math)."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    vv = tl.arange(0, BV)
    mv = vv < V
    mask = (rows < R)[:, None] & mv[None, :]
    ob = _head_rows(o, rows, vv, mask, V)
    rb = _gate_rows(r, rows, vv, mask, RS, H, V)
    wn = tl.load(nw + vv, mask=mv, other=0.0).to(tl.float32)
    s = rb * tl.sigmoid(rb)                                                               # silu(r)
    if GATE_FIRST:
        x = ob * s                                                                        # the norm's input
    else:
        x = ob
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / V + eps)                                      # [BR]
    gt = x * rstd[:, None] * wn[None, :]
    if not GATE_FIRST:
        gt = gt * s
    tl.store(g + rows[:, None] * V + vv[None, :], gt.to(g.dtype.element_ty), mask=mask)


@triton.jit
def gemm_res_kernel(a, w, res, y, M, N, K, HAS_RES: tl.constexpr, PREC: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    """y[M, N] = a[M, K] W[N, K]ᵀ (+ res[M, N]), fp32 accumulation, stored in y's dtype.
    The main loop is ops/proj/gemm.py's; the residual is read once, in the epilogue."""
    pid_m, pid_n = grouped_tile(M, N, BM, BN, GROUP)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    acc = dot_rows(tl.zeros([BM, BN], dtype=tl.float32), a, w, rows % M, cols % N, K, PREC, BK)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    if HAS_RES:
        acc += tl.load(res + rows[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y + rows[:, None] * N + cols[None, :], acc.to(y.dtype.element_ty), mask=mask)


@triton.jit
def gate_bwd_kernel(dg, o, r, nw, g, do, dr, dnw, R, RS, eps, H: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                    BR: tl.constexpr, LOOP: tl.constexpr, GATE_FIRST: tl.constexpr):
    """One program per LOOP·BR head-rows: recomputes the norm statistics and the gate from o and r,
    writes g (for dW_o), dr, do, and its partial sum of the norm weight's gradient, dnw[pid, :V].
    x is the norm's input (o, or u = o ⊙ s when GATE_FIRST) and x̂ = x · rstd."""
    pid = tl.program_id(0)
    vv = tl.arange(0, BV)
    mv = vv < V
    wn = tl.load(nw + vv, mask=mv, other=0.0).to(tl.float32)
    dw = tl.zeros([BV], dtype=tl.float32)
    for i in range(LOOP):
        rows = (pid * LOOP + i) * BR + tl.arange(0, BR)
        mask = (rows < R)[:, None] & mv[None, :]
        at = rows[:, None] * V + vv[None, :]
        ob = _head_rows(o, rows, vv, mask, V)
        rb = _gate_rows(r, rows, vv, mask, RS, H, V)
        dgb = _head_rows(dg, rows, vv, mask, V)
        sg = tl.sigmoid(rb)
        s = rb * sg                                                                          # silu(r)
        if GATE_FIRST:
            x = ob * s
        else:
            x = ob
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / V + eps)
        xh = x * rstd[:, None]                                                               # x̂
        n = xh * wn[None, :]
        if GATE_FIRST:                                  # g = n: the norm's output is the gate's result
            dn = dgb                                                                         # d(x̂·w)
            tl.store(g + at, n.to(g.dtype.element_ty), mask=mask)
        else:                                           # g = n ⊙ s
            dn = dgb * s
            tl.store(g + at, (n * s).to(g.dtype.element_ty), mask=mask)
            tl.store(dr + at, (dgb * n * sg * (1.0 + rb * (1.0 - sg))).to(dr.dtype.element_ty), mask=mask)
        dxh = dn * wn[None, :]                                                               # dx̂
        c = tl.sum(dxh * xh, axis=1) / V           # masked channels: x̂ = 0 there, so they add nothing
        dx = rstd[:, None] * (dxh - xh * c[:, None])
        if GATE_FIRST:                                  # x = o ⊙ s
            tl.store(do + at, (dx * s).to(do.dtype.element_ty), mask=mask)
            tl.store(dr + at, (dx * ob * sg * (1.0 + rb * (1.0 - sg))).to(dr.dtype.element_ty), mask=mask)
        else:
            tl.store(do + at, dx.to(do.dtype.element_ty), mask=mask)
        dw += tl.sum(dn * xh, axis=0)                                                        # masked rows add 0
    tl.store(dnw + pid * V + vv, dw, mask=mv)
