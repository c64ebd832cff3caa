"""The short causal depthwise convolution of Gated DeltaNet and Mamba-2 (model.common.ShortConv), fused:

    pre[b, t, c] = bias[c] + Σ_{j<W} w[c, j] · x[b, t − (W−1) + j, c]      (x = 0 before t = 0)
    y = silu(pre);  with head_dim: y ← y / max(‖y_head‖, eps) per group of head_dim channels (F.normalize)

One forward kernel and two backward kernels, all math in fp32. x may be a column slice of a wider row-major
tensor (the fused projection chain runs this on its GEMM's output): any row and batch stride,
unit channel stride. A program covers BT time rows × NH whole heads of HDP lanes (HDP = head_dim padded to
a power of two, the padded lanes masked; without head_dim one "head" of BC channels). The W−1 halo rows
before the block come from the W shifted loads of x (masked at t < 0; the overlap is served by L1/L2).

Backward saves only x (and the weights) and recomputes the pre-activation. The first kernel forms dpre =
∂loss/∂pre (pre, SiLU and the norm again from x) and writes it in x's dtype: in bf16 training that is the
rounding PyTorch's unfused chain gives its own dpre, and dx, a sum of W of them, is rounded to bf16 anyway; dweight
and dbias are formed from the fp32 value before the rounding. Each of its programs walks a range of row tiles of
its heads and accumulates dweight's and dbias's terms elementwise in registers, keeping each tile's W loads of x for
them, and reduces over rows once at the end: per-program partial sums in [programs, C, W] / [programs, C] fp32
buffers, summed in PyTorch (no atomics: deterministic). (Reducing each tile's terms over its rows instead took 2.6×
the kernel's time at mamba2_370m's layer on an H200.) The second kernel forms
dx[t] = Σ_s w[c, W−1−s] · dpre[t + s], whose W−1 rows after each tile belong to the next tile: one kernel would
have to form dpre W times. L2-norm backward per head, n = y / max(‖y‖, eps): dy = (dn − n (n·dn)) / ‖y‖ where
‖y‖ > eps, else dn / eps.

The kernels are launched only from operators (ops/library.py), which torch.compile(fullgraph=True) traces as opaque
calls: chunkfuse::short_conv_fwd and chunkfuse::short_conv_bwd here, whose fake implementations give contiguous
outputs of the input's shape like the real ones, and the projection chains' operators (ops/gdn_proj_in,
ops/mamba2_proj_in), which call conv_forward and conv_backward_into in their bodies, the latter writing dx into a
column slice of their own gradient. The backward takes x as the forward saved it (its strides included) and returns
dx, dweight and dbias (0 elements without a bias).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ops import varlen
from ops.library import absent, contiguous, kernel_op, maybe
from ops.triton_utils import cdiv, next_power_of_2, sm_count, sum_partials

EPS = 1e-6                      # F.normalize's eps, as model/gated_deltanet.py uses it
MAX_WIDTH = 4                   # the backward keeps one register tile per tap
# CUDA: 2K fp32 elements per [BT, NH, HDP] tile over 4 warps (BT = 16 at 128 channels), 16 per thread per operand:
# the backward's dpre kernel keeps ~12 such tiles live (W taps, W + 1 accumulators), and its programs take ~4 per
# SM. Of 2K–8K-element tiles on 4 or 8 warps, the fastest for dpre at the 340M layers and for the forward at
# Mamba-2's (H200): the forward there 1.9× the 8K tiles on 8 warps, dpre on 8K-element tiles 16× slower. Under
# TRITON_INTERPRET=1 (CPU tests): BT = 8 and 16-channel blocks (or one head), so test sizes give several programs
# and ragged edges in time and channels, and dpre's programs walk several tiles each.
CUDA_BT, CUDA_BC, CUDA_TILE, CUDA_WARPS = 64, 128, 2048, 4
CUDA_PROGRAMS_PER_SM = 4       # dpre's grid: programs per SM, each walking a range of row tiles
INTERPRET_BT, INTERPRET_BC = 8, 16
# the backward's dx kernel: [rows, channels] tiles of dpre (no heads)
CUDA_DX_BT, CUDA_DX_BC, CUDA_DX_WARPS = 16, 256, 4


@triton.jit
def _taps(pos, rows, T, HAS_POS: tl.constexpr):
    """Each row's position in its document ([BT, 1, 1]; packed documents, HAS_POS), or its row index: tap j of the
    W-wide window reads x[t − (W−1) + j] only where this is ≥ W − 1 − j (the input before a document is 0)."""
    if HAS_POS:
        return tl.load(pos + rows, mask=rows < T, other=0)
    return rows


@triton.jit
def _tap(xb, rows, cols, cmask, T, sxt, at, s: tl.constexpr, W: tl.constexpr, HAS_POS: tl.constexpr):
    """x[rows − s, cols] in fp32 [BT, NH, HDP], the tap that w[:, W−1−s] weighs: 0 before row 0, for taps s ≥ W,
    and with packed documents (HAS_POS; at = each row's position in its document, _taps) before the document."""
    src = rows - s
    m = (src >= 0) & (src < T) & cmask & (s < W)
    if HAS_POS:
        m = m & (at >= s)
    return tl.load(xb + src * sxt + cols, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _weight(w, cols, cmask, s: tl.constexpr, W: tl.constexpr):
    """w[cols, W−1−s] in fp32 [1, NH, HDP], the weight of tap s (0 for s ≥ W)."""
    return tl.load(w + cols * W + (W - 1 - s), mask=cmask & (s < W), other=0.0).to(tl.float32)


@triton.jit
def _pre(x, w, bias, xb, rows, cols, cmask, T, sxt, pos, W: tl.constexpr, HAS_BIAS: tl.constexpr,
         HAS_POS: tl.constexpr):
    """pre[rows, cols] fp32 [BT, NH, HDP] for rows [BT, 1, 1] (int64) and cols [1, NH, HDP]; masked channels give
    pre = 0 (bias included only on valid channels). Rows ≥ T are not zeroed here (they still read the last valid
    inputs): callers mask them through their loads of dy and their stores. HAS_POS: pos (T,) int64, each row's
    position in its document; taps before it read 0."""
    acc = tl.zeros([rows.shape[0], cols.shape[1], cols.shape[2]], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + cols, mask=cmask, other=0.0).to(tl.float32)
    if HAS_POS:
        at = _taps(pos, rows, T, HAS_POS)
    for j in tl.static_range(W):
        src = rows - (W - 1) + j
        m = (src >= 0) & (src < T) & cmask
        if HAS_POS:
            m = m & (at >= W - 1 - j)
        xv = tl.load(xb + src * sxt + cols, mask=m, other=0.0).to(tl.float32)
        acc += tl.load(w + cols * W + j, mask=cmask, other=0.0).to(tl.float32) * xv
    return acc


@triton.jit
def short_conv_fwd_kernel(x, w, bias, y, T, C, sxb, sxt, eps, W: tl.constexpr, HD: tl.constexpr,
                          HDP: tl.constexpr, NH: tl.constexpr, BT: tl.constexpr, HAS_BIAS: tl.constexpr,
                          NORM: tl.constexpr, pos=None, HAS_POS: tl.constexpr = False):
    """One program per (BT rows, NH heads of HD channels, batch): y[b, rows, cols] in y's dtype."""
    pid_t, pid_c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    rows = (pid_t * BT + tl.arange(0, BT)).to(tl.int64)[:, None, None]
    lane = tl.arange(0, HDP)[None, None, :]
    cols = pid_c * (NH * HD) + tl.arange(0, NH)[None, :, None] * HD + lane
    cmask = (lane < HD) & (cols < C)
    pre = _pre(x, w, bias, x + b * sxb, rows, cols, cmask, T, sxt, pos, W, HAS_BIAS, HAS_POS)
    out = pre * tl.sigmoid(pre)
    if NORM:
        nrm = tl.sqrt(tl.sum(out * out, axis=2))[:, :, None]
        out = out / tl.maximum(nrm, eps)
    tl.store(y + (b * T + rows) * C + cols, out.to(y.dtype.element_ty), mask=(rows < T) & cmask)


@triton.jit
def _dpre(pre, g, eps, NORM: tl.constexpr):
    """∂loss/∂pre from pre and the incoming gradient g (both fp32 [BT, NH, HDP]; g = 0 on rows ≥ T and masked
    channels, which gives 0 there)."""
    sg = tl.sigmoid(pre)
    if NORM:
        out = pre * sg
        nrm = tl.sqrt(tl.sum(out * out, axis=2))[:, :, None]
        den = tl.maximum(nrm, eps)
        n = out / den
        proj = tl.sum(n * g, axis=2)[:, :, None]
        g = (g - n * tl.where(nrm > eps, proj, 0.0)) / den
    return g * sg * (1.0 + pre * (1.0 - sg))


@triton.jit
def short_conv_dpre_kernel(x, w, bias, dy, dp, dw, db, T, C, sxb, sxt, eps, NTS, W: tl.constexpr, HD: tl.constexpr,
                           HDP: tl.constexpr, NH: tl.constexpr, BT: tl.constexpr, HAS_BIAS: tl.constexpr,
                           NORM: tl.constexpr, pos=None, HAS_POS: tl.constexpr = False):
    """One program per (NH heads, batch, split): dp[b, rows, cols] = dpre (in dp's dtype) on the NTS row tiles of
    BT rows from tile split·NTS on, and this program's partial sums over those rows dw[p, cols, :W], db[p, cols]
    (fp32, from the unrounded dpre), p = b·splits + split. W ≤ 4: each tap x[t − s] is loaded once, for pre and for
    dw[:, W−1−s]."""
    pid_c, b, sp = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    lane2 = tl.arange(0, HDP)[None, :]
    cols2 = pid_c * (NH * HD) + tl.arange(0, NH)[:, None] * HD + lane2                   # [NH, HDP]
    cmask2 = (lane2 < HD) & (cols2 < C)
    cols, cmask = cols2[None, :, :], cmask2[None, :, :]
    xb, yb = x + b * sxb, dy + b * T * C
    w0, w1, w2, w3 = (_weight(w, cols, cmask, 0, W), _weight(w, cols, cmask, 1, W), _weight(w, cols, cmask, 2, W),
                      _weight(w, cols, cmask, 3, W))
    zero = tl.zeros([BT, NH, HDP], dtype=tl.float32)
    a0, a1, a2, a3, ab = zero, zero, zero, zero, zero
    base = zero + tl.load(bias + cols, mask=cmask, other=0.0).to(tl.float32) if HAS_BIAS else zero
    for it in range(sp * NTS, tl.minimum(sp * NTS + NTS, tl.cdiv(T, BT))):
        rows = (it * BT + tl.arange(0, BT)).to(tl.int64)[:, None, None]
        at = _taps(pos, rows, T, HAS_POS)
        x0 = _tap(xb, rows, cols, cmask, T, sxt, at, 0, W, HAS_POS)
        x1 = _tap(xb, rows, cols, cmask, T, sxt, at, 1, W, HAS_POS)
        x2 = _tap(xb, rows, cols, cmask, T, sxt, at, 2, W, HAS_POS)
        x3 = _tap(xb, rows, cols, cmask, T, sxt, at, 3, W, HAS_POS)
        g = tl.load(yb + rows * C + cols, mask=(rows < T) & cmask, other=0.0).to(tl.float32)
        d = _dpre(base + w0 * x0 + w1 * x1 + w2 * x2 + w3 * x3, g, eps, NORM)
        tl.store(dp + (b * T + rows) * C + cols, d, mask=(rows < T) & cmask)
        a0 += d * x0
        a1 += d * x1
        a2 += d * x2
        a3 += d * x3
        ab += d
    p = b * tl.num_programs(2) + sp
    if HAS_BIAS:
        tl.store(db + p * C + cols2, tl.sum(ab, axis=0), mask=cmask2)
    dwp = dw + (p * C + cols2) * W + (W - 1)                  # dw[p, cols, W−1−s] = Σ_t dpre · tap s
    tl.store(dwp, tl.sum(a0, axis=0), mask=cmask2)
    tl.store(dwp - 1, tl.sum(a1, axis=0), mask=cmask2 & (W > 1))
    tl.store(dwp - 2, tl.sum(a2, axis=0), mask=cmask2 & (W > 2))
    tl.store(dwp - 3, tl.sum(a3, axis=0), mask=cmask2 & (W > 3))


@triton.jit
def short_conv_dx_kernel(dp, w, dx, T, C, sdb, sdt, W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, pos=None,
                         HAS_POS: tl.constexpr = False):
    """One program per (BT rows, BC channels, batch): dx[b, rows, cols] = Σ_s w[cols, W−1−s] · dp[b, rows + s,
    cols] in dx's dtype, dx with batch and row strides sdb, sdt (a column slice of a wider gradient too); HAS_POS:
    tap s only where row + s lies at least s into its document."""
    pid_t, pid_c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    rows = (pid_t * BT + tl.arange(0, BT)).to(tl.int64)[:, None]
    cols = pid_c * BC + tl.arange(0, BC)[None, :]
    cmask = cols < C
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    for s in tl.static_range(W):
        r = rows + s
        m = (r < T) & cmask
        if HAS_POS:
            m = m & (_taps(pos, r, T, HAS_POS) >= s)
        d = tl.load(dp + (b * T + r) * C + cols, mask=m, other=0.0)
        acc += tl.load(w + cols * W + (W - 1 - s), mask=cmask, other=0.0).to(tl.float32) * d
    tl.store(dx + b * sdb + rows * sdt + cols, acc.to(dx.dtype.element_ty), mask=(rows < T) & cmask)


def _tiles(C: int, head_dim: int | None, cuda: bool) -> tuple[dict, int]:
    """The kernels' tile constexprs (HD, HDP, NH, BT) and the number of channel blocks."""
    hd = head_dim if head_dim is not None else (CUDA_BC if cuda else INTERPRET_BC)
    hdp = next_power_of_2(hd)
    if cuda:
        nh = max(1, CUDA_BC // hdp) if head_dim is not None else 1
        bt = max(1, min(CUDA_BT, CUDA_TILE // (nh * hdp)))
    else:
        nh, bt = max(1, INTERPRET_BC // hdp) if head_dim is not None else 1, INTERPRET_BT
    return dict(HD=hd, HDP=hdp, NH=nh, BT=bt), cdiv(C, nh * hd)


def conv_plan(C: int, head_dim: int | None, device: torch.device) -> str:
    """The tiles the kernels launch with over C channels, for the run log."""
    t, blocks = _tiles(C, head_dim, device.type == "cuda")
    return f"{t['BT']} rows x {t['NH']} head(s) of {t['HD']} channels per program, {blocks} channel blocks"


def _fwd_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, head_dim: int | None,
              out_dtype: torch.dtype, pos: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=out_dtype)


@kernel_op("short_conv_fwd", _fwd_fake)
def short_conv_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, head_dim: int | None,
                   out_dtype: torch.dtype, pos: torch.Tensor | None) -> torch.Tensor:
    """x [B, T, C] with unit channel stride (any row and batch stride); weight [C, W] contiguous; bias (C,)
    contiguous or None → y [B, T, C] contiguous in out_dtype (fp32 math). pos (T,) int64 or None: packed
    documents (B = 1), each token's position in its document."""
    return conv_forward(x, weight, bias, head_dim, out_dtype, pos)


def conv_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, head_dim: int | None,
                 out_dtype: torch.dtype, pos: torch.Tensor | None) -> torch.Tensor:
    """short_conv_fwd's kernel launch, for the operators that run the conv inside their own body."""
    B, T, C = x.shape
    tiles, nc = _tiles(C, head_dim, x.is_cuda)
    y = torch.empty(B, T, C, device=x.device, dtype=out_dtype)
    warps = dict(num_warps=CUDA_WARPS) if x.is_cuda else {}
    grid = (cdiv(T, tiles["BT"]), nc, B)
    short_conv_fwd_kernel[grid](x, weight, weight if bias is None else bias, y, T, C, x.stride(0), x.stride(1),
                                EPS, W=weight.shape[1], HAS_BIAS=bias is not None, NORM=head_dim is not None,
                                **tiles, **warps, **_pos_args(pos))
    return y


def _pos_args(pos: torch.Tensor | None) -> dict:
    """The kernels' document-mask arguments: none without packed documents (the plain kernels compile as before)."""
    return {} if pos is None else dict(pos=pos, HAS_POS=True)


def _bwd_fake(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              head_dim: int | None, pos: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    db = absent(weight) if bias is None else bias.new_empty(bias.shape)
    return x.new_empty(x.shape), weight.new_empty(weight.shape), db


@kernel_op("short_conv_bwd", _bwd_fake)
def short_conv_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   head_dim: int | None, pos: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy [B, T, C]; x, weight, bias as short_conv_fwd's (x as saved: the forward's strided input) → dx [B, T, C]
    in x's dtype, dweight [C, W] in weight's, dbias (C,) in bias's (0 elements without a bias), all contiguous."""
    dx = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    dw, db = conv_backward_into(dx, dy, x, weight, bias, head_dim, pos)
    return dx, dw, db if bias is not None else absent(weight)


def conv_backward_into(dx: torch.Tensor, dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None, head_dim: int | None,
                       pos: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """short_conv_bwd's kernel launches, writing dx into a given [B, T, C] buffer (unit channel stride, any row
    and batch stride: a column slice of a wider gradient) → dweight [C, W] in weight's dtype, dbias (C,) in bias's
    or None. The pre-activation is recomputed from x into a dpre [B, T, C] in x's dtype (transient); dweight and
    dbias are the fp32 per-program partial sums, summed here."""
    B, T, C = x.shape
    W = weight.shape[1]
    tiles, nc = _tiles(C, head_dim, x.is_cuda)
    nt = cdiv(T, tiles["BT"])
    # CUDA_PROGRAMS_PER_SM programs per SM (2 per (heads, batch) under the interpreter), each walking `per` ≥ 1 tiles
    programs = CUDA_PROGRAMS_PER_SM * sm_count(x.device) if x.is_cuda else 2 * nc * B
    per = cdiv(nt, min(nt, cdiv(programs, nc * B)))
    splits = cdiv(nt, per)
    dp = torch.empty(B, T, C, device=x.device, dtype=x.dtype)
    dw = torch.empty(B * splits, C, W, device=x.device, dtype=torch.float32)   # every program writes its row
    db = torch.empty(B * splits, C, device=x.device, dtype=torch.float32) if bias is not None else dw
    warps = dict(num_warps=CUDA_WARPS) if x.is_cuda else {}
    short_conv_dpre_kernel[(nc, B, splits)](x, weight, weight if bias is None else bias, dy.contiguous(), dp, dw,
                                            db, T, C, x.stride(0), x.stride(1), EPS, per, W=W,
                                            HAS_BIAS=bias is not None, NORM=head_dim is not None, **tiles,
                                            **warps, **_pos_args(pos))
    bt, bc = (CUDA_DX_BT, CUDA_DX_BC) if x.is_cuda else (INTERPRET_BT, INTERPRET_BC)
    warps = dict(num_warps=CUDA_DX_WARPS) if x.is_cuda else {}
    short_conv_dx_kernel[(cdiv(T, bt), cdiv(C, bc), B)](dp, weight, dx, T, C, dx.stride(0), dx.stride(1), W=W,
                                                        BT=bt, BC=bc, **warps, **_pos_args(pos))
    return sum_partials(dw, weight.dtype), sum_partials(db, bias.dtype) if bias is not None else None


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, bias, head_dim, _, pos = inputs
    ctx.save_for_backward(x, weight, bias, pos)       # x as given: a view of the wider GEMM output, not a copy
    ctx.head_dim = head_dim


def _backward(ctx, dy: torch.Tensor) -> tuple:
    """No second-order terms: short_conv_bwd has no gradient of its own, so a double backward raises."""
    x, weight, bias, pos = ctx.saved_tensors
    (dy,) = contiguous(dy)
    dx, dw, db = short_conv_bwd(dy, x, weight, bias, ctx.head_dim, pos)
    return dx, dw, maybe(db, bias is not None), None, None, None


short_conv_fwd.register_autograd(_backward, setup_context=_setup_context)


def short_conv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   head_dim: int | None = None, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """The PyTorch oracle, model.common.ShortConv's computation (+ F.normalize per head): [B, T, C] → [B, T, C].
    With cu_seqlens (packed documents, B = 1; ops/varlen.py) x counts as 0 before each document's first token:
    pre[t] = bias + Σ_{s<W} w[:, W−1−s] · x[t − s] · [pos(t) ≥ s], pos(t) the position of t in its document."""
    B, T, C = x.shape
    if cu_seqlens is not None:
        varlen.offsets(cu_seqlens, B, T, "short_conv")
        pos = varlen.positions(cu_seqlens, T)                                      # (T,)
        w = weight.reshape(C, -1)                                                  # [C, W]
        W = w.shape[-1]
        pre = sum(F.pad(x, (0, 0, s, 0))[:, :T] * (pos >= s)[None, :, None].to(x.dtype) * w[:, W - 1 - s]
                  for s in range(W))                                               # [1, T, C]
        y = F.silu(pre if bias is None else pre + bias)
    else:
        y = F.silu(F.conv1d(x.transpose(1, 2), weight.reshape(C, 1, -1), bias, padding=weight.shape[-1] - 1,
                            groups=C)[..., :T].transpose(1, 2))
    if head_dim is not None:
        y = F.normalize(y.reshape(B, T, C // head_dim, head_dim), dim=-1, eps=EPS).reshape(B, T, C)
    return y


def short_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               head_dim: int | None = None, out_dtype: torch.dtype | None = None,
               cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """x: [B, T, C], may be a column slice of a wider row-major tensor (x.stride(-1) == 1, any row stride
    x.stride(1); batch stride x.stride(0)); weight: [C, W] (nn.Conv1d's [C, 1, W] squeezed; [C, 1, W] is
    accepted too), any W ≤ 4; bias (C,) or None. Returns silu(causal_conv(x)) as a contiguous [B, T, C]
    tensor in out_dtype (default x.dtype); with head_dim (any divisor of C; padded to a power of two inside
    the kernels), each group of head_dim channels is then L2-normalised like F.normalize(eps=1e-6):
    y / max(‖y‖, eps). All math in fp32. Gradients: dx [B, T, C] in x's dtype, dweight, dbias in theirs.
    cu_seqlens (packed documents, B = 1): x counts as 0 before each document's first token, as in
    short_conv_ref; the kernels mask each tap by the token's position in its document (varlen.positions)."""
    if x.dim() != 3 or x.stride(-1) != 1:
        raise ValueError(f"short_conv: x must be [B, T, C] with unit channel stride, got shape {tuple(x.shape)} "
                         f"strides {x.stride()}")
    B, T, C = x.shape
    weight = check_conv(x, weight, bias, head_dim)
    pos = document_positions(cu_seqlens, B, T, "short_conv")
    return short_conv_fwd(x, weight, None if bias is None else bias.contiguous(), head_dim, out_dtype or x.dtype,
                          pos)


def check_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               head_dim: int | None) -> torch.Tensor:
    """short_conv's argument checks, each error saying what to change; returns the weight as the kernels take it,
    [C, W] contiguous ([C, 1, W] accepted)."""
    B, T, C = x.shape
    if weight.dim() == 3 and weight.shape[1] == 1:
        weight = weight.squeeze(1)
    if weight.dim() != 2 or weight.shape[0] != C or not 1 <= weight.shape[1] <= MAX_WIDTH:
        raise ValueError(f"short_conv: weight must be [C={C}, W] with 1 ≤ W ≤ {MAX_WIDTH} (the fused kernels' "
                         f"widths; model.conv_size), got {tuple(weight.shape)}; a wider conv runs on the unfused "
                         "projection chain: --fuse without proj, or --backend chunk")
    if bias is not None and bias.shape != (C,):
        raise ValueError(f"short_conv: bias must be [C={C}], got {tuple(bias.shape)}")
    if head_dim is not None and (head_dim < 1 or C % head_dim):
        raise ValueError(f"short_conv: head_dim {head_dim} must divide the channel count {C}")
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("short_conv: the Triton kernels need a CUDA tensor (or TRITON_INTERPRET=1 on CPU)")
    if B == 0 or T == 0 or C == 0:
        raise ValueError(f"short_conv: empty input {tuple(x.shape)}")
    return weight.contiguous()


def document_positions(cu_seqlens: torch.Tensor | None, B: int, T: int, op: str) -> torch.Tensor | None:
    """The kernels' `pos` argument: each token's position in its document, (T,) int64, after varlen's checks of
    cu_seqlens against B = 1 and T (errors naming `op`); None without packed documents."""
    if cu_seqlens is None:
        return None
    varlen.offsets(cu_seqlens, B, T, op)
    return varlen.positions(cu_seqlens, T)
