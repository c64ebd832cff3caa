"""The input side of Gated DeltaNet's projection chain on the `fused` backend (component `proj`):

    q, k = L2norm_head(SiLU(conv4(x W_{q,k}ᵀ))),   v = SiLU(conv4(x W_vᵀ)),   r = x W_rᵀ
    β = sigmoid(x W_βᵀ),   g = −exp(A_log) · softplus(x W_aᵀ + dt_bias)

Two cuBLAS GEMMs: y = x [W_q; W_k; W_v; W_β; W_a]ᵀ [M, N] and r = x W_rᵀ; then one operator
(chunkfuse::gdn_proj_in_tail) runs a Triton kernel per q, k, v (ops/proj/short_conv.py) on y's column slices in
place, applying the causal conv, SiLU and, for q and k, the per-head L2 norm, writing the mixer's contiguous inputs
once in fp32 math; one more kernel forms β and g from y's gate columns (kernels.py). Its backward writes the whole
[M, N] gradient of y itself: each conv's dx kernel stores into its column slice, and the gate kernel the gates'
pre-activation gradients and the padding's zeros into theirs (with dA_log's and ddt_bias's partial sums), so the
dgrad and wgrad GEMMs read one buffer that no concatenation built. (Through autograd's split the gradients arrive
as five tensors and are concatenated: at gdn_340m's layer Inductor's kernel for that took 160 µs on an H200.) r is
its own GEMM because its gradient comes from proj_out, outside this operator: x is read twice and dx sums two
dgrad GEMMs instead.

PyTorch's chain runs six GEMMs (x cast six times) and, per q, k, v, two transposes, a cuDNN conv, a slice, SiLU and
(q, k) a norm, a division and a cast, each a pass over HBM; its backward mirrors them. The conv is not in the
GEMM's epilogue: each output row needs the W − 1 rows before it, which another M tile owns, and the per-head norm
needs a whole head of columns; an epilogue would recompute a halo of rows per tile and tie the GEMM's tile to the
head size.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ops import backend_fn
from ops.library import contiguous, kernel_op
from ops.gdn_proj_in.kernels import gates_bwd_kernel, gates_fwd_kernel
from ops.proj.gemm import padded_rows
from ops.proj.short_conv import check_conv, conv_backward_into, conv_forward, conv_plan, document_positions
from ops.triton_utils import cdiv, check_dtypes, check_triton_device, next_power_of_2, sum_partials

COMPONENTS = ("proj",)
CUDA_GATE_ROWS = 128            # rows per program of the gate kernels (kernels.py)
# the operators' return types, spelt out for their schemas: q, k, v, g, β; and dy, dconv_q, dconv_k, dconv_v, dA_log,
# ddt_bias
Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def plan(device: torch.device, M: int, H: int, K: int, V: int, **_) -> str:
    """What the op launches for M rows at these widths, for the run log."""
    return (f"two cuBLAS GEMMs (q, k, v, β, g; r); short conv kernels on q, k ({conv_plan(H * K, K, device)}) "
            f"and v ({conv_plan(H * V, None, device)}) and a gate kernel, reading the GEMM's output in place and "
            "writing its gradient in place")


def _widths(y: torch.Tensor, conv_q: torch.Tensor, conv_v: torch.Tensor, n_heads: int) -> list[int]:
    """The column widths of y's slices: q, k, v, β, g and the zero columns that align its width (padded_rows)."""
    HK, HV = conv_q.shape[0], conv_v.shape[0]
    return [HK, HK, HV, n_heads, n_heads, y.shape[-1] - 2 * HK - HV - 2 * n_heads]


def _gate_tiles(y: torch.Tensor, H: int) -> tuple[int, int, dict]:
    """The gate kernels' rows per program, padded heads and launch options (CUDA: CUDA_GATE_ROWS rows on 4 warps;
    under TRITON_INTERPRET=1, 8 rows, so test sizes give several programs and a ragged last one)."""
    return (CUDA_GATE_ROWS, next_power_of_2(H), dict(num_warps=4)) if y.is_cuda else (8, next_power_of_2(H), {})


def _tail_fake(y: torch.Tensor, conv_q: torch.Tensor, conv_k: torch.Tensor, conv_v: torch.Tensor,
               A_log: torch.Tensor, dt_bias: torch.Tensor, n_heads: int,
               pos: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    B, T, _ = y.shape
    HK, HV = conv_q.shape[0], conv_v.shape[0]
    return (y.new_empty(B, T, HK), y.new_empty(B, T, HK), y.new_empty(B, T, HV),
            y.new_empty(B, T, n_heads, dtype=torch.float32), y.new_empty(B, T, n_heads, dtype=torch.float32))


@kernel_op("gdn_proj_in_tail", _tail_fake)
def gdn_proj_in_tail(y: torch.Tensor, conv_q: torch.Tensor, conv_k: torch.Tensor, conv_v: torch.Tensor,
                     A_log: torch.Tensor, dt_bias: torch.Tensor, n_heads: int,
                     pos: torch.Tensor | None) -> Outputs:
    """y [B, T, N] = [q | k | v | β | g | 0] pre-activations (unit column stride; zero columns up to N); conv_q,
    conv_k [H·K, W], conv_v [H·V, W] contiguous; A_log, dt_bias (H,); pos (T,) int64 or None (packed documents)
    → q, k [B, T, H·K], v [B, T, H·V] in y's dtype, g, β [B, T, H] fp32, all contiguous."""
    H = n_heads
    B, T, _ = y.shape
    if y.stride(0) != T * y.stride(1):
        raise ValueError(f"gdn_proj_in_tail: y's rows must be evenly strided across the batch (the gate kernels "
                         f"walk B·T rows), got strides {y.stride()}; pass the GEMM's output")
    widths = _widths(y, conv_q, conv_v, H)
    yq, yk, yv = y.split(widths, -1)[:3]
    q = conv_forward(yq, conv_q, None, conv_q.shape[0] // H, y.dtype, pos)
    k = conv_forward(yk, conv_k, None, conv_k.shape[0] // H, y.dtype, pos)
    v = conv_forward(yv, conv_v, None, None, y.dtype, pos)
    beta, g = (torch.empty(B, T, H, device=y.device, dtype=torch.float32) for _ in range(2))
    br, hp, launch = _gate_tiles(y, H)
    ob = sum(widths[:3])                                        # β's first column; g's follow, then the padding
    gates_fwd_kernel[(cdiv(B * T, br),)](y, A_log, dt_bias, beta, g, B * T, H, y.stride(1), ob, ob + H, BR=br, HP=hp,
                                         **launch)
    return q, k, v, g, beta


def _tail_bwd_fake(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, dg: torch.Tensor, dbeta: torch.Tensor,
                   y: torch.Tensor, conv_q: torch.Tensor, conv_k: torch.Tensor, conv_v: torch.Tensor,
                   A_log: torch.Tensor, dt_bias: torch.Tensor, n_heads: int,
                   pos: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    return (y.new_empty(y.shape), conv_q.new_empty(conv_q.shape), conv_k.new_empty(conv_k.shape),
            conv_v.new_empty(conv_v.shape), A_log.new_empty(A_log.shape), dt_bias.new_empty(dt_bias.shape))


@kernel_op("gdn_proj_in_tail_bwd", _tail_bwd_fake)
def gdn_proj_in_tail_bwd(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, dg: torch.Tensor,
                         dbeta: torch.Tensor, y: torch.Tensor, conv_q: torch.Tensor, conv_k: torch.Tensor,
                         conv_v: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, n_heads: int,
                         pos: torch.Tensor | None) -> Grads:
    """The gradients of gdn_proj_in_tail's outputs (contiguous) and its inputs → dy [B, T, N] contiguous in y's
    dtype, each slice written in place (the conv kernels' dx; the gate kernel's dβ·β(1−β), dg·(−exp(A_log))·
    sigmoid(ya + dt_bias) and the padding's zeros), dconv_q, dconv_k, dconv_v, dA_log = Σ dg·g, ddt_bias =
    Σ dg·∂g/∂ya (fp32 sums over B and T)."""
    H = n_heads
    widths = _widths(y, conv_q, conv_v, H)
    dy = torch.empty(y.shape, device=y.device, dtype=y.dtype)
    ys, ds = y.split(widths, -1), dy.split(widths, -1)
    dcq, _ = conv_backward_into(ds[0], dq, ys[0], conv_q, None, conv_q.shape[0] // H, pos)
    dck, _ = conv_backward_into(ds[1], dk, ys[1], conv_k, None, conv_k.shape[0] // H, pos)
    dcv, _ = conv_backward_into(ds[2], dv, ys[2], conv_v, None, None, pos)
    B, T, N = y.shape
    br, hp, launch = _gate_tiles(y, H)
    programs = cdiv(B * T, br)
    dA, ddt = (torch.empty(programs, H, device=y.device, dtype=torch.float32) for _ in range(2))
    ob, oa = sum(widths[:3]), sum(widths[:4])
    gates_bwd_kernel[(programs,)](y, A_log, dt_bias, dbeta, dg, dy, dA, ddt, B * T, H, y.stride(1), dy.stride(1), ob,
                                  oa, N, BR=br, HP=hp, PADP=next_power_of_2(max(1, N - oa - H)), **launch)
    return dy, dcq, dck, dcv, sum_partials(dA, A_log.dtype), sum_partials(ddt, dt_bias.dtype)


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    y, conv_q, conv_k, conv_v, A_log, dt_bias, n_heads, pos = inputs
    ctx.save_for_backward(y, conv_q, conv_k, conv_v, A_log, dt_bias, pos)
    ctx.n_heads = n_heads


def _backward(ctx, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, dg: torch.Tensor,
              dbeta: torch.Tensor) -> tuple:
    """No second-order terms: gdn_proj_in_tail_bwd has no gradient of its own, so a double backward raises."""
    y, conv_q, conv_k, conv_v, A_log, dt_bias, pos = ctx.saved_tensors
    grads = contiguous(dq, dk, dv, dg, dbeta)
    return (*gdn_proj_in_tail_bwd(*grads, y, conv_q, conv_k, conv_v, A_log, dt_bias, ctx.n_heads, pos), None, None)


gdn_proj_in_tail.register_autograd(_backward, setup_context=_setup_context)


@backend_fn(plan=plan)
def gdn_proj_in(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_r: torch.Tensor,
                w_b: torch.Tensor, w_a: torch.Tensor, conv_q: torch.Tensor, conv_k: torch.Tensor,
                conv_v: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                n_heads: int, cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Shapes as ops.gdn_proj_in.naive.gdn_proj_in: x [B, T, d]; w_q, w_k [H·K, d]; w_v, w_r [H·V, d];
    w_b, w_a [H, d]; conv_q, conv_k [H·K, 1, W]; conv_v [H·V, 1, W]; A_log, dt_bias (H,) → q, k [B, T, H, K],
    v [B, T, H, V] (x's dtype, or autocast's), g, β [B, T, H] fp32, r [B, T, H·V].
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
        xd = x.to(dtype)
        y = xd @ padded_rows([w.to(dtype) for w in (w_q, w_k, w_v, w_b, w_a)]).t()       # [B, T, N]
        r = xd @ w_r.to(dtype).t()                                                        # [B, T, H·V]
    yq, _, yv = y.split([HK, HK, y.shape[-1] - 2 * HK], -1)
    convs = [check_conv(yq, conv_q, None, HK // H), check_conv(yq, conv_k, None, HK // H),
             check_conv(yv[..., :HV], conv_v, None, None)]
    pos = document_positions(cu_seqlens, B, T, "gdn_proj_in")
    q, k, v, g, beta = gdn_proj_in_tail(y, *convs, A_log, dt_bias, H, pos)
    return q.view(B, T, H, -1), k.view(B, T, H, -1), v.view(B, T, H, -1), g, beta, r


def build(fuse: frozenset[str]) -> Callable:
    """`proj` is this op's one component (ops.get_op has checked the names)."""
    return gdn_proj_in
