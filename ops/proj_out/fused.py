"""The output side of the projection chain on the `fused` backend (issue [H], component `proj`):

    y = residual + (RMSNorm_head(o) · w ⊙ silu(r)) W_oᵀ

as one Triton GEMM whose prologue forms the gated A tile from o and r and whose epilogue adds the
residual (ops/proj_out/kernels.py). The gated input g = RMSNorm(o)·w ⊙ silu(r) never reaches HBM in
the forward, and the backward recomputes it from o and r instead of saving it: the op saves o and r
(what the unfused chain saves besides the norm's and the gate's outputs and g), so its activation
memory is two [B, T, H·V] tensors where PyTorch's chain keeps five.

Backward: one Triton kernel computes dg = dy W_o one head at a time and, in its epilogue, the
gradients of r, o and the norm weight (the RMSNorm's row reduction needs the whole head, which is the
tile), writing g for dW_o = dyᵀ g, a plain cuBLAS GEMM; the residual's gradient is dy itself.

Under autocast the op computes in the autocast dtype, as F.linear would (o, r and W_o cast to it; the
norm weight stays fp32 inside the kernel); its output takes the residual's dtype (fp32 in the model's
residual stream), like `residual + y` does.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import triton

from ops.common.chunk import check_triton_device as check_available  # noqa: F401
from ops.common.tiles import dot_precision
from ops.proj_out.kernels import proj_out_bwd_kernel, proj_out_fwd_kernel

COMPONENTS = ("proj",)
MAX_BV = 128                 # widest head slice per K step: BV = V up to here, so a head's RMS is one tile's
SMEM_BUDGET = 200 * 1024     # bytes of shared memory a config's pipeline may take (H100/A100: 227/163 KB)
# ≤ 5 configs each, pruned by the shared memory their stages take and keyed on the model's dims, never T.
FWD_CONFIGS = [triton.Config(dict(BM=bm, BN=bn, GROUP=8), num_warps=nw, num_stages=st)
               for bm, bn, nw, st in ((128, 128, 8, 2), (128, 256, 8, 2), (64, 256, 8, 2), (128, 128, 8, 3),
                                      (64, 128, 4, 3))]
BWD_CONFIGS = [triton.Config(dict(BM=bm, BK=bk), num_warps=nw, num_stages=st)
               for bm, bk, nw, st in ((64, 64, 4, 3), (128, 64, 8, 3), (64, 64, 8, 3), (128, 32, 8, 4))]
# Under TRITON_INTERPRET=1 (CPU tests) one small tile: several row and column tiles and, for V > 16,
# the two-pass RMS over head slices, at test sizes.
INTERPRET_FWD = dict(BM=16, BN=16, GROUP=2, BV_MAX=16)
INTERPRET_BWD = dict(BM=16, BK=16)


def _fits(configs, named_args, **kwargs):
    """Drop configs whose pipelined tiles exceed SMEM_BUDGET (keep the smallest if none fits)."""
    args = {**named_args, **kwargs}                  # launch-time constexprs arrive as kwargs
    bv, size = args["BV"], args["w"].element_size()
    kept = [c for c in configs
            if c.num_stages * (2 * c.kwargs["BM"] * bv + c.kwargs["BN"] * bv) * size <= SMEM_BUDGET]
    return kept or [min(configs, key=lambda c: c.num_stages * (2 * c.kwargs["BM"] + c.kwargs["BN"]))]


def _fits_bwd(configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    V, size = args["V"], args["w"].element_size()
    kept = [c for c in configs if c.num_stages * (c.kwargs["BM"] + V) * c.kwargs["BK"] * size <= SMEM_BUDGET]
    return kept or [min(configs, key=lambda c: c.num_stages * (c.kwargs["BM"] + V) * c.kwargs["BK"])]


_fwd_tuned = triton.autotune(FWD_CONFIGS, key=["N", "H", "V", "BV", "HAS_RES"],
                             prune_configs_by={"early_config_prune": _fits})(proj_out_fwd_kernel)
_bwd_tuned = triton.autotune(BWD_CONFIGS, key=["N", "H", "V"],
                             prune_configs_by={"early_config_prune": _fits_bwd})(proj_out_bwd_kernel)


def proj_out_fwd(o: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, w: torch.Tensor,
                 res: torch.Tensor | None, eps: float, H: int, V: int, out_dtype: torch.dtype) -> torch.Tensor:
    """o, r: [M, H·V]; nw: [V] fp32; w: [N, H·V]; res: [M, N] or None → y [M, N] in out_dtype."""
    M, N = o.shape[0], w.shape[0]
    y = torch.empty(M, N, device=o.device, dtype=out_dtype)
    meta = dict(H=H, V=V, HAS_RES=res is not None, PREC=dot_precision(w))
    res = y if res is None else res                   # a dummy pointer without a residual (HAS_RES off)
    if o.is_cuda:
        grid = lambda m: (triton.cdiv(M, m["BM"]) * triton.cdiv(N, m["BN"]),)      # noqa: E731
        _fwd_tuned[grid](o, r, nw, w, res, y, M, N, eps, BV=min(V, MAX_BV), **meta)
    else:
        t = INTERPRET_FWD
        grid = (triton.cdiv(M, t["BM"]) * triton.cdiv(N, t["BN"]),)
        proj_out_fwd_kernel[grid](o, r, nw, w, res, y, M, N, eps, BV=min(V, t["BV_MAX"]), BM=t["BM"], BN=t["BN"],
                                  GROUP=t["GROUP"], **meta)
    return y


def proj_out_bwd(dy: torch.Tensor, w: torch.Tensor, o: torch.Tensor, r: torch.Tensor, nw: torch.Tensor,
                 eps: float, H: int, V: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy: [M, N] in w's dtype → g, do, dr [M, H·V] (o's dtype) and the norm weight's gradient [V] fp32."""
    M, N = dy.shape
    g, do, dr = (torch.empty_like(o) for _ in range(3))
    meta = dict(H=H, V=V, PREC=dot_precision(w))
    if o.is_cuda:
        bm = min(c.kwargs["BM"] for c in BWD_CONFIGS)
        dnw = torch.zeros(triton.cdiv(M, bm), H, V, device=o.device, dtype=torch.float32)  # the larger BM leaves rows 0
        _bwd_tuned[lambda m: (H, triton.cdiv(M, m["BM"]))](dy, w, o, r, nw, g, do, dr, dnw, M, N, eps, **meta)
    else:
        t = INTERPRET_BWD
        dnw = torch.empty(triton.cdiv(M, t["BM"]), H, V, device=o.device, dtype=torch.float32)
        proj_out_bwd_kernel[(H, triton.cdiv(M, t["BM"]))](dy, w, o, r, nw, g, do, dr, dnw, M, N, eps, **meta, **t)
    return g, do, dr, dnw.sum((0, 1))


class FusedProjOut(torch.autograd.Function):
    @staticmethod
    def forward(ctx, o, r, nw, w, res, eps, H, V):
        """o, r: [M, H·V] contiguous in the compute dtype; nw [V]; w [N, H·V]; res [M, N] or None."""
        out_dtype = res.dtype if res is not None else w.dtype
        y = proj_out_fwd(o, r, nw.float(), w, res, eps, H, V, out_dtype)
        ctx.save_for_backward(o, r, nw, w)
        ctx.eps, ctx.H, ctx.V, ctx.has_res = eps, H, V, res is not None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable   # no second-order terms: an error, not a silent omission
    def backward(ctx, dy):
        o, r, nw, w = ctx.saved_tensors
        dyc = dy.to(w.dtype).contiguous()             # the GEMMs' operand dtype (one cast of fp32 dy under autocast)
        g, do, dr, dnw = proj_out_bwd(dyc, w, o, r, nw.float(), ctx.eps, ctx.H, ctx.V)
        dw = dyc.t() @ g                              # dW_o = dyᵀ g: [N, H·V], a plain GEMM
        return do, dr, dnw.to(nw.dtype), dw, (dy if ctx.has_res else None), None, None, None


def proj_out(o: torch.Tensor, r: torch.Tensor, norm_weight: torch.Tensor, w_o: torch.Tensor,
             residual: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Shapes as ops.proj_out.naive.proj_out: o [B, T, H, V], r [B, T, H·V], norm_weight [V],
    w_o [d, H·V], residual [B, T, d] or None → [B, T, d]. V must be a power of two, 16 or more."""
    from ops import BackendError

    B, T, H, V = o.shape
    N = w_o.shape[0]
    if V < 16 or V & (V - 1):
        raise BackendError(f"op 'proj_out', backend 'fused': head dim V={V} is not supported (the kernels tile a "
                           "head's channels, which needs a power of two ≥ 16); choose --model.head_v_dim so, or "
                           "drop 'proj' from --fuse")
    if B * T * max(N, H * V) >= 2 ** 31:
        raise BackendError(f"op 'proj_out', backend 'fused': B·T·max(d, H·V) = {B * T * max(N, H * V)} overflows "
                           "the kernels' int32 offsets; use a smaller micro-batch or drop 'proj' from --fuse")
    if r.shape != (B, T, H * V) or w_o.shape[1] != H * V or norm_weight.shape != (V,):
        raise ValueError(f"proj_out: shapes o {tuple(o.shape)}, r {tuple(r.shape)}, w_o {tuple(w_o.shape)}, "
                         f"norm_weight {tuple(norm_weight.shape)} do not agree")
    dev = o.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else o.dtype
    o2 = o.to(dtype).reshape(B * T, H * V).contiguous()
    r2 = r.to(dtype).reshape(B * T, H * V).contiguous()
    res = None if residual is None else residual.reshape(B * T, N).contiguous()
    y = FusedProjOut.apply(o2, r2, norm_weight, w_o.to(dtype).contiguous(), res, eps, H, V)
    return y.view(B, T, N)


def build(fuse: frozenset[str]) -> Callable:
    """`proj` is this op's one component (ops.get_op has checked the names)."""
    return proj_out
