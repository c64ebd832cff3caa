"""One Triton kernel for a chunk of the LM loss (ops/loss/linear_cross_entropy.py): per row of the logits z (the head
GEMM's output, in its dtype), logsumexp, the loss term and, in place of z, the gradient (softmax − onehot)·scale.

    lse_i = log Σ_{j<V} exp z_ij;  loss_i = lse_i − z_i,y_i;  z_ij ← (exp(z_ij − lse_i) − [j = y_i]) · scale_i

Why a kernel: in PyTorch the same steps are a cast to fp32, logsumexp, a gather, exp, a scatter, a scale and a
cast back, each a pass over the [rows, vocab] chunk (≈ 6.6 GB per 4096 × 50,257 chunk); the kernel reads z twice
and writes it once (1.2 GB), with fp32 math. One program per row streams the row in BLOCK columns: pass 1 keeps
a running max (per block, starting at −1e30 rather than −inf) and a running sum rescaled as in an online softmax;
pass 2 writes the gradient. Rows whose target is IGNORE (−100) get loss 0 and gradient 0. scale is a pointer
(1 / the number of counted targets, a device scalar), so no host sync is needed.

z may be wider than the vocabulary V: columns V..W−1 are padding (the caller's zero weight rows), left out of the
softmax and given gradient 0. The loads and stores cover all W columns and mask only by W: with W a multiple of 16
Triton proves 16-byte alignment and moves eight bf16 per instruction, where a mask at an odd V (GPT-2's 50,257)
splits every access into single 2-byte loads and stores.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.triton_utils import next_power_of_2

BLOCK = 4096                      # columns per step on a GPU (8 warps: 16 per thread)
INTERPRET_BLOCK = 32              # under TRITON_INTERPRET=1 (tests): several blocks at test vocab sizes


@triton.jit
def ce_rows_kernel(z, targets, scale, loss, V, W, stride, IGNORE: tl.constexpr, GRAD: tl.constexpr,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0)
    zr = z + row.to(tl.int64) * stride
    t = tl.load(targets + row)
    ok = t != IGNORE
    ts = tl.where(ok, t, 0)
    cols = tl.arange(0, BLOCK)
    # a finite start: a block of −inf logits before any finite one then rescales by exp(−inf) = 0, not NaN
    m = tl.max(tl.full([BLOCK], -1e30, tl.float32), axis=0)
    s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for v0 in range(0, W, BLOCK):
        c = v0 + cols
        x = tl.load(zr + c, mask=c < W, other=0.0).to(tl.float32)
        x = tl.where(c < V, x, float("-inf"))                                       # padding: exp → 0
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(s)
    zt = tl.load(zr + ts).to(tl.float32)
    tl.store(loss + row, tl.where(ok, lse - zt, 0.0))
    if GRAD:
        sc = tl.where(ok, tl.load(scale), 0.0)
        for v0 in range(0, W, BLOCK):
            c = v0 + cols
            x = tl.load(zr + c, mask=c < W, other=0.0).to(tl.float32)
            p = tl.where(c < V, tl.exp(x - lse), 0.0) - tl.where(c == ts, 1.0, 0.0)    # padding: no overflow, 0
            tl.store(zr + c, (p * sc).to(z.dtype.element_ty), mask=c < W)


def ce_rows(z: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor, grad: bool, vocab: int | None = None,
            ignore: int = -100) -> torch.Tensor:
    """z [rows, W] (unit column stride, any float dtype; overwritten by the gradient when grad), targets [rows]
    int64, scale: a 1-element fp32 tensor, vocab: V ≤ W, the columns that are logits (default W; the rest are
    padding and get gradient 0) → the per-row loss terms [rows] fp32 (0 where the target is `ignore`)."""
    rows, width = z.shape
    vocab = width if vocab is None else vocab
    if z.stride(1) != 1:
        raise ValueError("ce_rows: z needs unit column stride")
    if not 0 < vocab <= width:
        raise ValueError(f"ce_rows: vocab must be in 1..{width} (z's columns), got {vocab}")
    targets = targets.contiguous()                # the kernel reads targets[row]
    loss = torch.empty(rows, device=z.device, dtype=torch.float32)
    opts = dict(BLOCK=min(BLOCK, next_power_of_2(width)), num_warps=8) if z.is_cuda else dict(BLOCK=INTERPRET_BLOCK)
    ce_rows_kernel[(rows,)](z, targets, scale, loss, vocab, width, z.stride(0), IGNORE=ignore, GRAD=grad, **opts)
    return loss
