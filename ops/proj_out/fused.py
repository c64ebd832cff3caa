"""The output side of the projection chain on the `fused` backend (component `proj`), in either of naive.py's
two orderings of the norm and the gate:

    y = residual + (RMSNorm_head(o) · w ⊙ silu(r)) W_oᵀ          GLA, Gated DeltaNet (gate_first=False)
    y = residual + (RMSNorm_head(o ⊙ silu(r)) · w) W_oᵀ          Mamba-2 (gate_first=True; one head, V = d_inner)

Forward, two kernels (kernels.py): one elementwise pass forms the gated input g once per row (either ordering, a
constexpr switch of the same kernel), then a pipelined Triton GEMM computes g W_oᵀ with the residual add in its
epilogue, so y is written once, in the residual's dtype. The GEMM is Triton rather than cuBLAS because cuBLAS
cannot take the fp32 residual in its epilogue with bf16 operands (mm then add writes and reads y twice more).
Backward: dg = dy W_o (cuBLAS), one elementwise kernel that recomputes the norm statistics and the gate from o and
r and writes g, do, dr and per-program partial sums of the norm weight's gradient, then dW_o = dyᵀ g (cuBLAS); the
residual's gradient is dy itself. The op saves only o and r (and the weights): g is recomputed, not kept, where
PyTorch's chain keeps normed, silu(r) and g as well.

Under autocast the op computes in the autocast dtype, as F.linear would (o, r and W_o cast to it; the norm weight
stays fp32 inside the kernels); its output takes the residual's dtype (fp32 in the model's residual stream), like
`residual + y` does. The compute dtype is chosen in `launch`, outside the operators (autocast does not reach an
operator's inputs).

The kernels are launched only from the operators chunkfuse::proj_out_fwd (gate kernel, GEMM) and
chunkfuse::proj_out_bwd (both cuBLAS GEMMs and the gate backward kernel), which torch.compile(fullgraph=True)
traces as opaque calls (ops/library.py): Inductor never compiles the kernels, which are launched by plain Triton
(eps an fp32 scalar). Their fake implementations give the real outputs' shapes, dtypes and contiguous strides.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import triton

from ops import backend_fn
from ops.library import contiguous, kernel_op
from ops.proj.gemm import launch_gemm
from ops.proj_out.kernels import gate_bwd_kernel, gate_fwd_kernel, gemm_res_kernel
from ops.triton_utils import cdiv, check_dtypes, check_triton_device, dot_precision, next_power_of_2, sum_partials

COMPONENTS = ("proj",)
# The GEMM's tiles: 6 configs, keyed on (d, H·V) and the residual switch, never on the rows. 128×256 and
# 256×128 with 3 stages take 144 KB of shared memory (fits sm80's 163 KB and sm90's 227 KB); a config
# a device cannot hold fails to compile and the autotuner skips it.
GEMM_CONFIGS = [triton.Config(dict(BM=bm, BN=bn, BK=64, GROUP=8), num_warps=nw, num_stages=st)
                for bm, bn, nw, st in ((128, 256, 8, 3), (256, 128, 8, 3), (128, 128, 8, 4), (128, 128, 4, 4),
                                       (64, 256, 4, 4), (128, 64, 4, 4))]
# The elementwise kernels: a [BR, BV] tile of 4096 elements over 8 warps (16 per thread per operand;
# the backward keeps ~8 such operands live). They are bound by HBM, so no autotuning. A tile holds
# BR = 4096 / BV head-rows whatever V is, so the registers per thread do not grow with V up to BV = 4096
# (sm_90 ptxas: the backward takes 255 registers and a 32-byte spill at V = 128, 220 and no spill at
# Mamba-2's one head of V = 2048, whose two rows a tile sum across warps through shared memory; past
# 4096 one row outgrows the tile: V = 8192 spills 0.4-0.75 KB a thread). A backward program takes BWD_LOOP tiles and at least
# BWD_MIN_ROWS head-rows: each program writes a V-wide fp32 row of partial norm-weight gradients that
# .sum(0) reads again, which at V = 2048 (BR = 2) and 4 tiles a program is 17 MB written and read for
# B8 T2048, 8% over the kernel's own 403 MB; 32 rows a program make it 2%, with 512 programs (~4 per
# SM) still filling the H100. At V ≤ 256 (GLA) BWD_LOOP already gives ≥ 64 rows: unchanged there.
TILE_ELEMS, TILE_WARPS, BWD_LOOP, BWD_MIN_ROWS = 4096, 8, 4, 32
# Under TRITON_INTERPRET=1 (CPU tests): small tiles, so that test sizes give several programs, ragged
# edges and (BWD_LOOP) partial row blocks inside a program (the GEMM's: ops.proj.gemm.INTERPRET_TILES).
INTERPRET_TILE_ELEMS, INTERPRET_BWD_LOOP = 64, 2


check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def _prune(configs, named_args, **kwargs):
    """Drop tiles wider than the matrix they cover (keep the narrowest if none is left)."""
    n, k = next_power_of_2(named_args["N"]), next_power_of_2(named_args["K"])
    kept = [c for c in configs if c.kwargs["BN"] <= max(n, 64) and c.kwargs["BK"] <= max(k, 16)]
    return kept or [min(configs, key=lambda c: c.kwargs["BN"])]


_gemm_tuned = triton.autotune(GEMM_CONFIGS, key=["N", "K", "HAS_RES"],
                              prune_configs_by={"early_config_prune": _prune})(gemm_res_kernel)


def _rows_per_tile(V: int, cuda: bool) -> tuple[int, int]:
    """(BV, BR): a head padded to a power of two, and the head-rows a program takes per step."""
    bv = next_power_of_2(V)
    return bv, max(1, (TILE_ELEMS if cuda else INTERPRET_TILE_ELEMS) // bv)


def plan(device: torch.device, M: int, H: int, V: int, d: int, **_) -> str:
    """What the op launches for M rows at these widths, for the run log."""
    bv, br = _rows_per_tile(V, device.type == "cuda")
    return (f"forward: gate kernel ({br} head-row(s) of {bv} per program step), then a Triton GEMM with the residual "
            f"add in its epilogue (tiles autotuned over {len(GEMM_CONFIGS)} configs, keyed on d and H·V); "
            "backward: cuBLAS dg, gate backward kernel, cuBLAS dW_o")


def gate_fwd(o: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, eps: float, V: int,
             gate_first: bool = False) -> torch.Tensor:
    """o: [M, H·V] contiguous; r: [M, H·V] with unit column stride (any row stride); nw: (V,) fp32 →
    g = RMSNorm_head(o)·nw ⊙ silu(r) (gate_first: RMSNorm_head(o ⊙ silu(r))·nw), [M, H·V] in o's dtype."""
    g = torch.empty_like(o)
    R = o.numel() // V
    bv, br = _rows_per_tile(V, o.is_cuda)
    warps = dict(num_warps=TILE_WARPS) if o.is_cuda else {}
    gate_fwd_kernel[(cdiv(R, br),)](o, r, nw, g, R, r.stride(0), eps, H=o.shape[1] // V, V=V, BV=bv, BR=br,
                                           GATE_FIRST=gate_first, **warps)
    return g


def gemm_res(a: torch.Tensor, w: torch.Tensor, res: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """a: [M, K]; w: [N, K] (nn.Linear's layout), same dtype; res: [M, N] or None → a wᵀ (+ res), [M, N]."""
    M, K = a.shape
    N = w.shape[0]
    y = torch.empty(M, N, device=a.device, dtype=out_dtype)
    meta = dict(HAS_RES=res is not None, PREC=dot_precision(w))
    res = y if res is None else res                   # a dummy pointer without a residual (HAS_RES off)
    launch_gemm(_gemm_tuned, gemm_res_kernel, M, N, (a, w, res, y, M, N, K), a, **meta)
    return y


def gate_bwd(dg: torch.Tensor, o: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, eps: float, V: int,
             gate_first: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dg, o: [M, H·V] contiguous; r as gate_fwd's; nw: (V,) fp32 → g, do, dr ([M, H·V] contiguous, o's dtype) and
    the norm weight's gradient (V,) fp32."""
    g, do, dr = (torch.empty_like(o) for _ in range(3))
    R = o.numel() // V
    bv, br = _rows_per_tile(V, o.is_cuda)
    loop = max(BWD_LOOP, BWD_MIN_ROWS // br) if o.is_cuda else INTERPRET_BWD_LOOP
    programs = cdiv(R, br * loop)
    dnw = torch.empty(programs, V, device=o.device, dtype=torch.float32)      # every program writes its row
    warps = dict(num_warps=TILE_WARPS) if o.is_cuda else {}
    gate_bwd_kernel[(programs,)](dg, o, r, nw, g, do, dr, dnw, R, r.stride(0), eps, H=o.shape[1] // V, V=V, BV=bv,
                                 BR=br, LOOP=loop, GATE_FIRST=gate_first, **warps)
    return g, do, dr, sum_partials(dnw)


def _fwd_fake(o: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, w: torch.Tensor, res: torch.Tensor | None,
              eps: float, V: int, gate_first: bool) -> torch.Tensor:
    return o.new_empty((o.shape[0], w.shape[0]), dtype=res.dtype if res is not None else w.dtype)


@kernel_op("proj_out_fwd", _fwd_fake)
def proj_out_fwd(o: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, w: torch.Tensor, res: torch.Tensor | None,
                 eps: float, V: int, gate_first: bool) -> torch.Tensor:
    """o, r: [M, H·V] in the compute dtype (o contiguous, r with unit column stride, any row stride); nw (V,);
    w [N, H·V] contiguous, the compute dtype; res [M, N] contiguous or None → y = gate(o, r)·W_oᵀ (+ res), [M, N]
    contiguous in res's dtype (w's without a residual). The gated input g is formed once and dropped."""
    out_dtype = res.dtype if res is not None else w.dtype
    return gemm_res(gate_fwd(o, r, nw.float(), eps, V, gate_first), w, res, out_dtype)


def _bwd_fake(dy: torch.Tensor, o: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, w: torch.Tensor, eps: float,
              V: int, gate_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return o.new_empty(o.shape), o.new_empty(o.shape), nw.new_empty(nw.shape), w.new_empty(w.shape)


@kernel_op("proj_out_bwd", _bwd_fake)
def proj_out_bwd(dy: torch.Tensor, o: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, w: torch.Tensor, eps: float,
                 V: int, gate_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy [M, N] (the autograd formula passes it contiguous in w's dtype; anything else is cast here); o, r, nw, w
    as proj_out_fwd's (r as saved: the forward's view) → do, dr ([M, H·V], o's dtype), dnw ((V,), nw's dtype; fp32
    partial sums) and dW_o ([N, H·V], w's dtype), all contiguous. dg = dy W_o and dW_o = dyᵀ g on cuBLAS, g
    recomputed by the gate backward kernel."""
    dyc = dy.to(w.dtype).contiguous()             # a no-op when the formula has cast and laid out dy already
    dg = dyc @ w                                  # dg = dy W_o: [M, H·V], cuBLAS
    g, do, dr, dnw = gate_bwd(dg, o, r, nw.float(), eps, V, gate_first)
    del dg                                        # freed before dW_o's GEMM allocates its output
    dw = dyc.t() @ g                              # dW_o = dyᵀ g: [N, H·V], cuBLAS
    return do, dr, dnw.to(nw.dtype), dw


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    o, r, nw, w, res, eps, V, gate_first = inputs
    ctx.save_for_backward(o, r, nw, w)            # r as given: a view of the input projection's output, no copy
    ctx.eps, ctx.V, ctx.has_res, ctx.gate_first = eps, V, res is not None, gate_first


def _backward(ctx, dy: torch.Tensor) -> tuple:
    """The residual's gradient is dy itself. No second-order terms: proj_out_bwd has no gradient of its own, so a
    double backward raises."""
    o, r, nw, w = ctx.saved_tensors
    (dyc,) = contiguous(dy.to(w.dtype))           # one cast of an fp32 dy (autocast), contiguous for the kernels
    do, dr, dnw, dw = proj_out_bwd(dyc, o, r, nw, w, ctx.eps, ctx.V, ctx.gate_first)
    return do, dr, dnw, dw, (dy if ctx.has_res else None), None, None, None


proj_out_fwd.register_autograd(_backward, setup_context=_setup_context)


def launch(fn: Callable, o: torch.Tensor, r: torch.Tensor, norm_weight: torch.Tensor,
           w_o: torch.Tensor, residual: torch.Tensor | None, eps: float, gate_first: bool = False) -> torch.Tensor:
    """Checks and casts proj_out's arguments and applies `fn` (the operator proj_out_fwd, or a benchmark's variant
    taking the same forward arguments: a function, or an autograd.Function whose `apply` is used) to the flattened
    [B·T, …] operands. The compute dtype (autocast's, which does not reach an operator's inputs) is chosen here."""
    from ops import BackendError

    B, T, H, V = o.shape
    N = w_o.shape[0]
    if B * T * max(N, H * V) >= 2 ** 31:
        raise BackendError(f"op 'proj_out', backend 'fused': B·T·max(d, H·V) = {B * T * max(N, H * V)} overflows "
                           "the kernels' int32 offsets; use a smaller micro-batch or drop 'proj' from --fuse")
    if r.shape != (B, T, H * V) or w_o.shape[1] != H * V or norm_weight.shape != (V,):
        raise ValueError(f"proj_out: shapes o {tuple(o.shape)}, r {tuple(r.shape)}, w_o {tuple(w_o.shape)}, "
                         f"norm_weight {tuple(norm_weight.shape)} do not agree")
    dev = o.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else o.dtype
    o2 = o.to(dtype).reshape(B * T, H * V).contiguous()
    r2 = r.to(dtype).reshape(B * T, H * V)          # a view when r is a column slice of a wider GEMM output
    if r2.stride(1) != 1 or B * T * r2.stride(0) >= 2 ** 31:
        r2 = r2.contiguous()
    res = None if residual is None else residual.reshape(B * T, N).contiguous()
    apply = fn.apply if isinstance(fn, type) else fn
    y = apply(o2, r2, norm_weight, w_o.to(dtype).contiguous(), res, eps, V, gate_first)
    return y.view(B, T, N)


@backend_fn(plan=plan)
def proj_out(o: torch.Tensor, r: torch.Tensor, norm_weight: torch.Tensor, w_o: torch.Tensor,
             residual: torch.Tensor | None = None, eps: float = 1e-6, *, gate_first: bool = False) -> torch.Tensor:
    """Shapes and orderings as ops.proj_out.naive.proj_out: o [B, T, H, V], r [B, T, H·V], norm_weight (V,),
    w_o [d, H·V], residual [B, T, d] or None → [B, T, d]; gate_first: the norm after the gate (Mamba-2).
    Any V (a head is padded to a power of two inside the elementwise kernels; sized for V ≤ 4096)."""
    check_dtypes("proj_out", "fused", o, r, w_o)
    return launch(proj_out_fwd, o, r, norm_weight, w_o, residual, eps, gate_first)


def build(fuse: frozenset[str]) -> Callable:
    """`proj` is this op's one component (ops.get_op has checked the names)."""
    return proj_out
