"""Triton kernels of the fused SwiGLU middle; fused.py launches them.

Rows m flattened from the leading dims, M rows. gu [M, 2F] holds the gate g in columns [0, F) and the up
projection u in [F, 2F); its column stride is 1 and its row stride S ≥ 2F (S > 2F when gu is a column slice of a
wider GEMM output). h, dh [M, F] and dgu [M, 2F] are contiguous. A program covers a [BR, BF] tile of the F
columns: it reads the tile's g and u (two loads of gu at column offsets c and F + c) and, in the backward, dh,
and writes h, or both halves of dgu. All math in fp32, stored in the output's dtype.

    swiglu_fwd_kernel   h  = g·σ(g) ⊙ u
    swiglu_bwd_kernel   dg = dh ⊙ u ⊙ σ(g)(1 + g(1 − σ(g))),   du = dh ⊙ g·σ(g)      → dgu = [dg | du]

σ(g) = 1/(1 + e^(−g)) saturates to exactly 0 or 1 for |g| past ~88 (e^(−g) = inf or 0, never NaN), so h and
both gradients stay finite for any finite g. Programs walk the F columns fastest (pid = row block · NC + column
block), so neighbouring programs read neighbouring bytes of the same rows. The tile's first row is an int64 offset
(row0·S, row0·F), the in-tile offsets int32: no overflow at any M.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile(pid, M, F, BR: tl.constexpr, BF: tl.constexpr):
    """This program's first row (int64), its in-tile rows [BR] and columns [BF] (absolute, int32) and the mask of
    the tile's elements that exist, [BR, BF]."""
    nc = tl.cdiv(F, BF)
    row0 = (pid // nc).to(tl.int64) * BR
    rows = tl.arange(0, BR)
    cols = (pid % nc) * BF + tl.arange(0, BF)
    mask = (rows < M - row0)[:, None] & (cols < F)[None, :]
    return row0, rows, cols, mask


@triton.jit
def swiglu_fwd_kernel(gu, h, M, F, S, BR: tl.constexpr, BF: tl.constexpr):
    """h[M, F] = silu(gu[:, :F]) ⊙ gu[:, F:], one [BR, BF] tile a program; gu with row stride S."""
    row0, rows, cols, mask = _tile(tl.program_id(0), M, F, BR, BF)
    at = rows[:, None] * S + cols[None, :]
    gb = gu + row0 * S
    g = tl.load(gb + at, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gb + F + at, mask=mask, other=0.0).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(h + row0 * F + rows[:, None] * F + cols[None, :], out.to(h.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd_kernel(gu, dh, dgu, M, F, S, BR: tl.constexpr, BF: tl.constexpr):
    """dgu[M, 2F] = [dg | du] from gu (row stride S) and dh[M, F], one [BR, BF] tile of F a program: both halves
    of the tile's rows (g, u recomputed from gu, nothing saved but gu)."""
    row0, rows, cols, mask = _tile(tl.program_id(0), M, F, BR, BF)
    at = rows[:, None] * S + cols[None, :]
    gb = gu + row0 * S
    g = tl.load(gb + at, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gb + F + at, mask=mask, other=0.0).to(tl.float32)
    d = tl.load(dh + row0 * F + rows[:, None] * F + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    sg = tl.sigmoid(g)
    dg = d * u * sg * (1.0 + g * (1.0 - sg))
    du = d * (g * sg)
    out = dgu + row0 * (2 * F) + rows[:, None] * (2 * F) + cols[None, :]
    tl.store(out, dg.to(dgu.dtype.element_ty), mask=mask)
    tl.store(out + F, du.to(dgu.dtype.element_ty), mask=mask)
