"""The input side of Gated DeltaNet's projection chain on the `fused` backend (component `proj`):

    q, k = L2norm_head(SiLU(conv4(x W_{q,k}ᵀ))),   v = SiLU(conv4(x W_vᵀ)),   r = x W_rᵀ
    β = sigmoid(x W_βᵀ),   g = −exp(A_log) · softplus(x W_aᵀ + dt_bias)

One cuBLAS GEMM x [W_q; W_k; W_v; W_r; W_β; W_a]ᵀ reads x once and writes one [M, N] buffer; then one Triton
kernel per q, k, v (ops/proj/short_conv.py) reads its column slice in place and applies the causal conv, SiLU and,
for q and k, the per-head L2 norm, writing the mixer's contiguous input once, in fp32 math. PyTorch's chain runs
six GEMMs (x cast six times) and, per q, k, v, two transposes, a cuDNN conv, a slice, SiLU and (q, k) a norm, a
division and a cast, each a pass over HBM; its backward mirrors them. The autograd graph here is the concatenated
weights' mm, one split (its backward: one concatenation of the gradients, then one dgrad GEMM) and the conv
kernels' own backward.

The conv is not in the GEMM's epilogue: each output row needs the W − 1 rows before it, which another M tile owns,
and the per-head norm needs a whole head of columns; an epilogue would recompute a halo of rows per tile and tie
the GEMM's tile to the head size. β and g are [M, H]: a few PyTorch elementwise calls on the slices cost less than
a kernel. r is returned as a view of the GEMM's output, which the conv kernels' saved inputs keep alive anyway;
proj_out's gate kernels read it in place (its row stride), so it is not copied and held twice.
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


def plan(device: torch.device, M: int, H: int, K: int, V: int, **_) -> str:
    """What the op launches for M rows at these widths, for the run log."""
    return (f"one cuBLAS GEMM for q, k, v, r, β, g; short conv kernels on q, k ({conv_plan(H * K, K, device)}) "
            f"and v ({conv_plan(H * V, None, device)}), reading the GEMM's output in place")


@backend_fn(plan=plan)
def gdn_proj_in(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_r: torch.Tensor,
                w_b: torch.Tensor, w_a: torch.Tensor, conv_q: torch.Tensor, conv_k: torch.Tensor,
                conv_v: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                n_heads: int, cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Shapes as ops.gdn_proj_in.naive.gdn_proj_in: x [B, T, d]; w_q, w_k [H·K, d]; w_v, w_r [H·V, d];
    w_b, w_a [H, d]; conv_q, conv_k [H·K, 1, W]; conv_v [H·V, 1, W]; A_log, dt_bias (H,) → q, k [B, T, H, K],
    v [B, T, H, V] (x's dtype, or autocast's), g, β [B, T, H] fp32, r [B, T, H·V] (a view of the GEMM's output).
    cu_seqlens (packed documents, B = 1): the short convolutions restart at each document (short_conv)."""
    check_dtypes("gdn_proj_in", "fused", x, w_q)
    B, T, d = x.shape
    H = n_heads
    HK, HV = w_q.shape[0], w_v.shape[0]
    if not (w_k.shape == (HK, d) and w_r.shape == (HV, d) and w_b.shape == w_a.shape == (H, d)
            and conv_q.shape[0] == conv_k.shape[0] == HK and conv_v.shape[0] == HV and HK % H == 0 and HV % H == 0):
        raise ValueError(f"gdn_proj_in: shapes x {tuple(x.shape)}, w_q {tuple(w_q.shape)}, w_k {tuple(w_k.shape)}, "
                         f"w_v {tuple(w_v.shape)}, w_r {tuple(w_r.shape)}, w_b {tuple(w_b.shape)}, "
                         f"w_a {tuple(w_a.shape)}, convs {tuple(conv_q.shape)} {tuple(conv_k.shape)} "
                         f"{tuple(conv_v.shape)}, {H} heads do not agree")
    dev = x.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    with torch.autocast(dev, enabled=False):
        w_cat = torch.cat([w.to(dtype) for w in (w_q, w_k, w_v, w_r, w_b, w_a)])       # [N, d]
        y = x.to(dtype) @ w_cat.t()                                                      # [B, T, N], x read once
    yq, yk, yv, r, yb, ya = y.split([HK, HK, HV, HV, H, H], -1)
    q = short_conv(yq, conv_q.flatten(1), None, head_dim=HK // H, cu_seqlens=cu_seqlens).view(B, T, H, -1)
    k = short_conv(yk, conv_k.flatten(1), None, head_dim=HK // H, cu_seqlens=cu_seqlens).view(B, T, H, -1)
    v = short_conv(yv, conv_v.flatten(1), None, cu_seqlens=cu_seqlens).view(B, T, H, -1)
    beta = yb.float().sigmoid()                                                          # [B, T, H]
    g = -A_log.float().exp() * F.softplus(ya.float() + dt_bias)                          # [B, T, H]
    return q, k, v, g, beta, r


def build(fuse: frozenset[str]) -> Callable:
    """`proj` is this op's one component (ops.get_op has checked the names)."""
    return gdn_proj_in
