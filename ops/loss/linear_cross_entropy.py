"""The LM head and its cross-entropy in row chunks, so the [B·T, vocab] logits never exist whole.

    loss = mean_i (logsumexp_j z_ij − z_i,y_i),   z = x Wᵀ   (x: the final norm's output, W: the head / tied embedding)

PyTorch's chain (F.linear, .float(), F.cross_entropy) holds the bf16 logits, their fp32 copy and the fp32
log-softmax it saves for the backward, then the fp32 and bf16 gradients of the logits: at gla_340m's B8 T2048
and 50,257 tokens each fp32 copy is 3.3 GB, about 8 GB at the peak. Here the forward takes CHUNK rows at a
time: their logits (the same GEMM, in its dtype), then one kernel (cross_entropy.py; on CPU the same
steps in PyTorch) for the loss terms and, written over the logits, their gradient (softmax − onehot)/N in fp32
math, cast to the GEMM dtype as PyTorch's chain casts it; dx for those rows and their share of dW follow by two
GEMMs, and only dx ([B·T, d]) and dW ([vocab, d] fp32) are kept for the backward, which scales them by the
incoming gradient. Peak extra memory: one chunk's logits (412 MB in bf16 at CHUNK = 4096 and 50,257 tokens).
The GEMM FLOPs are PyTorch's (the backward's two GEMMs move into the forward). Rounding points are PyTorch's as
well, except dW, which sums per-chunk bf16 products in fp32 rather than rounding one bf16 product. Without grad
(evaluation) only the loss is computed. Under fp16 autocast the whole-logits chain runs instead (see
linear_cross_entropy: the 1/N-scaled gradient would underflow in fp16 before the loss scaler's factor).
"""
from __future__ import annotations

import torch

from ops.loss.cross_entropy import ce_rows

CHUNK = 4096                 # rows per chunk: fp32 logits of 4096 × 50,257 are 823 MB
IGNORE_INDEX = -100          # F.cross_entropy's default: targets with this value add no loss and no gradient


def _ce_rows_torch(z: torch.Tensor, t: torch.Tensor, ok: torch.Tensor, inv: torch.Tensor,
                   grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ops.loss.cross_entropy.ce_rows in PyTorch (CPU, where Triton does not run): the summed loss terms of one
    chunk of logits z [c, vocab] and, with grad, (softmax − onehot)·inv in z's dtype (ignored rows: 0)."""
    zf = z.float()
    ts = t.clamp_min(0)
    lse = torch.logsumexp(zf, dim=-1)
    loss = ((lse - zf.gather(1, ts[:, None]).squeeze(1)) * ok).sum()
    if not grad:
        return loss, None
    zf.sub_(lse[:, None]).exp_()                                                # softmax, in place
    zf.scatter_add_(1, ts[:, None], -ok[:, None].to(zf.dtype))                  # − onehot (counted rows)
    zf.mul_(ok[:, None] * inv)                                                  # ignored rows: 0
    return loss, zf.to(z.dtype)


class LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, dtype, chunk, want_grad):
        """x [N, d]; weight [vocab, d]; targets (N,) int64 → the mean loss over the targets ≠ IGNORE_INDEX.
        want_grad: decided by the caller (inside forward grad mode is always off, and ctx.needs_input_grad
        says only which inputs require grad, also under torch.no_grad())."""
        xc, wc = x.to(dtype), weight.to(dtype)
        valid = targets != IGNORE_INDEX
        count = valid.sum().clamp_min(1)
        loss = torch.zeros((), device=x.device, dtype=torch.float32)
        dx = torch.empty_like(xc) if want_grad else None
        dw = torch.zeros(weight.shape, device=x.device, dtype=torch.float32) if want_grad else None
        inv = (1.0 / count).float().reshape(1)
        with torch.autocast(x.device.type, enabled=False):
            for a in range(0, x.shape[0], chunk):
                rows = slice(a, a + chunk)
                z = xc[rows] @ wc.t()                                               # [c, vocab], the GEMM's dtype
                if z.is_cuda:                  # one kernel: the loss terms, and the gradient written over z
                    loss += ce_rows(z, targets[rows], inv, want_grad, IGNORE_INDEX).sum()
                    dz = z
                else:
                    step, dz = _ce_rows_torch(z, targets[rows], valid[rows], inv, want_grad)
                    loss += step
                if want_grad:
                    dx[rows] = dz @ wc
                    dw += (dz.t() @ xc[rows]).float()
                del z, dz
        ctx.save_for_backward(dx, dw)
        ctx.dtypes = x.dtype, weight.dtype
        return loss / count

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        dx, dw = ctx.saved_tensors
        gx = (dx * grad).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
        gw = (dw * grad).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
        return gx, gw, None, None, None, None


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk: int = CHUNK) -> torch.Tensor:
    """F.cross_entropy(F.linear(x, weight).float(), targets) without the whole logits: x [..., d], weight [vocab, d],
    targets [...] int64 (IGNORE_INDEX skips a position). Under autocast the GEMMs run in its dtype, as F.linear."""
    dev = x.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    if dtype == torch.float16:
        # fp16 trains with a loss scale applied after this loss: the chunked gradient (softmax − onehot)/N, rounded
        # to fp16 before that scale, would underflow (at N = 16384 most entries become 0). PyTorch's chain forms it
        # already scaled, so fp16 keeps the whole logits.
        return torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, weight).float().flatten(0, -2),
                                                 targets.reshape(-1), ignore_index=IGNORE_INDEX)
    want_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return LinearCrossEntropy.apply(x.reshape(-1, x.shape[-1]), weight, targets.reshape(-1), dtype, chunk, want_grad)
