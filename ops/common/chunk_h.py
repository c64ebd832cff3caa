"""Inter-chunk state recurrence, forward and backward, sequential over chunks.

With b the chunk-local cumulative log-decay (cumsum.py), chunk n's incoming state h_n and
b_L the value at the chunk's last valid row:
    forward:   h_{n+1} = exp(b_L) ⊙ h_n + (k ⊙ exp(b_L − b))ᵀ v          (stores every h_n)
    backward:  dh_n = exp(b_L) ⊙ dh_{n+1} + (scale · q ⊙ exp(b))ᵀ do     (stores dh_{n+1} per chunk)
States are [K, V] per (batch, head), tiled BK × BV; decay broadcasts over V (and over K when it is
a scalar per head: SCALAR). The recurrence runs in fp32 registers; the per-chunk copies h_n and
dh_{n+1} are stored in the inputs' dtype, as flash-linear-attention stores h: every consumer feeds
them to a tensor-core dot in that dtype anyway, so bf16 storage loses nothing there and halves the
traffic. Initial and final states stay fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.common.tiles import dot_precision, tile


@triton.jit
def chunk_fwd_h_kernel(k, v, b, h, h0, ht, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SCALAR: tl.constexpr,
                       USE_H0: tl.constexpr, STORE_HT: tl.constexpr, PREC: tl.constexpr):
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k[:, None] < K) & (o_v[None, :] < V)
    p_state = (i_bh * K + o_k[:, None]) * V + o_v[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + p_state, mask=m_kv, other=0.0).to(tl.float32)
    for i_t in range(NT):
        tl.store(h + ((i_b * NT + i_t) * H + i_h) * K * V + (o_k[:, None] * V + o_v[None, :]),
                 b_h.to(h.dtype.element_ty), mask=m_kv)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        last = tl.minimum(i_t * BT + BT, T) - 1
        b_k = tl.load(k + ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :],
                      mask=m_t[:, None] & (o_k[None, :] < K), other=0.0)
        b_v = tl.load(v + ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :],
                      mask=m_t[:, None] & (o_v[None, :] < V), other=0.0)
        if SCALAR:
            b_b = tl.load(b + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.0)
            b_bl = tl.load(b + (i_b * T + last) * H + i_h)
            b_kd = b_k * tl.exp(tl.where(m_t, b_bl - b_b, 0.0))[:, None]
            b_h *= tl.exp(b_bl)
        else:
            m_tk = m_t[:, None] & (o_k[None, :] < K)
            b_b = tl.load(b + ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :], mask=m_tk, other=0.0)
            b_bl = tl.load(b + ((i_b * T + last) * H + i_h) * K + o_k, mask=o_k < K, other=0.0)
            b_kd = b_k * tl.exp(tl.where(m_tk, b_bl[None, :] - b_b, 0.0))
            b_h *= tl.exp(b_bl)[:, None]
        b_h += tl.dot(tl.trans(b_kd.to(b_v.dtype)), b_v, input_precision=PREC)
    if STORE_HT:
        tl.store(ht + p_state, b_h, mask=m_kv)


@triton.jit
def chunk_bwd_dh_kernel(q, do, b, dh, dht, dh0, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                        V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        SCALAR: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
                        PREC: tl.constexpr):
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k[:, None] < K) & (o_v[None, :] < V)
    p_state = (i_bh * K + o_k[:, None]) * V + o_v[None, :]
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_dh += tl.load(dht + p_state, mask=m_kv, other=0.0).to(tl.float32)
    for j in range(NT):
        i_t = NT - 1 - j
        tl.store(dh + ((i_b * NT + i_t) * H + i_h) * K * V + (o_k[:, None] * V + o_v[None, :]),
                 b_dh.to(dh.dtype.element_ty), mask=m_kv)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        last = tl.minimum(i_t * BT + BT, T) - 1
        b_q = tl.load(q + ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :],
                      mask=m_t[:, None] & (o_k[None, :] < K), other=0.0)
        b_do = tl.load(do + ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :],
                       mask=m_t[:, None] & (o_v[None, :] < V), other=0.0)
        if SCALAR:
            b_b = tl.load(b + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.0)
            b_bl = tl.load(b + (i_b * T + last) * H + i_h)
            b_qd = b_q * (tl.exp(b_b) * scale)[:, None]
            b_dh *= tl.exp(b_bl)
        else:
            m_tk = m_t[:, None] & (o_k[None, :] < K)
            b_b = tl.load(b + ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :], mask=m_tk, other=0.0)
            b_bl = tl.load(b + ((i_b * T + last) * H + i_h) * K + o_k, mask=o_k < K, other=0.0)
            b_qd = b_q * tl.exp(b_b) * scale
            b_dh *= tl.exp(b_bl)[:, None]
        b_dh += tl.dot(tl.trans(b_qd.to(b_do.dtype)), b_do, input_precision=PREC)
    if STORE_DH0:
        tl.store(dh0 + p_state, b_dh, mask=m_kv)


def chunk_fwd_h(k, v, b, h0, output_final_state: bool, chunk_size: int, **launch):
    """k: [B, T, H, K]; v: [B, T, H, V]; b: [B, T, H, K|1] fp32. Returns h [B, NT, H, K, V] in k's
    dtype (the state entering each chunk) and the final state [B, H, K, V] fp32, or None. launch:
    num_warps / num_stages for the kernel."""
    B, T, H, K = k.shape
    V, NT = v.shape[-1], triton.cdiv(T, chunk_size)
    BK, BV = tile(K), tile(V)
    h = torch.empty(B, NT, H, K, V, dtype=k.dtype, device=k.device)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=k.device) if output_final_state else None
    grid = (triton.cdiv(K, BK), triton.cdiv(V, BV), B * H)
    # 4 warps unpipelined: 0.282 → 0.210 ms at the GLA-340M layer on the H100, the same at the MVE shape
    # (scripts/debug_chunk_stages.py --sweep).
    chunk_fwd_h_kernel[grid](k, v, b, h, h0, ht, T, NT, H, K, V, chunk_size, BK, BV, b.shape[-1] == 1,
                             h0 is not None, output_final_state, dot_precision(v),
                             **(dict(num_warps=4, num_stages=1) | launch))
    return h, ht


def chunk_bwd_dh(q, do, b, dht, need_dh0: bool, scale: float, chunk_size: int):
    """Returns dh [B, NT, H, K, V] in q's dtype (gradient of the state *leaving* each chunk) and
    dh0 [B, H, K, V] fp32."""
    B, T, H, K = q.shape
    V, NT = do.shape[-1], triton.cdiv(T, chunk_size)
    BK, BV = tile(K), tile(V)
    dh = torch.empty(B, NT, H, K, V, dtype=q.dtype, device=q.device)
    dh0 = torch.empty(B, H, K, V, dtype=torch.float32, device=q.device) if need_dh0 else None
    grid = (triton.cdiv(K, BK), triton.cdiv(V, BV), B * H)
    chunk_bwd_dh_kernel[grid](q, do, b, dh, dht, dh0, scale, T, NT, H, K, V, chunk_size, BK, BV,
                              b.shape[-1] == 1, dht is not None, need_dh0, dot_precision(do))
    return dh, dh0


def _chunks(x: torch.Tensor, C: int) -> torch.Tensor:
    """[B, T, H, D] → [B, NT, C, H, D] fp32, zero-padded."""
    B, T, H, D = x.shape
    return torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, -T % C)).view(B, -1, C, H, D)


def _last(b: torch.Tensor, T: int, C: int) -> torch.Tensor:
    """b at each chunk's last valid row: [B, NT, H, S]."""
    idx = torch.clamp(torch.arange(C - 1, T + C - 1, C, device=b.device)[: -(-T // C)], max=T - 1)
    return b[:, idx].float()


def chunk_fwd_h_ref(k, v, b, h0, chunk_size):
    B, T, H, K = k.shape
    kc, vc, bc, bl = _chunks(k, chunk_size), _chunks(v, chunk_size), _chunks(b, chunk_size), _last(b, T, chunk_size)
    S = torch.zeros(B, H, K, v.shape[-1], device=k.device) if h0 is None else h0.float()
    hs = []
    for n in range(kc.shape[1]):
        hs.append(S)
        valid = (torch.arange(chunk_size, device=k.device) + n * chunk_size < T)[None, :, None, None]
        kd = kc[:, n] * torch.where(valid, (bl[:, n, None] - bc[:, n]).exp(), 0.0)   # [B, C, H, K]
        S = bl[:, n].exp()[..., None] * S + torch.einsum("bchk,bchv->bhkv", kd, vc[:, n])
    return torch.stack(hs, 1), S


def chunk_bwd_dh_ref(q, do, b, dht, scale: float, chunk_size: int):
    B, T, H, K = q.shape
    qc, doc, bc, bl = _chunks(q, chunk_size), _chunks(do, chunk_size), _chunks(b, chunk_size), _last(b, T, chunk_size)
    dS = torch.zeros(B, H, K, do.shape[-1], device=q.device) if dht is None else dht.float()
    dhs = []
    for n in reversed(range(qc.shape[1])):
        dhs.append(dS)
        dS = bl[:, n].exp()[..., None] * dS + torch.einsum("bchk,bchv->bhkv", qc[:, n] * bc[:, n].exp() * scale, doc[:, n])
    return torch.stack(dhs[::-1], 1), dS
