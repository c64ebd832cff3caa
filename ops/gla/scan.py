"""The fused GLA forward in one launch: each program owns one (batch, head, V tile) and
walks its chunks in order with the state h [K, BV] in fp32 registers, so the cumsum, the state
pass, the intra-chunk scores and the output (`chunk`'s four kernels) never meet in HBM.

Per chunk, with b = cumsum(g) inside the chunk and b_L its value at the last row:

    o = (scale · q ⊙ exp(b)) h  +  mask(q̃ k̃ᵀ) v,     q̃ = scale · q ⊙ exp(b − b_L),  k̃ = k ⊙ exp(b_L − b)
    h ← exp(b_L) ⊙ h + k̃ᵀ v

k̃ is also the state update's decayed key, so the scores cost one [C, K]·[K, C] dot. q̃ ⊙ k̃ is
exactly exp(b_i − b_j) for i ≥ j, but q̃ alone grows to exp(−b_L): the factorisation is used only
while −b_L ≤ max_range for every key dim (per-step log-decays summing to at most 64 over the chunk:
every realistic GLA gate). A chunk with a stronger decay (the tests' −50 per step) takes the exact
token-by-token recurrence instead, h ← exp(g_t) ⊙ h + k_tᵀ v_t, o_t = scale · q_t h, in the same
registers; it is slow but never overflows. Both paths are tested against naive.

For the backward it stores b (fp32) and the state entering each chunk, h [B, NT, H, K, V], as
ops/chunkwise/state.py's chunk_fwd_h does (scan_bwd.py reads both); with `interval` a multiple of the chunk
size, only the state entering every interval-th row (chunk_fwd_h_from recomputes the others).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.chunkwise.resets import reset_args, reset_fwd, store_last
from ops.varlen import Documents
from ops.gla.movement import MIN_BV, device_model, kernel_tiles
from ops.triton_utils import cdiv, dot_precision, next_power_of_2, row_offsets

MAX_RANGE = 64.0   # exp(64) = 6e27: q̃ and every masked-out score stay far below fp32's and bf16's 3e38


@triton.jit
def dot_split(a, b, like, PREC: tl.constexpr, SPLIT: tl.constexpr):
    """a · b for fp32 tiles on tensor cores of like's dtype. SPLIT (bf16/fp16 inputs): each operand as a
    high and a low part, hi·hi + lo·hi + hi·lo, about 16 mantissa bits where one bf16 cast keeps 8. The
    scores need it: `chunk` forms the diagonal 16 × 16 blocks elementwise in fp32, and with one cast
    here the two copies of each score in dq and dk (q ⊙ dq − k ⊙ dk) no longer cancel in db: dg's
    error was 3× chunk's at the MVE shape (4.2e-3 against 1.4e-3)."""
    a_hi = a.to(like.dtype)
    b_hi = b.to(like.dtype)
    out = tl.dot(a_hi, b_hi, input_precision=PREC)
    if SPLIT:
        out += tl.dot((a - a_hi.to(tl.float32)).to(like.dtype), b_hi, input_precision=PREC)
        out += tl.dot(a_hi, (b - b_hi.to(tl.float32)).to(like.dtype), input_precision=PREC)
    return out


@triton.jit
def load_chunk_keys(q, k, b, p_tk, m_tk, p_bl, m_k):
    """One key tile of a chunk for the factorised scores: q, k and b [C, BK] at offsets p_tk, and b_L [BK], b at
    the chunk's last valid row (offsets p_bl). b's padded rows are set to b_L, so every exponent of
    exp(b − b_L) and exp(b_L − b) is 0 there, whatever the padding holds."""
    b_bl = tl.load(b + p_bl, mask=m_k, other=0.0)
    b_q = tl.load(q + p_tk, mask=m_tk, other=0.0)
    b_k = tl.load(k + p_tk, mask=m_tk, other=0.0)
    b_b = tl.where(m_tk, tl.load(b + p_tk, mask=m_tk, other=0.0), b_bl[None, :])
    return b_q, b_k, b_b, b_bl


@triton.jit
def fused_scan_fwd_kernel(q, k, v, g, o, b, h, h0, ht, scale, T, NT, H: tl.constexpr, K: tl.constexpr,
                          V: tl.constexpr, BT: tl.constexpr, NS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                          MAXR: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, SAVE: tl.constexpr,
                          PREC: tl.constexpr, SPLIT: tl.constexpr, reset=None, HAS_RESET: tl.constexpr = False):
    """HAS_RESET (packed documents, B = 1; ops/chunkwise/resets.py): the state restarts at each document's first
    chunk from h0 [N, H, K, V] or zero, and ht [N, H, K, V] gets each document's final state."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_state = (i_bh * K + o_k[:, None]) * V + o_v[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0 and not HAS_RESET:
        b_h += tl.load(h0 + p_state, mask=m_kv, other=0.0).to(tl.float32)
    causal = o_c[:, None] >= o_c[None, :]
    for i_t in range(NT):
        if HAS_RESET:
            b_h = reset_fwd(b_h, reset, h0, ht, i_t, i_h, o_k, o_v, m_kv, H, K, V, USE_H0, STORE_HT)
        o_t = i_t * BT + o_c
        m_t = o_t < T
        m_tk = m_t[:, None] & m_k[None, :]
        p_tk = row_offsets(i_b, i_h, o_t[:, None], T, H, K) + o_k[None, :]
        p_tv = row_offsets(i_b, i_h, o_t[:, None], T, H, V) + o_v[None, :]
        if SAVE:
            if i_t % NS == 0:                           # the kept states: every NS-th chunk's
                tl.store(h + ((i_b * tl.cdiv(NT, NS) + i_t // NS) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                         b_h.to(h.dtype.element_ty), mask=m_kv)
        b_g = tl.load(g + p_tk, mask=m_tk, other=0.0).to(tl.float32)
        b_b = tl.cumsum(b_g, axis=0)
        if SAVE:
            if i_v == 0:
                tl.store(b + p_tk, b_b, mask=m_tk)
        b_bl = tl.sum(b_g, axis=0)                      # b at the last valid row: padded rows add 0
        if tl.max(-b_bl, axis=0) <= MAXR:
            b_q = tl.load(q + p_tk, mask=m_tk, other=0.0)
            b_k = tl.load(k + p_tk, mask=m_tk, other=0.0)
            b_v = tl.load(v + p_tv, mask=m_t[:, None] & m_v[None, :], other=0.0)
            b_qs = b_q * tl.exp(b_b) * scale
            b_kd = b_k * tl.exp(b_bl[None, :] - b_b)
            b_A = tl.where(causal, dot_split(b_qs * tl.exp(-b_bl)[None, :], tl.trans(b_kd), b_v, PREC, SPLIT), 0.0)
            b_o = tl.dot(b_qs.to(b_v.dtype), b_h.to(b_v.dtype), input_precision=PREC)
            b_o += tl.dot(b_A.to(b_v.dtype), b_v, input_precision=PREC)
            tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])
            b_h = b_h * tl.exp(b_bl)[:, None] + tl.dot(tl.trans(b_kd.to(b_v.dtype)), b_v, input_precision=PREC)
        else:
            for j in range(tl.minimum(BT, T - i_t * BT)):
                p_k = row_offsets(i_b, i_h, i_t * BT + j, T, H, K) + o_k
                p_v = row_offsets(i_b, i_h, i_t * BT + j, T, H, V) + o_v
                b_qr = tl.load(q + p_k, mask=m_k, other=0.0).to(tl.float32)
                b_kr = tl.load(k + p_k, mask=m_k, other=0.0).to(tl.float32)
                b_gr = tl.load(g + p_k, mask=m_k, other=0.0).to(tl.float32)
                b_vr = tl.load(v + p_v, mask=m_v, other=0.0).to(tl.float32)
                b_h = b_h * tl.exp(b_gr)[:, None] + b_kr[:, None] * b_vr[None, :]
                tl.store(o + p_v, (tl.sum(b_qr[:, None] * b_h, axis=0) * scale).to(o.dtype.element_ty), mask=m_v)
    if STORE_HT:
        if HAS_RESET:
            store_last(b_h, reset, ht, NT, i_h, o_k, o_v, m_kv, H, K, V)
        else:
            tl.store(ht + p_state, b_h, mask=m_kv)


def fused_scan_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float,
                   initial_state: torch.Tensor | None, output_final_state: bool, chunk_size: int, save: bool,
                   max_range: float = MAX_RANGE, interval: int | None = None, docs: Documents | None = None,
                   **launch):
    """q, k, g: [B, T, H, K] (g the per-step log-decay, ≤ 0); v: [B, T, H, V]; initial_state [B, H, K, V].
    Returns o [B, T, H, V] (v's dtype), the final state (fp32, or None), and with `save` the
    backward's b [B, T, H, K] fp32 (chunk-local cumsum of g) and h [B, cdiv(T, interval), H, K, V] (the
    state entering each chunk, or with `interval` a multiple of chunk_size only every interval-th row's;
    v's dtype), else None, None.
    max_range < 0 forces the exact path everywhere (tests); launch may override BV (≥ MIN_BV on a GPU),
    num_warps, num_stages (sweeps). BV and num_warps come from the data-movement model (movement.kernel_tiles;
    its choices at K = 64 and at K = 128, V = 256 match the best of H100 sweeps).
    docs: packed documents in the chunk-aligned layout (B = 1; initial and final states [N, H, K, V])."""
    B, T, H, K = q.shape
    V, NT = v.shape[-1], cdiv(T, chunk_size)
    interval = interval or chunk_size
    if interval % chunk_size:
        raise ValueError(f"fused_scan_fwd keeps states every interval = {interval} rows: a multiple of the "
                         f"chunk size {chunk_size}")
    if K > 256:
        raise ValueError(f"fused_scan_fwd holds a whole key row per program: K ≤ 256, got {K}")
    q, k, v, g = (x.contiguous() for x in (q, k, v, g))
    t = kernel_tiles(B, T, H, K, V, chunk_size, v.element_size(), device_model(q.device))
    if t is None and not {"BV", "num_warps"} <= set(launch):
        raise ValueError(f"no fused scan tiling fits on chip at K = {K}, V = {V}, C = {chunk_size} "
                         "(ops/gla/movement.py); run the parallel stages (ops.gla.fused.scan_forward)")
    tiles = (dict(BV=t.BV, num_warps=t.num_warps) if t else {}) | launch
    BV = tiles.pop("BV")
    if BV < MIN_BV and q.is_cuda:
        raise ValueError(f"fused_scan_fwd: BV = {BV} miscompiles on Hopper (Triton 3.6: wrong o or a fault without "
                         f"`save`); launch with BV >= {MIN_BV} (ops/gla/movement.py MIN_BV)")
    o = torch.empty_like(v)
    ht = torch.empty(B if docs is None else docs.n, H, K, V, dtype=torch.float32, device=q.device) \
        if output_final_state else None
    b = torch.empty(B, T, H, K, dtype=torch.float32, device=q.device) if save else None
    h = torch.empty(B, cdiv(T, interval), H, K, V, dtype=v.dtype, device=q.device) if save else None
    h0 = initial_state.contiguous() if initial_state is not None else None
    BK = max(16, next_power_of_2(K))
    grid = (cdiv(V, BV), B * H)
    fused_scan_fwd_kernel[grid](q, k, v, g, o, b, h, h0, ht, scale, T, NT, H, K, V, chunk_size, interval // chunk_size,
                                BK, BV, float(max_range), h0 is not None, output_final_state, save, dot_precision(v),
                                v.dtype != torch.float32, **tiles,
                                **reset_args(docs))
    return o, ht, b, h
