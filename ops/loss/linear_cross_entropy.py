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
well, except dW, which is accumulated in fp32 over the chunks rather than rounded once to bf16 (on a GPU inside the
GEMM; on CPU each chunk's bf16 product is added). Without grad
(evaluation) only the loss is computed. Under fp16 autocast the whole-logits chain runs instead (see
linear_cross_entropy: the 1/N-scaled gradient would underflow in fp16 before the loss scaler's factor).

The chunked forward is the operator chunkfuse::linear_cross_entropy_fwd (ops/library.py), so torch.compile
(fullgraph=True) traces it as one opaque call through its fake implementation: it returns the loss and dx, dW as
fresh outputs (marked non-differentiable, saved for the backward, a plain aten scale and cast). The caller decides
the GEMM dtype (autocast's) and whether to form the gradients (grad mode and requires_grad) and passes both in.
"""
from __future__ import annotations

import torch

from ops.library import absent, kernel_op
from ops.loss.cross_entropy import ce_rows

CHUNK = 4096                 # rows per chunk: fp32 logits of 4096 × 50,257 are 823 MB
# The logits' rows are padded to a multiple of PAD columns (zero weight rows): at an odd vocabulary (GPT-2's 50,257)
# every GEMM's leading dimension is odd, and cuBLAS falls back to unaligned kernels (sm75 `align1` CUTLASS on an
# H100/H200: a quarter of gla_340m's step). The padding's logits are 0 and stay out of the softmax.
PAD = 64
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


def _fwd_fake(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype, chunk: int,
              want_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    loss = x.new_empty((), dtype=torch.float32)
    if not want_grad:
        return loss, absent(x), absent(x)
    return loss, x.new_empty(x.shape, dtype=dtype), x.new_empty(weight.shape, dtype=torch.float32)


@kernel_op("linear_cross_entropy_fwd", _fwd_fake)
def linear_cross_entropy_fwd(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype,
                             chunk: int, want_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [N, d]; weight [vocab, d]; targets (N,) int64; dtype: the GEMMs' (autocast's, chosen by the caller) →
    the mean loss over the targets ≠ IGNORE_INDEX (a 0-dim fp32 tensor) and, with want_grad, its gradients
    dx [N, d] in `dtype` and dW [vocab, d] fp32 (else two 0-element `absent` tensors), all fresh and contiguous.
    want_grad is decided by the caller: grad mode is always off inside an operator's body."""
    V, d = weight.shape
    Vp = -(-V // PAD) * PAD
    xc = x.to(dtype)
    wc = torch.zeros(Vp, d, device=x.device, dtype=dtype)                  # zero rows past the vocabulary
    wc[:V] = weight
    valid = targets != IGNORE_INDEX
    count = valid.sum().clamp_min(1)
    loss = torch.zeros((), device=x.device, dtype=torch.float32)
    dx = torch.empty(x.shape, device=x.device, dtype=dtype) if want_grad else absent(x)
    # dW over the padded rows too (the padding's gradient columns are 0): at the odd row count cuBLASLt runs this
    # fp32-out GEMM on an sm80 CUTLASS kernel, 1.45–1.66× the padded GEMM's time on an H200; dw[:V] is contiguous
    dw = torch.zeros(Vp, d, device=x.device, dtype=torch.float32) if want_grad else absent(x)
    inv = (1.0 / count).float().reshape(1)
    # the autocast dispatch key falls through an operator, but its state is still on in the body: off for the GEMMs
    with torch.autocast(x.device.type, enabled=False):
        for a in range(0, x.shape[0], chunk):
            rows = slice(a, a + chunk)
            z = xc[rows] @ wc.t()                                   # [c, Vp], the GEMM's dtype; z[:, V:] = 0
            if z.is_cuda:         # one kernel: the loss terms, and the gradient written over z (padding: 0)
                loss += ce_rows(z, targets[rows], inv, want_grad, V, IGNORE_INDEX).sum()
            else:
                step, dz = _ce_rows_torch(z[:, :V], targets[rows], valid[rows], inv, want_grad)
                loss += step
                if want_grad:
                    z[:, :V] = dz
                    z[:, V:] = 0       # the padding's logits are no gradient (and x·0 may be NaN)
            if want_grad:
                dx[rows] = z @ wc
                if z.is_cuda:     # cuBLAS adds the product into fp32 dW itself: no bf16 product, cast or add pass
                    torch.addmm(dw, z.t(), xc[rows], out_dtype=torch.float32, out=dw)
                else:             # (addmm's out_dtype has no CPU kernel)
                    dw += (z.t() @ xc[rows]).float()
            del z
    return loss / count, dx, dw[:V] if want_grad else dw


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    x, weight = inputs[:2]
    _, dx, dw = output
    ctx.save_for_backward(dx, dw)
    ctx.mark_non_differentiable(dx, dw)
    ctx.dtypes = x.dtype, weight.dtype


def _backward(ctx, grad: torch.Tensor, _gdx: torch.Tensor | None, _gdw: torch.Tensor | None) -> tuple:
    """grad: the loss's incoming gradient (0-dim) → the saved dx, dW scaled by it, in the inputs' dtypes. No
    second-order terms (dx and dW are constants here)."""
    dx, dw = ctx.saved_tensors
    gx = (dx * grad).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
    gw = (dw * grad).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
    return gx, gw, None, None, None, None


linear_cross_entropy_fwd.register_autograd(_backward, setup_context=_setup_context)


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
    loss, _, _ = linear_cross_entropy_fwd(x.reshape(-1, x.shape[-1]).contiguous(), weight.contiguous(),
                                          targets.reshape(-1).contiguous(), dtype, chunk, want_grad)
    return loss
