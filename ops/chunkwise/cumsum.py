"""Chunk-local (reverse) cumulative sum of log-decays over time: b_t = Σ_{s ≤ t in t's chunk} g_s.

x: [B, T, H, S] (S = K for per-key-dim decay, 1 for a scalar decay); out: same shape, fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.triton_utils import cdiv, next_power_of_2, row_offsets


@triton.jit
def chunk_cumsum_kernel(x, out, T, H: tl.constexpr, S: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr,
                        REVERSE: tl.constexpr):
    i_s, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    o_s = i_s * BS + tl.arange(0, BS)
    m = (o_t[:, None] < T) & (o_s[None, :] < S)
    ptr = row_offsets(i_b, i_h, o_t[:, None], T, H, S) + o_s[None, :]
    b_x = tl.load(x + ptr, mask=m, other=0.0).to(tl.float32)
    # reverse: its own scan, not the chunk total minus the forward one, which would leave the rounding of the
    # largest partial sum in every row (dg_u of a weak decay after a strong one is far below the rows before it)
    b_o = tl.cumsum(b_x, axis=0, reverse=REVERSE)
    tl.store(out + ptr, b_o, mask=m)


def chunk_cumsum(x: torch.Tensor, chunk_size: int, reverse: bool = False) -> torch.Tensor:
    B, T, H, S = x.shape
    out = torch.empty(B, T, H, S, dtype=torch.float32, device=x.device)
    BS = min(64, next_power_of_2(S))
    grid = (cdiv(S, BS), cdiv(T, chunk_size), B * H)
    chunk_cumsum_kernel[grid](x.contiguous(), out, T, H, S, chunk_size, BS, reverse)
    return out


def chunk_cumsum_ref(x: torch.Tensor, chunk_size: int, reverse: bool = False) -> torch.Tensor:
    B, T, H, S = x.shape
    pad = -T % chunk_size
    xc = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad)).view(B, -1, chunk_size, H, S)
    out = xc.flip(2).cumsum(2).flip(2) if reverse else xc.cumsum(2)
    return out.reshape(B, -1, H, S)[:, :T]
