"""Chunk-local (reverse) cumulative sum of log-decays over time: b_t = Σ_{s ≤ t in t's chunk} g_s, and the
residual r of its fp32 rounding: b_t + r_t = Σ g_s to about 1e-9 |b_t|.

x, g: [B, T, H, S] (S = K for per-key-dim decay, 1 for a scalar decay); out: same shape, fp32.

Why the residual: b is held in fp32, so b_t carries up to ulp(|b_t|), |b_t| · 6e-8, of rounding, and every
exponent b_t − b_s inherits it as a relative error of exp(b_t − b_s). At strong decay (|b| ~ 10³ inside a chunk at
−50 per step) that is ~1e-4, while the decay gradient is made of exactly such near pairs (ops/chunkwise/output.py).
The backward therefore forms each exponent as (b_t − b_s) + (r_t − r_s): where the pair carries any weight the
first difference is exact (Sterbenz: b_t and b_s within a factor of two) and the second is small.
r is formed without a compensated scan: g = g_hi + g_lo with g_hi = g rounded to a multiple of 2⁻⁸, so
Σ g_hi is exact in fp32 (a multiple of 2⁻⁸ below 2¹⁶ in magnitude: |g| up to 1000 per step at C = 64),
|Σ g_lo| ≤ C · 2⁻⁹ is small and carries only its own tiny rounding, and r = (Σ g_hi − b) + Σ g_lo.

The forward state pass needs only the gaps to each chunk's last row, b_L − b_t = Σ_{t<u≤L} g_u, and reads them
summed by themselves (chunk_cumsum_gap, in the cumsum's own kernel): rounded relative to their own size, not to
|b_t|'s, so no r is needed there, and the pass loads one [C, K] tile a chunk as it would load b.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.triton_utils import cdiv, load_rows, next_power_of_2, row_offsets

# The chunk decay −b_L (largest over key dims) from which the per-key kernels of the backward add r: below it
# |b| ≤ 64 and b's rounding moves an exponent by ~ulp(64) = 8e-6 at most, ~1e-7 on average over a chunk. At
# realistic decays no chunk gets there, and those kernels run as they would without r (residual_launches; fused
# GLA's sub-block kernels mask their loads of r, residual_mask). A scalar decay's r is one value a row, read
# everywhere. The chunk operator's forward state pass reads no r: its exponents b_L − b are chunk_cumsum_gap's gaps,
# each summed by itself.
RESIDUAL_FROM = 64.0


def residual_launches(scalar: bool) -> tuple[tuple[bool, bool], ...]:
    """(EXACT, REDO) of each launch of a chunkwise backward stage. A per-key r is a [C, K] tile a chunk, as large as
    b's: every chunk is taken without it, then a second launch (REDO) returns at once from the chunks whose decay is
    at most RESIDUAL_FROM and redoes the others with it, overwriting their outputs. A scalar r is one value a row:
    one launch, r read everywhere (a second launch over every chunk costs more than the load)."""
    return ((True, False),) if scalar else ((False, False), (True, True))


@triton.jit
def chunk_cumsum_kernel(x, out, T, H: tl.constexpr, S: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
                        REVERSE: tl.constexpr, gap=None, GAP: tl.constexpr = False):
    i_s, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    # reverse: its own scan, not the chunk total minus the forward one, which would leave the rounding of the
    # largest partial sum in every row (dg_u of a weak decay after a strong one is far below the rows before it);
    # the rows are read last to first and scanned forward (tl.cumsum's reverse flips the tile, a slower kernel)
    o_c = (BT - 1 - tl.arange(0, BT)) if REVERSE else tl.arange(0, BT)
    o_t = i_t * BT + o_c
    o_s = i_s * BS + tl.arange(0, BS)
    m = (o_t[:, None] < T) & (o_s[None, :] < S)
    ptr = row_offsets(i_b, i_h, o_t[:, None], T, H, S) + o_s[None, :]
    b_x = tl.load(x + ptr, mask=m, other=0.0).to(tl.float32)
    b_o = tl.cumsum(b_x, axis=0)
    tl.store(out + ptr, b_o, mask=m)
    if GAP:
        # gap[t] = Σ_{t<u≤L} x[u], its own scan: scan row i reads row BT − i (none at i = 0), so its sum at i is
        # over the rows after row BT − 1 − i, where it is stored
        o_i = tl.arange(0, BT)
        o_r = i_t * BT + BT - o_i
        m_s = o_s[None, :] < S
        b_y = tl.load(x + row_offsets(i_b, i_h, o_r[:, None], T, H, S) + o_s[None, :],
                      mask=((o_i > 0) & (o_r < T))[:, None] & m_s, other=0.0).to(tl.float32)
        o_g = o_r - 1
        tl.store(gap + row_offsets(i_b, i_h, o_g[:, None], T, H, S) + o_s[None, :], tl.cumsum(b_y, axis=0),
                 mask=(o_g < T)[:, None] & m_s)


def chunk_cumsum(x: torch.Tensor, chunk_size: int, reverse: bool = False,
                 gap: torch.Tensor | None = None) -> torch.Tensor:
    """The chunk-local cumsum of x [B, T, H, S] (reversed: Σ from each row to its chunk's end), fp32. gap: a
    [B, T, H, S] fp32 buffer the same kernel fills with chunk_cumsum_gap's gaps (forward only)."""
    if reverse and gap is not None:
        raise ValueError("chunk_cumsum: gap goes with the forward cumsum (reverse=False)")
    B, T, H, S = x.shape
    out = torch.empty(B, T, H, S, dtype=torch.float32, device=x.device)
    BS = min(64, next_power_of_2(S))
    grid = (cdiv(S, BS), cdiv(T, chunk_size), B * H)
    chunk_cumsum_kernel[grid](x.contiguous(), out, T, H, S, chunk_size, BS, reverse, gap=gap, GAP=gap is not None)
    return out


def chunk_cumsum_gap(x: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """b = chunk_cumsum(x, chunk_size) and, from the same kernel, the gap to each chunk's last valid row L,
    c_t = b_L − b_t = Σ_{t<u≤L} x_u [B, T, H, S] fp32, scanned by itself: exact to the rounding of its own size,
    where b_L − b_t from b is off by ulp(|b_t|) (the state pass's exponents, module docstring)."""
    c = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    return chunk_cumsum(x, chunk_size, gap=c), c


@triton.jit
def chunk_decay(b, i_b, i_h, i_t, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """A chunk's largest total decay, max over every key dim of −b_L (b at its last row): what decides whether r
    is formed (chunk_residual) and, in fused GLA, between the factorised scores and the sub-block kernels."""
    last = tl.minimum(i_t * BT + BT, T) - 1
    r = tl.zeros([BK], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        r = tl.maximum(r, -tl.load(b + row_offsets(i_b, i_h, last, T, H, K) + o_k, mask=o_k < K, other=0.0))
    return tl.max(r, axis=0)


@triton.jit
def weak_chunk(b, i_b, i_h, i_t, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
               SCALAR: tl.constexpr, MAXR: tl.constexpr):
    """Whether chunk i_t's decay is at most MAXR, where b's rounding needs no residual (b: [B, T, H, 1] if SCALAR,
    else [B, T, H, K]): a REDO launch returns from such chunks (residual_launches)."""
    if SCALAR:
        weak = chunk_decay(b, i_b, i_h, i_t, T, H, 1, BT, 16) <= MAXR
    else:
        weak = chunk_decay(b, i_b, i_h, i_t, T, H, K, BT, BK) <= MAXR
    return weak


@triton.jit
def residual_mask(m_k, b_last, MAXR: tl.constexpr):
    """Where a per-key kernel reads r: m_k in a chunk whose decay −min(b_last) exceeds MAXR, else nowhere
    (b_last: b at the chunk's last row, masked key dims 0)."""
    return m_k & ((b_last * 0.0 + tl.min(b_last, axis=0)) < -MAXR)


@triton.jit
def residual_to_last(res, i_b, i_h, last, o_t, m_t, T, H: tl.constexpr):
    """r_L − r_t for a scalar decay's rows o_t [BT] (last: the chunk's last valid row), what exp(b_L − b) adds."""
    return tl.load(res + row_offsets(i_b, i_h, last, T, H, 1)) - \
        tl.load(res + row_offsets(i_b, i_h, o_t, T, H, 1), mask=m_t, other=0.0)


@triton.jit
def key_residual_to_last(res, i_b, i_h, last, o_t, m_t, o_k, m_k, T, H: tl.constexpr, K: tl.constexpr):
    """r_L − r_t for a per-key decay, [BT, BK], read at the key dims m_k (0 elsewhere)."""
    return tl.load(res + row_offsets(i_b, i_h, last, T, H, K) + o_k, mask=m_k, other=0.0)[None, :] - \
        load_rows(res, i_b, i_h, o_t, m_t, o_k, m_k, T, H, K)


@triton.jit
def residual_tile(g, b, out, i_b, i_h, i_t, i_s, T, H: tl.constexpr, S: tl.constexpr, BT: tl.constexpr,
                  BS: tl.constexpr):
    """r (module docstring) for the [BT, BS] tile (S columns i_s·BS on) of chunk i_t."""
    o_t = i_t * BT + tl.arange(0, BT)
    o_s = i_s * BS + tl.arange(0, BS)
    m = (o_t[:, None] < T) & (o_s[None, :] < S)
    ptr = row_offsets(i_b, i_h, o_t[:, None], T, H, S) + o_s[None, :]
    b_g = tl.load(g + ptr, mask=m, other=0.0).to(tl.float32)
    b_hi = tl.floor(b_g * 256.0 + 0.5) * 0.00390625                   # g on the 2⁻⁸ grid: its cumsum is exact
    b_r = (tl.cumsum(b_hi, axis=0) - tl.load(b + ptr, mask=m, other=0.0)) + tl.cumsum(b_g - b_hi, axis=0)
    tl.store(out + ptr, b_r, mask=m)


@triton.jit
def chunk_residual_kernel(g, b, out, T, H: tl.constexpr, S: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
                          MAXR: tl.constexpr):
    i_s, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    if S == 1 or chunk_decay(b, i_b, i_h, i_t, T, H, S, BT, BS) > MAXR:
        residual_tile(g, b, out, i_b, i_h, i_t, i_s, T, H, S, BT, BS)


def chunk_residual(g: torch.Tensor, b: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """r [B, T, H, S] fp32 with b + r = the chunk-local cumsum of g (module docstring); b as chunk_cumsum(g,
    chunk_size) made it (or any fp32 rounding of that cumsum). With a per-key decay (S > 1) r is formed only in the
    chunks whose decay exceeds RESIDUAL_FROM (chunk_decay), the rest left unwritten: a reader tests chunk_decay, or
    masks its loads with residual_mask, whose test (its own key tile's decay) holds only in such chunks. At realistic
    decays the kernel then reads one row of b per chunk and returns. A scalar decay's r is formed everywhere (one
    value a row)."""
    B, T, H, S = g.shape
    out = torch.empty(B, T, H, S, dtype=torch.float32, device=g.device)
    BS = min(64, next_power_of_2(S))
    grid = (cdiv(S, BS), cdiv(T, chunk_size), B * H)
    chunk_residual_kernel[grid](g.contiguous(), b.contiguous(), out, T, H, S, chunk_size, BS, RESIDUAL_FROM)
    return out


def chunk_cumsum_ref(x: torch.Tensor, chunk_size: int, reverse: bool = False) -> torch.Tensor:
    B, T, H, S = x.shape
    pad = -T % chunk_size
    xc = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad)).view(B, -1, chunk_size, H, S)
    out = xc.flip(2).cumsum(2).flip(2) if reverse else xc.cumsum(2)
    return out.reshape(B, -1, H, S)[:, :T]
