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

Split (the `fused` backend's `state` component): the recurrence is sequential over
chunks, so it launches only (K/BK)·(V/BV)·B·H programs: 16 on the H100's 132 SMs at B1 H4 K=V=128.
With `segments` = S > 1 each program takes one of S contiguous chunk ranges, starts it from zero
and also writes the range's end state E_s and total log-decay Λ_s; state_fixup_kernel then adds each
range's missing carry, H_s = exp(Λ_{s−1}) ⊙ H_{s−1} + E_{s−1} (H_0 = 0), decayed to every chunk of
the range. The backward runs the same scheme from the end. S = 1 is the plain recurrence.

step_decays: b holds the per-step log-decays (any float dtype) and each kernel forms the chunk-local cumsum in
registers. In bf16 that reads a fifth fewer bytes, but the scan in the kernel costs what the read saves, so the
models pass fp32 cumulative decays.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.varlen import Documents
from ops.chunkwise.resets import reset_args, reset_bwd, reset_fwd, store_dh0, store_last
from ops.triton_utils import cdiv, dot_precision, load_rows, row_offsets, sm_count, tile


@triton.jit
def _chunk_decays(b, i_b, i_h, i_t, T, o_t, m_t, o_k, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                  SCALAR: tl.constexpr, STEP: tl.constexpr):
    """Chunk i_t's chunk-local cumulative log-decay [BT, BK] ([BT] when SCALAR) and its value at the chunk's
    last valid row [BK] ([] when SCALAR). STEP: b holds per-step log-decays in any float dtype, and the cumsum
    is taken here in fp32 (rows past T load 0, so the total is the last valid row's value); else b holds the
    cumsum (cumsum.py) in fp32."""
    # one return: Triton 3.6 type-checks every return of a function, constexpr-pruned branches included
    if SCALAR:
        p_b, m_b = b + row_offsets(i_b, i_h, o_t, T, H, 1), m_t
    else:
        p_b, m_b = b + row_offsets(i_b, i_h, o_t[:, None], T, H, K) + o_k[None, :], m_t[:, None] & (o_k[None, :] < K)
    if STEP:
        b_g = tl.load(p_b, mask=m_b, other=0.0).to(tl.float32)
        b_b = tl.cumsum(b_g, axis=0)
        b_bl = tl.sum(b_g, axis=0)
    else:
        b_b = tl.load(p_b, mask=m_b, other=0.0)
        last = tl.minimum(i_t * BT + BT, T) - 1
        if SCALAR:
            b_bl = tl.load(b + row_offsets(i_b, i_h, last, T, H, 1))
        else:
            b_bl = tl.load(b + row_offsets(i_b, i_h, last, T, H, K) + o_k, mask=o_k < K, other=0.0)
    return b_b, b_bl


@triton.jit
def _chunk_gaps(gap, b, i_b, i_h, i_t, T, o_t, m_t, o_k, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                SCALAR: tl.constexpr):
    """Chunk i_t's gaps b_L − b [BT, BK] ([BT] when SCALAR) from gap, and b at its last valid row [BK] ([])."""
    last = tl.minimum(i_t * BT + BT, T) - 1
    if SCALAR:
        b_d = tl.load(gap + row_offsets(i_b, i_h, o_t, T, H, 1), mask=m_t, other=0.0)
        b_bl = tl.load(b + row_offsets(i_b, i_h, last, T, H, 1))
    else:
        b_d = load_rows(gap, i_b, i_h, o_t, m_t, o_k, o_k < K, T, H, K)
        b_bl = tl.load(b + row_offsets(i_b, i_h, last, T, H, K) + o_k, mask=o_k < K, other=0.0)
    return b_d, b_bl


@triton.jit
def chunk_fwd_h_kernel(k, v, b, h, h0, ht, lam, T, NT, NS, S: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
                       V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                       SCALAR: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, PREC: tl.constexpr,
                       SEEDED: tl.constexpr, STEP: tl.constexpr = False, reset=None, hd=None,
                       HAS_RESET: tl.constexpr = False, gap=None, GAP: tl.constexpr = False, HG: tl.constexpr = 1):
    """Chunks [i_s·NS, (i_s+1)·NS) of one (batch·head); ht [B, S, H, K, V] gets each segment's end
    state and lam [B, S, H, K|1] its total log-decay (S = 1: the final state; lam unused).
    GAP: the exponents b_L − b are read from gap (cumsum.chunk_cumsum_gap: each summed by itself) instead of formed
    from b, which is then read at each chunk's last row alone.
    SEEDED: each segment starts from its own state h0 [B, S, H, K, V] and stores no end (chunk_fwd_h_from).
    HAS_RESET (packed documents, S = 1 or SEEDED; resets.py): the state restarts at each document's first chunk
    from hd [N, H, K, V] (USE_H0) or zero, and ht [N, H, K, V] gets each document's final state.
    HG: heads per k head (k [B, T, H / HG, K], head h reading k's head h // HG)."""
    i_k, i_v, i_bhs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_s = i_bhs // S, i_bhs % S
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k[:, None] < K) & (o_v[None, :] < V)
    p_state = (i_bh * K + o_k[:, None]) * V + o_v[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if SEEDED:
        b_h += tl.load(h0 + row_offsets(i_b, i_h, i_s, S, H, K * V) + (o_k[:, None] * V + o_v[None, :]), mask=m_kv,
                       other=0.0).to(tl.float32)
    elif USE_H0 and not HAS_RESET:
        if i_s == 0:
            b_h += tl.load(h0 + p_state, mask=m_kv, other=0.0).to(tl.float32)
    b_lam = tl.zeros([BK], dtype=tl.float32)
    for i_t in range(i_s * NS, tl.minimum(i_s * NS + NS, NT)):
        if HAS_RESET:
            b_h = reset_fwd(b_h, reset, hd, ht, i_t, i_h, o_k, o_v, m_kv, H, K, V, USE_H0, STORE_HT and not SEEDED)
        tl.store(h + row_offsets(i_b, i_h, i_t, NT, H, K * V) + (o_k[:, None] * V + o_v[None, :]),
                 b_h.to(h.dtype.element_ty), mask=m_kv)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        b_k = load_rows(k, i_b, i_h // HG, o_t, m_t, o_k, o_k < K, T, H // HG, K)
        b_v = load_rows(v, i_b, i_h, o_t, m_t, o_v, o_v < V, T, H, V)
        if GAP:
            b_d, b_bl = _chunk_gaps(gap, b, i_b, i_h, i_t, T, o_t, m_t, o_k, H, K, BT, SCALAR)
        else:
            b_b, b_bl = _chunk_decays(b, i_b, i_h, i_t, T, o_t, m_t, o_k, H, K, BT, SCALAR, STEP)
            if SCALAR:
                b_d = b_bl - b_b
            else:
                b_d = b_bl[None, :] - b_b
        if SCALAR:
            b_kd = b_k * tl.exp(tl.where(m_t, b_d, 0.0))[:, None]
            b_h *= tl.exp(b_bl)
        else:
            b_kd = b_k * tl.exp(tl.where(m_t[:, None] & (o_k[None, :] < K), b_d, 0.0))
            b_h *= tl.exp(b_bl)[:, None]
        b_lam += b_bl
        b_h += tl.dot(tl.trans(b_kd.to(b_v.dtype)), b_v, input_precision=PREC)
    if HAS_RESET:
        if STORE_HT and not SEEDED:
            store_last(b_h, reset, ht, NT, i_h, o_k, o_v, m_kv, H, K, V)
    elif not SEEDED:
        _store_segment_end(ht, lam, b_h, b_lam, i_b, i_h, i_s, S, o_k, o_v, m_kv, H, K, V, SCALAR, STORE_HT)


@triton.jit
def _store_segment_end(ht, lam, b_h, b_lam, i_b, i_h, i_s, S, o_k, o_v, m_kv, H: tl.constexpr, K: tl.constexpr,
                       V: tl.constexpr, SCALAR: tl.constexpr, STORE_HT: tl.constexpr):
    """A segment's end state into ht [B, S, H, K, V] (S = 1: the final state, if asked) and, with
    S > 1, its total log-decay into lam [B, S, H, K|1]."""
    if STORE_HT or S > 1:
        p_seg = (i_b * S + i_s) * H + i_h
        tl.store(ht + p_seg * K * V + (o_k[:, None] * V + o_v[None, :]), b_h, mask=m_kv)
        if S > 1:
            if SCALAR:
                tl.store(lam + p_seg, tl.max(b_lam, axis=0))
            else:
                tl.store(lam + p_seg * K + o_k, b_lam, mask=o_k < K)


@triton.jit
def chunk_bwd_dh_kernel(q, do, b, dh, dht, dh0, lam, scale, T, NT, NS, S: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
                        V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        SCALAR: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
                        PREC: tl.constexpr, STEP: tl.constexpr = False, reset=None, HAS_RESET: tl.constexpr = False,
                        HG: tl.constexpr = 1):
    """The forward's segments run backwards: segment i_s starts from zero at its last chunk (dht
    for the last segment); dh0 [B, S, H, K, V] gets each segment's start gradient, lam its decay.
    HAS_RESET (packed documents, S = 1; resets.py): dh restarts from dht[d] at document d's last chunk, and
    dh0 [N, H, K, V] gets each document's start gradient. HG: heads per q head, as chunk_fwd_h_kernel's for k."""
    i_k, i_v, i_bhs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_s = i_bhs // S, i_bhs % S
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k[:, None] < K) & (o_v[None, :] < V)
    p_state = (i_bh * K + o_k[:, None]) * V + o_v[None, :]
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT and not HAS_RESET:
        if i_s == S - 1:
            b_dh += tl.load(dht + p_state, mask=m_kv, other=0.0).to(tl.float32)
    b_lam = tl.zeros([BK], dtype=tl.float32)
    t_end = tl.minimum(i_s * NS + NS, NT)
    for j in range(t_end - i_s * NS):
        i_t = t_end - 1 - j
        if HAS_RESET:
            b_dh = reset_bwd(b_dh, reset, dht, i_t, i_h, o_k, o_v, m_kv, H, K, V, USE_DHT)
        tl.store(dh + row_offsets(i_b, i_h, i_t, NT, H, K * V) + (o_k[:, None] * V + o_v[None, :]),
                 b_dh.to(dh.dtype.element_ty), mask=m_kv)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        b_q = load_rows(q, i_b, i_h // HG, o_t, m_t, o_k, o_k < K, T, H // HG, K)
        b_do = load_rows(do, i_b, i_h, o_t, m_t, o_v, o_v < V, T, H, V)
        b_b, b_bl = _chunk_decays(b, i_b, i_h, i_t, T, o_t, m_t, o_k, H, K, BT, SCALAR, STEP)
        if SCALAR:
            b_qd = b_q * (tl.exp(b_b) * scale)[:, None]
            b_dh *= tl.exp(b_bl)
        else:
            b_qd = b_q * tl.exp(b_b) * scale
            b_dh *= tl.exp(b_bl)[:, None]
        b_lam += b_bl
        b_dh += tl.dot(tl.trans(b_qd.to(b_do.dtype)), b_do, input_precision=PREC)
        if HAS_RESET:
            if STORE_DH0:
                store_dh0(b_dh, reset, dh0, i_t, i_h, o_k, o_v, m_kv, H, K, V)
    if not HAS_RESET:
        _store_segment_end(dh0, lam, b_dh, b_lam, i_b, i_h, i_s, S, o_k, o_v, m_kv, H, K, V, SCALAR, STORE_DH0)


@triton.jit
def state_fixup_kernel(h, e, lam, b, ht, T, NT, NS, S: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SCALAR: tl.constexpr,
                       REVERSE: tl.constexpr, STORE_HT: tl.constexpr, STEP: tl.constexpr = False):
    """Segment i_s's carry from the segments before it (after it: REVERSE), added to each of its
    chunks' stored states h [B, NT, H, K, V], decayed chunk by chunk; the segment that ends the scan
    stores the final state (forward: ht; REVERSE: dh0) [B, H, K, V]. e [B, S, H, K, V] fp32 and
    lam [B, S, H, K|1] come from the first pass."""
    i_k, i_v, i_bhs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bh, i_s = i_bhs // S, i_bhs % S
    i_b, i_h = i_bh // H, i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_kv = m_k[:, None] & (o_v[None, :] < V)
    p_kv = o_k[:, None] * V + o_v[None, :]
    b_c = tl.zeros([BK, BV], dtype=tl.float32)
    n_before = (S - 1 - i_s) if REVERSE else i_s
    for j in range(n_before):                          # S is small: every program rescans it
        i_p = (S - 1 - j) if REVERSE else j
        p_seg = (i_b * S + i_p) * H + i_h
        if SCALAR:
            b_c *= tl.exp(tl.load(lam + p_seg))
        else:
            b_c *= tl.exp(tl.load(lam + p_seg * K + o_k, mask=m_k, other=0.0))[:, None]
        b_c += tl.load(e + p_seg * K * V + p_kv, mask=m_kv, other=0.0)
    t_end = tl.minimum(i_s * NS + NS, NT)
    for j in range(t_end - i_s * NS):
        i_t = (t_end - 1 - j) if REVERSE else (i_s * NS + j)
        if n_before > 0:
            p_h = h + row_offsets(i_b, i_h, i_t, NT, H, K * V) + p_kv
            tl.store(p_h, (tl.load(p_h, mask=m_kv, other=0.0).to(tl.float32) + b_c).to(h.dtype.element_ty), mask=m_kv)
        if STEP:                                       # the chunk's total: its per-step decays summed
            o_t = i_t * BT + tl.arange(0, BT)
            b_tot = _chunk_decays(b, i_b, i_h, i_t, T, o_t, o_t < T, o_k, H, K, BT, SCALAR, STEP)[1]
        else:                                          # the cumsum at the chunk's last row
            last = tl.minimum(i_t * BT + BT, T) - 1
            if SCALAR:
                b_tot = tl.load(b + row_offsets(i_b, i_h, last, T, H, 1))
            else:
                b_tot = tl.load(b + row_offsets(i_b, i_h, last, T, H, K) + o_k, mask=m_k, other=0.0)
        if SCALAR:
            b_c *= tl.exp(b_tot)
        else:
            b_c *= tl.exp(b_tot)[:, None]
    if STORE_HT:
        if i_s == (0 if REVERSE else S - 1):
            p_seg = (i_b * S + i_s) * H + i_h
            b_c += tl.load(e + p_seg * K * V + p_kv, mask=m_kv, other=0.0)
            tl.store(ht + (i_bh * K + o_k[:, None]) * V + o_v[None, :], b_c, mask=m_kv)


def chunk_fwd_h(k, v, b, h0, output_final_state: bool, chunk_size: int, segments: int = 1, step_decays: bool = False,
                docs: Documents | None = None, gap: torch.Tensor | None = None, **launch):
    """k: [B, T, H, K], or [B, T, G, K] shared by groups of H / G heads (head h reads k's head h // (H / G));
    v: [B, T, H, V]; b: [B, T, H, K|1] fp32, chunk-local cumulative (cumsum.py). Returns
    h [B, NT, H, K, V] in k's dtype (the state entering each chunk) and the final state [B, H, K, V] fp32, or
    None. segments > 1: the split scan (module docstring; split_segments picks it). step_decays: b holds the
    per-step log-decays instead, in any float dtype (bf16 halves their read), and the kernels take the
    chunk-local cumsum in registers. launch: num_warps / num_stages for the first pass.
    docs (packed documents, B = 1, chunk-aligned; resets.py): the state restarts at each document from h0[n]
    ([N, H, K, V]) or zero and the final state is [N, H, K, V]; the scan is not split (segments must be 1).
    gap: the exponents b_L − b, each summed by itself (cumsum.chunk_cumsum_gap), read instead of formed from b."""
    B, T, G, K = k.shape
    H = v.shape[2]
    if gap is not None and step_decays:
        raise ValueError("chunk_fwd_h: gap goes with the cumulative b (step_decays=False); per-step decays are summed "
                         "in the kernel")
    V, NT = v.shape[-1], cdiv(T, chunk_size)
    BK, BV = tile(K), tile(V)
    NS, S = segment_plan(NT, segments)
    h = torch.empty(B, NT, H, K, V, dtype=k.dtype, device=k.device)
    ht = torch.empty(B if docs is None else docs.n, H, K, V, dtype=torch.float32, device=k.device) \
        if output_final_state else None
    e, lam = _segment_buffers(B, S, H, K, V, b.shape[-1], k.device, ht)
    grid = (cdiv(K, BK), cdiv(V, BV), B * H * S)
    # 4 warps unpipelined: the best of a launch sweep on the H100 (a quarter faster at the GLA-340M layer)
    chunk_fwd_h_kernel[grid](k, v, b, h, h0, e, lam, T, NT, NS, S, H, K, V, chunk_size, BK, BV, b.shape[-1] == 1,
                             h0 is not None, output_final_state, dot_precision(v), False, step_decays,
                             **_reset_args(docs, S, hd=h0), gap=gap, GAP=gap is not None, HG=H // G,
                             **(dict(num_warps=4, num_stages=1) | launch))
    if S > 1:
        state_fixup_kernel[grid](h, e, lam, b, ht, T, NT, NS, S, H, K, V, chunk_size, BK, BV, b.shape[-1] == 1,
                                 False, output_final_state, step_decays)
    return h, ht


def chunk_fwd_h_from(k, v, b, h_kept, chunk_size: int, interval: int, docs: Documents | None = None,
                     h0: torch.Tensor | None = None, **launch):
    """The state entering every chunk, h [B, NT, H, K, V] in k's dtype, recomputed from the states kept every
    `interval` rows (a multiple of chunk_size), h_kept [B, cdiv(T, interval), H, K, V]: one program per kept
    state walks the interval's chunks, so the recompute runs interval / chunk_size chunks deep, not NT.
    The backward of a chunk size larger than the kernels' sub-blocks (ops/gla/fused.py) calls it: the forward
    kept one state in interval / chunk_size. k, v, b as chunk_fwd_h's, b local to each chunk_size chunk.
    The kept-state count is a compile-time constant of the kernel (S): one compile per training length.
    docs, h0: packed documents as chunk_fwd_h's (a document starting inside an interval restarts there)."""
    B, T, H, K = k.shape
    V, NT = v.shape[-1], cdiv(T, chunk_size)
    NS, S = interval // chunk_size, h_kept.shape[1]
    if interval % chunk_size or S != cdiv(T, interval):
        raise ValueError(f"chunk_fwd_h_from: states kept every {interval} rows of T = {T} ({S} given) cannot seed "
                         f"chunks of {chunk_size}")
    BK, BV = tile(K), tile(V)
    h = torch.empty(B, NT, H, K, V, dtype=k.dtype, device=k.device)
    grid = (cdiv(K, BK), cdiv(V, BV), B * H * S)
    chunk_fwd_h_kernel[grid](k, v, b, h, h_kept.contiguous(), None, None, T, NT, NS, S, H, K, V, chunk_size, BK, BV,
                             b.shape[-1] == 1, h0 is not None and docs is not None, False, dot_precision(v), True,
                             **_reset_args(docs, 1, hd=h0), **(dict(num_warps=4, num_stages=1) | launch))
    return h


def chunk_bwd_dh(q, do, b, dht, need_dh0: bool, scale: float, chunk_size: int, segments: int = 1,
                 step_decays: bool = False, docs: Documents | None = None):
    """Returns dh [B, NT, H, K, V] in q's dtype (gradient of the state *leaving* each chunk) and
    dh0 [B, H, K, V] fp32. q, b, segments, step_decays and docs as chunk_fwd_h's k, b, ... (docs: dht and dh0
    [N, H, K, V])."""
    B, T, G, K = q.shape
    H = do.shape[2]
    V, NT = do.shape[-1], cdiv(T, chunk_size)
    BK, BV = tile(K), tile(V)
    NS, S = segment_plan(NT, segments)
    dh = torch.empty(B, NT, H, K, V, dtype=q.dtype, device=q.device)
    dh0 = torch.empty(B if docs is None else docs.n, H, K, V, dtype=torch.float32, device=q.device) \
        if need_dh0 else None
    e, lam = _segment_buffers(B, S, H, K, V, b.shape[-1], q.device, dh0)
    grid = (cdiv(K, BK), cdiv(V, BV), B * H * S)
    chunk_bwd_dh_kernel[grid](q, do, b, dh, dht, e, lam, scale, T, NT, NS, S, H, K, V, chunk_size, BK, BV,
                              b.shape[-1] == 1, dht is not None, need_dh0, dot_precision(do), step_decays,
                              **_reset_args(docs, S), HG=H // G)
    if S > 1:
        state_fixup_kernel[grid](dh, e, lam, b, dh0, T, NT, NS, S, H, K, V, chunk_size, BK, BV, b.shape[-1] == 1,
                                 True, need_dh0, step_decays)
    return dh, dh0


def _reset_args(docs: Documents | None, S: int, **extra) -> dict:
    """resets.reset_args plus `extra` (the forward's hd) with documents, none without; documents never split."""
    if docs is None:
        return {}
    if S != 1:
        raise ValueError("packed documents run the state pass unsplit (segments = 1)")
    return reset_args(docs) | extra


def _segment_buffers(B, S, H, K, V, decay_dim, device, final):
    """The first pass's per-segment end states and log-decays; with one segment, the end state is
    the final state itself (or nothing) and there is no decay to keep."""
    if S == 1:
        return final, None
    return (torch.empty(B, S, H, K, V, dtype=torch.float32, device=device),
            torch.empty(B, S, H, decay_dim, dtype=torch.float32, device=device))


# Programs per SM the split aims for: one per SM leaves the sequential loop's load latency exposed; on the H100 at
# one long sequence (16 tiles) about four per SM ran fastest, more paid for the fix-up.
PROGRAMS_PER_SM = 4
# Shortest segment worth the fix-up pass (it rewrites every h of all but the first segment): at 32 chunks no split
# beat the sequential scan on the H100.
MIN_SEGMENT_CHUNKS = 32


def split_segments(B: int, H: int, K: int, V: int, T: int, chunk_size: int, device: torch.device) -> int:
    """Segments for the split scan: about PROGRAMS_PER_SM programs per SM, none shorter than
    MIN_SEGMENT_CHUNKS chunks; 1 where the (K, V, batch·head) tiles already fill every SM once (there a split
    only adds the fix-up pass)."""
    programs = cdiv(K, tile(K)) * cdiv(V, tile(V)) * B * H
    sms, NT = sm_count(device), cdiv(T, chunk_size)
    if programs >= sms:
        return 1
    S = max(1, min(cdiv(PROGRAMS_PER_SM * sms, programs), NT // MIN_SEGMENT_CHUNKS))
    return segment_plan(NT, S)[1]                           # the count chunk_fwd_h launches


def segment_plan(NT: int, segments: int) -> tuple[int, int]:
    """Chunks per segment and the segment count actually launched for `segments` asked: equal
    ranges of cdiv(NT, segments) chunks, so none is empty (asking 33 of 1024 chunks runs 32)."""
    NS = cdiv(NT, segments)
    return NS, cdiv(NT, NS)


def pad_chunks(x: torch.Tensor, C: int) -> torch.Tensor:
    """[B, T, H, D] → [B, NT, C, H, D] fp32 (fp64 for fp64 x), zero-padded."""
    B, T, H, D = x.shape
    return torch.nn.functional.pad(_ref_dtype(x), (0, 0, 0, 0, 0, -T % C)).view(B, -1, C, H, D)


def _ref_dtype(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


def chunk_last(b: torch.Tensor, T: int, C: int) -> torch.Tensor:
    """b at each chunk's last valid row: [B, NT, H, S]."""
    idx = torch.clamp(torch.arange(C - 1, T + C - 1, C, device=b.device)[:cdiv(T, C)], max=T - 1)
    return _ref_dtype(b[:, idx])


def chunk_fwd_h_ref(k, v, b, h0, chunk_size):
    B, T, H, K = k.shape
    kc, vc, bc, bl = pad_chunks(k, chunk_size), pad_chunks(v, chunk_size), pad_chunks(b, chunk_size), chunk_last(b, T, chunk_size)
    S = kc.new_zeros(B, H, K, v.shape[-1]) if h0 is None else h0.to(kc.dtype)
    hs = []
    for n in range(kc.shape[1]):
        hs.append(S)
        valid = (torch.arange(chunk_size, device=k.device) + n * chunk_size < T)[None, :, None, None]
        kd = kc[:, n] * torch.where(valid, (bl[:, n, None] - bc[:, n]).exp(), 0.0)   # [B, C, H, K]
        S = bl[:, n].exp()[..., None] * S + torch.einsum("bchk,bchv->bhkv", kd, vc[:, n])
    return torch.stack(hs, 1), S


def chunk_bwd_dh_ref(q, do, b, dht, scale: float, chunk_size: int):
    B, T, H, K = q.shape
    qc, doc, bc, bl = pad_chunks(q, chunk_size), pad_chunks(do, chunk_size), pad_chunks(b, chunk_size), chunk_last(b, T, chunk_size)
    dS = torch.zeros(B, H, K, do.shape[-1], device=q.device) if dht is None else dht.float()
    dhs = []
    for n in reversed(range(qc.shape[1])):
        dhs.append(dS)
        dS = bl[:, n].exp()[..., None] * dS + torch.einsum("bchk,bchv->bhkv", qc[:, n] * bc[:, n].exp() * scale, doc[:, n])
    return torch.stack(dhs[::-1], 1), dS
