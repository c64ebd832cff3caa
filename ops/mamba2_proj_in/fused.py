"""The input side of Mamba-2's projection chain on the `fused` backend (component `proj`):

    z, xBC, dt = split(u W_inᵀ);   x, B, C = split(SiLU(conv4(xBC) + b));   dt = softplus(dt + dt_bias)

Two cuBLAS GEMMs, y = u W_{xBC,dt}ᵀ and z = u W_zᵀ (row slices of W_in), then one operator
(chunkfuse::mamba2_proj_in_tail) runs the conv's Triton kernel (ops/proj/short_conv.py) on y's xBC columns in
place, writing SiLU(conv + b) once in fp32 math, and forms dt from y's last H columns. Its backward writes the
whole gradient of y itself: the conv's dx kernel stores into its column slice and dt's pre-activation gradient
into the rest, so the dgrad and wgrad GEMMs read one buffer that no concatenation built (through autograd's split,
Inductor's concatenation of dz, dxBC and ddt took 153 µs a layer on an H200 at mamba2_370m's shape). z is its own
GEMM because its gradient comes from proj_out, outside this operator. PyTorch's chain transposes xBC, runs a cuDNN
conv over channels-first data, slices, transposes back and applies SiLU, each a pass over
[M, d_inner + 2·G·N]. The conv stays out of the GEMM's epilogue for the reasons ops/gdn_proj_in/fused.py gives.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ops import backend_fn
from ops.library import absent, contiguous, kernel_op, maybe
from ops.proj.gemm import padded_rows
from ops.proj.short_conv import check_conv, conv_backward_into, conv_forward, conv_plan, document_positions
from ops.triton_utils import check_dtypes, check_triton_device

COMPONENTS = ("proj",)
Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]     # dy, dconv_w, dconv_b, ddt_bias (schema)


check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def plan(device: torch.device, M: int, channels: int, **_) -> str:
    """What the op launches for M rows, for the run log."""
    return (f"two cuBLAS GEMMs (xBC, dt; z); one short conv kernel on xBC ({conv_plan(channels, None, device)}), "
            "reading the GEMM's output in place and writing its gradient in place")


def _tail_fake(y: torch.Tensor, conv_w: torch.Tensor, conv_b: torch.Tensor | None, dt_bias: torch.Tensor,
               pos: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, _ = y.shape
    return y.new_empty(B, T, conv_w.shape[0]), y.new_empty(B, T, dt_bias.shape[0], dtype=torch.float32)


@kernel_op("mamba2_proj_in_tail", _tail_fake)
def mamba2_proj_in_tail(y: torch.Tensor, conv_w: torch.Tensor, conv_b: torch.Tensor | None, dt_bias: torch.Tensor,
                        pos: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """y [B, T, N] = [xBC | dt | 0] pre-activations (unit column stride; zero columns up to N); conv_w [C, W],
    conv_b (C,) or None, contiguous; dt_bias (H,); pos (T,) int64 or None (packed documents) → SiLU(conv(xBC) + b)
    [B, T, C] in y's dtype and dt = softplus(dt + dt_bias) [B, T, H] fp32, contiguous."""
    C, H = conv_w.shape[0], dt_bias.shape[0]
    xbc, dt, _ = y.split([C, H, y.shape[-1] - C - H], -1)
    return conv_forward(xbc, conv_w, conv_b, None, y.dtype, pos), F.softplus(dt.float() + dt_bias)


def _tail_bwd_fake(dxbc: torch.Tensor, ddt: torch.Tensor, y: torch.Tensor, conv_w: torch.Tensor,
                   conv_b: torch.Tensor | None, dt_bias: torch.Tensor,
                   pos: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    db = absent(conv_w) if conv_b is None else conv_b.new_empty(conv_b.shape)
    return y.new_empty(y.shape), conv_w.new_empty(conv_w.shape), db, dt_bias.new_empty(dt_bias.shape)


@kernel_op("mamba2_proj_in_tail_bwd", _tail_bwd_fake)
def mamba2_proj_in_tail_bwd(dxbc: torch.Tensor, ddt: torch.Tensor, y: torch.Tensor, conv_w: torch.Tensor,
                            conv_b: torch.Tensor | None, dt_bias: torch.Tensor,
                            pos: torch.Tensor | None) -> Grads:
    """The gradients of mamba2_proj_in_tail's outputs (contiguous) and its inputs → dy [B, T, N] contiguous in y's
    dtype, its slices written in place (the conv kernels' dx; ddt·sigmoid(dt + dt_bias); 0 in the padding),
    dconv_w, dconv_b (0 elements without a bias), ddt_bias (an fp32 sum over B and T)."""
    C, H = conv_w.shape[0], dt_bias.shape[0]
    widths = [C, H, y.shape[-1] - C - H]
    dy = torch.empty(y.shape, device=y.device, dtype=y.dtype)
    (xbc, dt, _), (dy_xbc, dy_dt, dy_pad) = y.split(widths, -1), dy.split(widths, -1)
    dy_pad.zero_()                                  # the padding's gradient, 0 (its weight rows are 0 too)
    dw, db = conv_backward_into(dy_xbc, dxbc, xbc, conv_w, conv_b, None, pos)
    dpre = ddt * (dt.float() + dt_bias).sigmoid()
    dy_dt.copy_(dpre)
    return dy, dw, db if db is not None else absent(conv_w), dpre.sum((0, 1)).to(dt_bias.dtype)


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    y, conv_w, conv_b, dt_bias, pos = inputs
    ctx.save_for_backward(y, conv_w, conv_b, dt_bias, pos)


def _backward(ctx, dxbc: torch.Tensor, ddt: torch.Tensor) -> tuple:
    """No second-order terms: mamba2_proj_in_tail_bwd has no gradient of its own, so a double backward raises."""
    y, conv_w, conv_b, dt_bias, pos = ctx.saved_tensors
    dy, dw, db, ddt_bias = mamba2_proj_in_tail_bwd(*contiguous(dxbc, ddt), y, conv_w, conv_b, dt_bias, pos)
    return dy, dw, maybe(db, conv_b is not None), ddt_bias, None


mamba2_proj_in_tail.register_autograd(_backward, setup_context=_setup_context)


@backend_fn(plan=plan)
def mamba2_proj_in(u: torch.Tensor, w_in: torch.Tensor, conv_w: torch.Tensor, conv_b: torch.Tensor | None,
                   dt_bias: torch.Tensor, d_inner: int, d_state: int,
                   cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Shapes as ops.mamba2_proj_in.naive.mamba2_proj_in: u [B, T, d]; w_in [2·d_inner + 2·d_state + H, d];
    conv_w [d_inner + 2·d_state, 1, W]; conv_b [d_inner + 2·d_state] or None; dt_bias (H,) → z, x [B, T, d_inner],
    B, C [B, T, d_state] (the GEMM's dtype; x, B, C views of the conv's output), dt [B, T, H] fp32.
    cu_seqlens (packed documents, B = 1): the short convolution restarts at each document (short_conv)."""
    check_dtypes("mamba2_proj_in", "fused", u, w_in)
    H = dt_bias.shape[0]
    conv_dim = d_inner + 2 * d_state
    if w_in.shape[0] != d_inner + conv_dim + H or conv_w.shape[0] != conv_dim:
        raise ValueError(f"mamba2_proj_in: w_in {tuple(w_in.shape)}, conv_w {tuple(conv_w.shape)} do not agree with "
                         f"d_inner {d_inner}, d_state {d_state}, {H} heads")
    B, T, _ = u.shape
    z = F.linear(u, w_in[:d_inner])                                                   # [B, T, d_inner]
    y = F.linear(u, padded_rows([w_in[d_inner:]]))                                    # [B, T, N], N aligned
    weight = check_conv(y[..., :conv_dim], conv_w, conv_b, None)
    pos = document_positions(cu_seqlens, B, T, "mamba2_proj_in")
    xbc, dt = mamba2_proj_in_tail(y, weight, None if conv_b is None else conv_b.contiguous(), dt_bias, pos)
    x, Bm, Cm = xbc.split([d_inner, d_state, d_state], -1)
    return z, x, Bm, Cm, dt


def build(fuse: frozenset[str]) -> Callable:
    """`proj` is this op's one component (ops.get_op has checked the names)."""
    return mamba2_proj_in
