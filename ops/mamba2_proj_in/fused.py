"""The input side of Mamba-2's projection chain on the `fused` backend (component `proj`):

    z, xBC, dt = split(u W_inᵀ);   x, B, C = split(SiLU(conv4(xBC) + b));   dt = softplus(dt + dt_bias)

Mamba-2's input projection is already one GEMM in PyTorch (cuBLAS, kept). What the fusion removes is the conv's
chain: PyTorch transposes xBC, runs a cuDNN conv over channels-first data, slices, transposes back and applies
SiLU, each a pass over [M, d_inner + 2·G·N]; here one Triton kernel (ops/proj/short_conv.py) reads xBC's columns in
place in the GEMM's output and writes SiLU(conv + b) once, in fp32 math; its backward is one kernel too. dt is
[M, H]: two PyTorch elementwise calls on its slice cost less than a kernel. The conv stays out of the GEMM's
epilogue for the reasons ops/gdn_proj_in/fused.py gives. z is a view of the GEMM's output, which the conv
kernel's saved input keeps alive; proj_out reads it in place.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ops import backend_fn
from ops.proj.short_conv import conv_plan, short_conv
from ops.triton_utils import check_dtypes, check_triton_device

COMPONENTS = ("proj",)


check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def plan(device: torch.device, M: int, channels: int, **_) -> str:
    """What the op launches for M rows, for the run log."""
    return f"one cuBLAS GEMM for z, xBC, dt; one short conv kernel on xBC ({conv_plan(channels, None, device)})"


@backend_fn(plan=plan)
def mamba2_proj_in(u: torch.Tensor, w_in: torch.Tensor, conv_w: torch.Tensor, conv_b: torch.Tensor | None,
                   dt_bias: torch.Tensor, d_inner: int, d_state: int,
                   cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Shapes as ops.mamba2_proj_in.naive.mamba2_proj_in: u [B, T, d]; w_in [2·d_inner + 2·d_state + H, d];
    conv_w [d_inner + 2·d_state, 1, W]; conv_b [d_inner + 2·d_state] or None; dt_bias (H,) → z, x [B, T, d_inner],
    B, C [B, T, d_state] (the GEMM's dtype; z a view of its output, x, B, C views of the conv's), dt [B, T, H] fp32.
    cu_seqlens (packed documents, B = 1): the short convolution restarts at each document (short_conv)."""
    check_dtypes("mamba2_proj_in", "fused", u, w_in)
    H = dt_bias.shape[0]
    conv_dim = d_inner + 2 * d_state
    if w_in.shape[0] != d_inner + conv_dim + H or conv_w.shape[0] != conv_dim:
        raise ValueError(f"mamba2_proj_in: w_in {tuple(w_in.shape)}, conv_w {tuple(conv_w.shape)} do not agree with "
                         f"d_inner {d_inner}, d_state {d_state}, {H} heads")
    z, xBC, dt = F.linear(u, w_in).split([d_inner, conv_dim, H], -1)
    x, Bm, Cm = short_conv(xBC, conv_w.flatten(1), conv_b, cu_seqlens=cu_seqlens).split([d_inner, d_state, d_state],
                                                                                     -1)
    return z, x, Bm, Cm, F.softplus(dt.float() + dt_bias)


def build(fuse: frozenset[str]) -> Callable:
    """`proj` is this op's one component (ops.get_op has checked the names)."""
    return mamba2_proj_in
