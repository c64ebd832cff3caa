"""The RA+MLA backward's memory-bound passes around the flash kernels (flash_kernels.py): δ before them, and
after them the sum that turns the kernels' fp32 partials of dk and dv into the input dtype in one pass with one
rounding (as torch ops the same glue costs about five times as long).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def ramla_bwd_delta_kernel(o, do, delta, R, L: tl.constexpr, BR: tl.constexpr):
    """δ_r = do_r·o_r in fp32 for the R rows of o, do [R, L] (input dtype) → delta (R,). One read of each in
    the input dtype, where torch ops (two fp32 casts, a product and a sum) move 7× the bytes."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    m_r = o_r < R
    p = o_r[:, None] * L + tl.arange(0, L)[None, :]
    b_o = tl.load(o + p, mask=m_r[:, None], other=0.0).to(tl.float32)
    b_do = tl.load(do + p, mask=m_r[:, None], other=0.0).to(tl.float32)
    tl.store(delta + o_r, tl.sum(b_o * b_do, 1), mask=m_r)


@triton.jit
def _far_head_sum(x, i_b, o_t, m_t, o_l, sb, sh, st, H: tl.constexpr, L: tl.constexpr, BT: tl.constexpr):
    """Σ_h x[i_b, h, o_t] of SDPA's per-head far-field gradient [B, H, T', L] (last dim contiguous), fp32."""
    acc = tl.zeros([BT, L], dtype=tl.float32)
    base = x + i_b * sb + o_t[:, None].to(tl.int64) * st + o_l[None, :]
    for i_h in range(H):
        acc += tl.load(base + tl.cast(i_h, tl.int64) * sh, mask=m_t[:, None], other=0.0).to(tl.float32)
    return acc


@triton.jit
def ramla_bwd_reduce_kernel(dk_part, dv_part, dk_far, dv_far, dk, dv, T, T_far, skb, skh, skt, svb, svh, svt,
                            KS: tl.constexpr, VS: tl.constexpr, H: tl.constexpr, L: tl.constexpr,
                            BT: tl.constexpr, FAR: tl.constexpr):
    """dk, dv [B, T, L] (input dtype) = the sums of the backward kernels' partials dk_part [B, T, KS, L] and
    dv_part [B, T, VS, L] (fp32, one slot per head group and kernel), plus with FAR SDPA's per-head dk_far,
    dv_far [B, H, T_far, L] (strides sk*, sv*) of the keys 0 … T_far − 1: one pass, one rounding."""
    i_t, i_b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_l = tl.arange(0, L)
    b_dk = tl.zeros([BT, L], dtype=tl.float32)
    b_dv = tl.zeros([BT, L], dtype=tl.float32)
    row = (i_b * T + o_t[:, None]) * L
    for s in range(KS):
        b_dk += tl.load(dk_part + row * KS + s * L + o_l[None, :], mask=m_t[:, None], other=0.0)
    for s in range(VS):
        b_dv += tl.load(dv_part + row * VS + s * L + o_l[None, :], mask=m_t[:, None], other=0.0)
    if FAR:
        m_f = o_t < T_far
        b_dk += _far_head_sum(dk_far, i_b, o_t, m_f, o_l, skb, skh, skt, H, L, BT)
        b_dv += _far_head_sum(dv_far, i_b, o_t, m_f, o_l, svb, svh, svt, H, L, BT)
    tl.store(dk + row + o_l[None, :], b_dk.to(dk.dtype.element_ty), mask=m_t[:, None])
    tl.store(dv + row + o_l[None, :], b_dv.to(dv.dtype.element_ty), mask=m_t[:, None])
