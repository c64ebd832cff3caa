"""Gated DeltaNet's gates on the input projection's output, one Triton kernel each way; fused.py launches them.

y [M, N] row-major (row stride S, unit column stride) holds the gates' pre-activations in columns [OB, OB + H)
(β) and [OA, OA + H) (g), and zeros from OA + H to N (the width's padding). With a = ya + dt_bias and
c = exp(A_log), per head:

    gates_fwd_kernel   β = sigmoid(yb),  g = −c · softplus(a)                                      (fp32 [M, H])
    gates_bwd_kernel   dy[:, OB + h] = dβ · β(1 − β),  dy[:, OA + h] = dg · (−c) · sigmoid(a),  dy[:, OA + H:] = 0,
                       and per program the partial sums over its rows of dg · g (→ dA_log, since ∂g/∂A_log = g)
                       and of dg · ∂g/∂a (→ ddt_bias), fp32 [programs, H]

A program covers BR rows × HP heads (H padded to a power of two, masked); every value in fp32, dy stored in its
dtype. softplus(a) = a past 20, else log(1 + eˣ), as F.softplus's default threshold.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _softplus(a):
    return tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))


@triton.jit
def _load(y, A_log, dt_bias, M, H, S, OB, OA, BR: tl.constexpr, HP: tl.constexpr):
    """This program's rows [BR, 1] (int64), heads [1, HP], mask, yb, a = ya + dt_bias and c = exp(A_log) [1, HP]."""
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)[:, None]
    heads = tl.arange(0, HP)[None, :]
    hm = heads < H
    mask = (rows < M) & hm
    yb = tl.load(y + rows * S + OB + heads, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(y + rows * S + OA + heads, mask=mask, other=0.0).to(tl.float32)
    a += tl.load(dt_bias + heads, mask=hm, other=0.0).to(tl.float32)
    c = tl.exp(tl.load(A_log + heads, mask=hm, other=0.0).to(tl.float32))
    return rows, heads, mask, yb, a, c


@triton.jit
def gates_fwd_kernel(y, A_log, dt_bias, beta, g, M, H, S, OB, OA, BR: tl.constexpr, HP: tl.constexpr):
    """β, g [M, H] fp32 contiguous from y's gate columns."""
    rows, heads, mask, yb, a, c = _load(y, A_log, dt_bias, M, H, S, OB, OA, BR, HP)
    tl.store(beta + rows * H + heads, tl.sigmoid(yb), mask=mask)
    tl.store(g + rows * H + heads, -c * _softplus(a), mask=mask)


@triton.jit
def gates_bwd_kernel(y, A_log, dt_bias, dbeta, dg, dy, dA, ddt, M, H, S, SD, OB, OA, N, BR: tl.constexpr,
                     HP: tl.constexpr, PADP: tl.constexpr):
    """dy's gate and padding columns (dy with row stride SD) and this program's partial sums dA[p, :H],
    ddt[p, :H] (fp32); dbeta, dg [M, H] fp32 contiguous."""
    rows, heads, mask, yb, a, c = _load(y, A_log, dt_bias, M, H, S, OB, OA, BR, HP)
    db = tl.load(dbeta + rows * H + heads, mask=mask, other=0.0)
    dgv = tl.load(dg + rows * H + heads, mask=mask, other=0.0)
    b = tl.sigmoid(yb)
    tl.store(dy + rows * SD + OB + heads, (db * b * (1.0 - b)).to(dy.dtype.element_ty), mask=mask)
    da = dgv * -c * tl.sigmoid(a)
    tl.store(dy + rows * SD + OA + heads, da.to(dy.dtype.element_ty), mask=mask)
    pad = tl.arange(0, PADP)[None, :]
    tl.store(dy + rows * SD + OA + H + pad, tl.zeros([BR, PADP], dtype=dy.dtype.element_ty),
             mask=(rows < M) & (OA + H + pad < N))
    p = tl.program_id(0)
    tl.store(dA + p * H + heads, tl.sum(dgv * -c * _softplus(a), axis=0)[None, :], mask=heads < H)
    tl.store(ddt + p * H + heads, tl.sum(da, axis=0)[None, :], mask=heads < H)
