"""The input side of GLA's projection chain on the `fused` backend (component `proj`):

    q, k, v, r = x W_qᵀ, x W_kᵀ, x W_vᵀ, x W_rᵀ;   gk = logsigmoid((x W_downᵀ) W_upᵀ + b) / normalizer

Forward: one copy of the weights into W_cat = [W_q; W_k; W_v; W_r; W_down] ([N, d], N = 2HK + 2HV + L) in the
compute dtype, rebuilt per call so nothing is cached; one Triton pass over x (the prologue) that writes xc = x in
the compute dtype, the rank-L `low` = xc W_downᵀ and gk = logsigmoid(low W_upᵀ + b)/normalizer in fp32; then the
GEMM xc W_catᵀ writes q, k, v, r, each contiguous as [B, T, H, D].
Backward: one Triton kernel recomputes z from low and reduces dz = dgk·σ(−z)/normalizer in registers into
partials of dlow = dz W_up, dW_up = dzᵀ low and db (dz never reaches HBM); dx = [dq | dk | dv | dr | dlow] W_cat,
one GEMM, rounded once; the five dW_s = dA_sᵀ x by cuBLAS, fp32 straight from the accumulator. Saved: xc (x itself
when no cast is needed), low and W_cat (PyTorch's chain keeps five casts of x and the fp32 logsigmoid input).

The two big GEMMs each have two engines, named in ENGINES. `library`, the op's: the forward by cuBLAS (`mm_gemm`:
one mm per slice) and dx by our Triton kernel (`triton_dgrad`: one K loop per gradient, so the five gradients need
no concatenation and dx is written once; persistent and by TMA on Hopper, by pointer loads elsewhere). `triton`
runs the forward by our wide Triton GEMM too (its epilogue stores each column into its slice of one buffer, reading
x once; the four blocks are then copied out, see below); `cat` runs dx by cuBLAS over the concatenated gradients
(`cat_dgrad`). Every engine pair is tested against the oracle; scripts/bench_ops.py times them side by side.

The kernels are launched only from the operators chunkfuse::proj_in_fwd (weight casts, prologue, forward GEMM)
and chunkfuse::proj_in_bwd (gk backward, dx, dW), which torch.compile(fullgraph=True) traces as opaque calls
(ops/library.py); the engine is their `engine` argument, the compute dtype is chosen outside them (`launch`).
An operator's outputs may not share storage, so q, k, v, r are four tensors of their own (the `triton` engine
copies them out of its kernel's one buffer); the shapes and strides are the ones the mixer always got.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ops import backend_fn
from ops.library import absent, contiguous, kernel_op
from ops.proj.gemm import INTERPRET_TILES, launch_gemm
from ops.proj_in.kernels import dgrad_kernel, dgrad_tma_kernel, gemm_in_kernel, gk_bwd_kernel, prologue_kernel
from ops.triton_utils import (cdiv, check_dtypes, check_triton_device, dot_precision, next_power_of_2,
                              sum_partials)

COMPONENTS = ("proj",)
# The Triton forward GEMM and the pointer-load dx: 4 configs each (TMA_CONFIGS below for dx by TMA), keyed on the
# widths, never on the rows. 128×256 / 256×128 with 3 stages take 144 KB of shared memory (sm80 holds 163 KB, sm90
# 227 KB).
GEMM_CONFIGS = [triton.Config(dict(BM=bm, BN=bn, BK=64, GROUP=8), num_warps=nw, num_stages=st)
                for bm, bn, nw, st in ((128, 256, 8, 3), (256, 128, 8, 3), (128, 128, 8, 4), (128, 128, 4, 4))]


def _tma_blocks(nargs: dict) -> None:
    """Autotune's pre-hook for dgrad_tma_kernel: the descriptors' block shapes for the config about to run."""
    BM, BN, BK, BL = (nargs[k] for k in ("BM", "BN", "BK", "BL"))
    for name in ("dq", "dk", "dv", "dr"):
        nargs[name].block_shape = [BM, BK]
    nargs["dlow"].block_shape = [BM, BL]
    nargs["w"].block_shape = [BK, BN]
    nargs["w_low"].block_shape = [BL, BN]
    nargs["dx"].block_shape = [BM, BN // 2]          # the epilogue stores two halves


# dx by TMA, persistent: one or two programs per SM (PER_SM; one CTA fits at a time), 128×256 or 256×128 tiles,
# three stages: on the H100 these beat one program per tile, 128×128 tiles and BK = 128.
TMA_CONFIGS = [triton.Config(dict(BM=bm, BN=bn, BK=64, GROUP=8, PER_SM=per_sm), num_warps=8, num_stages=3,
                             pre_hook=_tma_blocks) for bm, bn in ((128, 256), (256, 128)) for per_sm in (1, 2)]
# The prologue and gk backward stream [BR, BK] / [BR, BN] tiles (bound by HBM; no autotuning): the best of a sweep
# of launch configurations on the H100.
PROLOGUE = dict(BR=64, BK=64, BN=128, num_warps=8, num_stages=3)
GK_BWD = dict(BR=64, BN=128, num_warps=4, num_stages=3)
GK_BWD_PROGRAMS = 264                            # ≈ 2 per SM on an H100
MAX_RANK = 64                                    # low [BR, L] and dlow stay in registers: L ≤ 64
# Under TRITON_INTERPRET=1 (CPU tests): small tiles (the GEMMs' are ops.proj.gemm.INTERPRET_TILES).
INTERPRET_GK = dict(BR=16, BK=16, BN=16)


check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def _prune(configs, named_args, **kwargs):
    """Drop tiles wider than the output they cover, dx's D columns or the forward's 2HK + 2HV (keep the narrowest
    if none is left)."""
    width = named_args["D"] if "dx" in named_args else 2 * named_args["HK"] + 2 * named_args["HV"]
    n = next_power_of_2(width)
    kept = [c for c in configs if c.kwargs["BN"] <= max(n, 64)]
    return kept or [min(configs, key=lambda c: c.kwargs["BN"])]


_gemm_tuned = triton.autotune(GEMM_CONFIGS, key=["D", "HK", "HV"],
                              prune_configs_by={"early_config_prune": _prune})(gemm_in_kernel)
_dgrad_tuned = triton.autotune(GEMM_CONFIGS, key=["D", "HK", "HV", "L"],
                               prune_configs_by={"early_config_prune": _prune})(dgrad_kernel)
_dgrad_tma_tuned = triton.autotune(TMA_CONFIGS, key=["D", "HK", "HV", "L"],
                                   prune_configs_by={"early_config_prune": _prune})(dgrad_tma_kernel)


def widths(w_q: torch.Tensor, w_v: torch.Tensor, w_down: torch.Tensor) -> tuple[int, int, int, list[int]]:
    """HK, HV, L and the slice starts of W_cat's rows: [0, HK, 2HK, 2HK + HV, 2HK + 2HV, N]."""
    HK, HV, L = w_q.shape[0], w_v.shape[0], w_down.shape[0]
    return HK, HV, L, [0, HK, 2 * HK, 2 * HK + HV, 2 * HK + 2 * HV, 2 * HK + 2 * HV + L]


def cast_weights(ws: tuple[torch.Tensor, ...], w_up: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """W_cat [N, d] (ws stacked by rows) and W_up [HK, L], both in dtype, by one torch._foreach_copy_ (one launch
    for all six casts on a GPU), no fp32 intermediate."""
    w_cat = torch.empty(sum(w.shape[0] for w in ws), ws[0].shape[1], device=ws[0].device, dtype=dtype)
    wu = torch.empty(w_up.shape, device=w_up.device, dtype=dtype)
    rows = [0, *itertools.accumulate(w.shape[0] for w in ws)]
    torch._foreach_copy_([w_cat[a:b] for a, b in zip(rows, rows[1:])] + [wu], [*ws, w_up])
    return w_cat, wu


def wide_gemm(xc: torch.Tensor, w_cat: torch.Tensor, HK: int, HV: int) -> list[torch.Tensor]:
    """xc [M, d], w_cat [N, d] (one dtype) → q, k [M, HK], v, r [M, HV], each its own contiguous tensor. The kernel
    writes one buffer (the four blocks back to back, kernels.py) reading x once; each block is then copied out of
    it, since an operator's outputs may not share storage. low is the prologue's: W_cat's last L rows are not read."""
    M, D = xc.shape
    out = torch.empty(M * (2 * HK + 2 * HV), device=xc.device, dtype=xc.dtype)
    launch_gemm(_gemm_tuned, gemm_in_kernel, M, 2 * HK + 2 * HV, (xc, w_cat, out, M, D, HK, HV), xc,
                PREC=dot_precision(xc))
    bounds = [0, HK, 2 * HK, 2 * HK + HV, 2 * HK + 2 * HV]
    return [out[M * a:M * b].view(M, b - a).clone() for a, b in zip(bounds, bounds[1:])]


def mm_gemm(xc: torch.Tensor, w_cat: torch.Tensor, HK: int, HV: int) -> list[torch.Tensor]:
    """wide_gemm's contract by cuBLAS: one mm per slice, each into its own tensor (x is read four times)."""
    bounds = [0, HK, 2 * HK, 2 * HK + HV, 2 * HK + 2 * HV]
    with torch.autocast(xc.device.type, enabled=False):
        return [torch.mm(xc, w_cat[a:b].t()) for a, b in zip(bounds, bounds[1:])]


def cat_dgrad(grads: list[torch.Tensor], w_cat: torch.Tensor, HK: int, HV: int, out_dtype: torch.dtype) -> torch.Tensor:
    """triton_dgrad's contract by cuBLAS: the gradients concatenated ([M, N], one copy), one mm, one cast."""
    with torch.autocast(w_cat.device.type, enabled=False):
        return (torch.cat(grads, 1) @ w_cat).to(out_dtype)


def tma_addressable(tensors: list[torch.Tensor]) -> bool:
    """Whether dx can go through tensor descriptors: on a GPU of compute capability ≥ 9 (TMA) with 16-bit
    operands (TMA_CONFIGS' tiles need 263 KB of shared memory in fp32, more than the H100's 227), or under the
    interpreter (CPU tests, any dtype: it has no shared-memory limit), when every tensor is 16-byte aligned with
    16-byte row strides, as TMA requires. tensors: the operands, then dx (fp32 by design, so not size-checked).
    Otherwise dgrad_kernel (pointer loads) runs, e.g. at widths that are not multiples of 8 bf16 elements."""
    t0 = tensors[0]
    if t0.is_cuda and (torch.cuda.get_device_capability(t0.device)[0] < 9
                       or any(t.element_size() != 2 for t in tensors[:-1])):
        return False
    return all(t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0
                                                                   for s in t.stride()[:-1]) for t in tensors)


def dx_engine(device: torch.device, dtype: torch.dtype, widths: tuple[int, ...]) -> str:
    """Which dx kernel triton_dgrad picks on `device` for operands in `dtype` of these widths (d, HK, HV, L; every
    row stride a multiple of 16 bytes, as freshly allocated tensors have), as tma_addressable decides it."""
    if device.type == "cuda" and (torch.cuda.get_device_capability(device)[0] < 9 or dtype.itemsize != 2):
        return "pointer loads"
    return "TMA, persistent" if all(w * dtype.itemsize % 16 == 0 for w in widths) else "pointer loads"


def plan(device: torch.device, M: int, d: int, HK: int, HV: int, L: int, dtype: torch.dtype, **_) -> str:
    """What the op launches for M rows of x at these widths, for the run log."""
    engine = dx_engine(device, dtype, (d, HK, HV, L))
    configs = TMA_CONFIGS if engine.startswith("TMA") else GEMM_CONFIGS
    return (f"forward: prologue kernel (cast, rank-{L} gate) then cuBLAS GEMMs into q, k, v, r; backward: gk "
            f"kernel, dx by a Triton GEMM with {engine} (tiles autotuned over {len(configs)} configs, keyed on "
            "the widths), dW by cuBLAS")


def triton_dgrad(grads: list[torch.Tensor], w_cat: torch.Tensor, HK: int, HV: int,
                 out_dtype: torch.dtype) -> torch.Tensor:
    """grads = [dq, dk, dv, dr, dlow] ([M, width] contiguous, w_cat's dtype) → dx = Σ_s dA_s W_cat[slice s],
    [M, d] in out_dtype. By TMA where tma_addressable, else by pointer loads; the two agree to rounding."""
    M, L = grads[4].shape
    D = w_cat.shape[1]
    dx = torch.empty(M, D, device=w_cat.device, dtype=out_dtype)
    prec = dot_precision(w_cat)
    if not tma_addressable([*grads, w_cat, dx]):
        launch_gemm(_dgrad_tuned, dgrad_kernel, M, D, (*grads, w_cat, dx, M, D, HK, HV, L), w_cat, PREC=prec)
        return dx
    BL = max(16, next_power_of_2(L))
    # the block shapes are placeholders on a GPU: the autotuner's pre-hook sets each config's own
    descs = [TensorDescriptor.from_tensor(t, [16, 16]) for t in (*grads, w_cat, w_cat, dx)]
    args = (*descs, M, D, HK, HV, L)
    if w_cat.is_cuda:
        sms = torch.cuda.get_device_properties(w_cat.device).multi_processor_count
        tiles = lambda m: cdiv(M, m["BM"]) * cdiv(D, m["BN"])                 # noqa: E731
        _dgrad_tma_tuned[lambda m: (min(tiles(m), m["PER_SM"] * sms),)](*args, PREC=prec, BL=BL)
    else:                 # a few programs, so that each walks several tiles (ragged edges among them)
        t = dict(INTERPRET_TILES, BN=32, PER_SM=1)
        _tma_blocks(dict(zip(("dq", "dk", "dv", "dr", "dlow", "w", "w_low", "dx"), descs), BL=BL, **t))
        programs = min(3, cdiv(M, t["BM"]) * cdiv(D, t["BN"]))
        dgrad_tma_kernel[(programs,)](*args, PREC=prec, BL=BL, **t)
    return dx


def wgrad(da: torch.Tensor, a: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """dW = daᵀ a ([M, n], [M, k] → [n, k]) by cuBLAS, in out_dtype. bf16/fp16 operands on a GPU with fp32
    parameters: fp32 straight from the accumulator (no rounding to bf16, no cast kernel: 5 fewer launches)."""
    if da.is_cuda and da.dtype != out_dtype and out_dtype == torch.float32:
        return torch.mm(da.t(), a, out_dtype=out_dtype)
    return (da.t() @ a).to(out_dtype)


def _gk_tiles(on: torch.Tensor, L: int, launch: dict, names: tuple[str, ...]) -> tuple[dict, dict]:
    """(tile sizes, launch options) of a gk kernel: BL pads the rank to a power of two ≥ 16 (tl.dot's minimum)."""
    bl = max(16, next_power_of_2(L))
    t = launch if on.is_cuda else INTERPRET_GK
    return {**{k: t[k] for k in names}, "BL": bl}, {k: v for k, v in t.items() if k.startswith("num_")}


def prologue(x: torch.Tensor, w_down: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor, inv_norm: float,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, d] (any float dtype), w_down [L, d] and w_up [HK, L] in dtype, b_up [HK] → xc [M, d] in dtype (x
    itself when it already is that, contiguous), low [M, L] in dtype, gk = logsigmoid(low W_upᵀ + b)·inv_norm
    [M, HK] fp32: one pass over x."""
    (M, D), (L, HK) = x.shape, (w_down.shape[0], w_up.shape[0])
    x = x.contiguous()
    store = x.dtype != dtype
    xc = torch.empty(M, D, device=x.device, dtype=dtype) if store else x
    low = torch.empty(M, L, device=x.device, dtype=dtype)    # its own tensor: saving it keeps only M·L alive
    gk = torch.empty(M, HK, device=x.device, dtype=torch.float32)
    t, opts = _gk_tiles(x, L, PROLOGUE, ("BR", "BK", "BN"))
    prologue_kernel[(cdiv(M, t["BR"]),)](x, xc, w_down, low, w_up, b_up, gk, M, D, HK, L, inv_norm,
                                               STORE_XC=store, PREC=dot_precision(xc), **t, **opts)
    return xc, low, gk


def gk_bwd(low: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor, dgk: torch.Tensor, inv_norm: float,
           w_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dgk [M, HK] → dlow [M, L] in low's dtype, dW_up [HK, L] in w_dtype, db [HK] fp32. The kernel's grid is
    column blocks × row ranges, about GK_BWD_PROGRAMS programs; its partials (dlow's: HK / BN · M · L fp32, 34 MB
    at the seed shape, where dz was 134 MB of bf16 written and read again; as large as dz at L = 64) are summed
    here. Offsets stay in int32 while BN ≥ 32: the largest, HK / BN · M · L with L ≤ 64, is then < M · N, which
    `launch` bounds."""
    (M, L), HK = low.shape, w_up.shape[0]
    t, opts = _gk_tiles(low, L, GK_BWD, ("BR", "BN"))
    n_col = cdiv(HK, t["BN"])
    ranges = max(1, min(cdiv(M, t["BR"]), GK_BWD_PROGRAMS // n_col))
    rows = cdiv(cdiv(M, ranges), t["BR"]) * t["BR"]
    ranges = cdiv(M, rows)
    f32 = dict(device=low.device, dtype=torch.float32)
    dlow_p, dwu_p = torch.empty(n_col, M, L, **f32), torch.empty(ranges, L, HK, **f32)
    db_p = torch.empty(ranges, HK, **f32)
    gk_bwd_kernel[(n_col, ranges)](low, w_up, b_up, dgk, dlow_p, dwu_p, db_p, M, HK, L, inv_norm, rows,
                                   PREC=dot_precision(low), **t, **opts)
    return sum_partials(dlow_p, low.dtype), sum_partials(dwu_p, w_dtype).t().contiguous(), sum_partials(db_p)


# The engine pairs by name (the operators' `engine` argument): the forward GEMM and dx (module docstring).
ENGINES = {"library": (mm_gemm, triton_dgrad), "triton": (wide_gemm, triton_dgrad), "cat": (mm_gemm, cat_dgrad)}
FusedProjIn, TritonProjIn, CatProjIn = "library", "triton", "cat"      # the engines' names, as `launch` takes them

Tensors9 = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                 torch.Tensor, torch.Tensor]
Tensors8 = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                 torch.Tensor]


def _fwd_fake(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_r: torch.Tensor,
              w_down: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor, dtype: torch.dtype, inv_norm: float,
              engine: str) -> Tensors9:
    (M, d), (HK, HV, L, starts) = x.shape, widths(w_q, w_v, w_down)
    new = lambda *shape, dt=dtype: x.new_empty(shape, dtype=dt)                                 # noqa: E731
    xc = absent(x) if x.dtype == dtype else new(M, d)
    return new(M, HK), new(M, HK), new(M, HV), new(M, HK, dt=torch.float32), new(M, HV), xc, new(M, L), \
        new(starts[-1], d), new(HK, L)


@kernel_op("proj_in_fwd", _fwd_fake)
def proj_in_fwd(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_r: torch.Tensor,
                w_down: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor, dtype: torch.dtype, inv_norm: float,
                engine: str) -> Tensors9:
    """x [M, d] contiguous in any float dtype, the seven parameters as nn.Linear holds them, dtype the GEMMs' →
    q, k [M, HK], v, r [M, HV] in dtype and gk [M, HK] fp32 (each its own contiguous tensor), then what the
    backward needs: xc [M, d] (x in dtype; 0 elements when x already is, the backward then keeps x), low [M, L],
    W_cat [N, d] and W_up [HK, L], all in dtype. engine: a key of ENGINES, picking the forward GEMM."""
    HK, HV, _, _ = widths(w_q, w_v, w_down)
    w_cat, wu = cast_weights((w_q, w_k, w_v, w_r, w_down), w_up, dtype)     # buffers of the op's own
    # the one cast of x (PyTorch's chain casts it five times), low and gk, in one pass
    xc, low, gk = prologue(x, w_cat[2 * HK + 2 * HV:], wu, b_up, inv_norm, dtype)
    q, k, v, r = ENGINES[engine][0](xc, w_cat, HK, HV)
    return q, k, v, gk, r, absent(x) if x.dtype == dtype else xc, low, w_cat, wu


def _bwd_fake(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, dgk: torch.Tensor, dr: torch.Tensor,
              xc: torch.Tensor, low: torch.Tensor, w_cat: torch.Tensor, wu: torch.Tensor, b_up: torch.Tensor,
              inv_norm: float, x_dtype: torch.dtype, w_dtype: torch.dtype, engine: str) -> Tensors8:
    (M, d), (HK, L), HV = xc.shape, wu.shape, dv.shape[1]
    return (xc.new_empty((M, d), dtype=x_dtype), *(xc.new_empty((n, d), dtype=w_dtype) for n in (HK, HK, HV, HV, L)),
            wu.new_empty((HK, L), dtype=w_dtype), b_up.new_empty(b_up.shape))


@kernel_op("proj_in_bwd", _bwd_fake)
def proj_in_bwd(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, dgk: torch.Tensor, dr: torch.Tensor,
                xc: torch.Tensor, low: torch.Tensor, w_cat: torch.Tensor, wu: torch.Tensor, b_up: torch.Tensor,
                inv_norm: float, x_dtype: torch.dtype, w_dtype: torch.dtype, engine: str) -> Tensors8:
    """dq, dk [M, HK], dv, dr [M, HV] (the autograd formula passes them contiguous in xc's dtype, dgk [M, HK]
    contiguous fp32; anything else is cast here); xc (x in the GEMMs' dtype), low, W_cat, W_up as saved, b_up →
    dx [M, d] in x_dtype, dW_q, dW_k, dW_v, dW_r, dW_down ([rows, d]) and dW_up [HK, L] in w_dtype, db [HK] in b_up's
    dtype, all contiguous. engine: a key of ENGINES, picking dx's GEMM."""
    HK, HV = wu.shape[0], dv.shape[1]
    dlow, dw_up, db = gk_bwd(low, wu, b_up, dgk.float().contiguous(), inv_norm, w_dtype)
    grads = [g.to(xc.dtype).contiguous() for g in (dq, dk, dv, dr)] + [dlow]
    dx = ENGINES[engine][1](grads, w_cat, HK, HV, x_dtype)
    dws = [wgrad(g, xc, w_dtype) for g in grads]
    return (dx, *dws, dw_up, db.to(b_up.dtype))


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    x, w_q, w_k, w_v, w_r, w_down, w_up, b_up, dtype, inv_norm, engine = inputs
    xc, low, w_cat, wu = output[5:]
    ctx.mark_non_differentiable(xc, low, w_cat, wu)
    ctx.save_for_backward(x if x.dtype == dtype else xc, low, w_cat, wu, b_up)   # x itself: no copy of it
    ctx.inv_norm, ctx.x_dtype, ctx.engine = inv_norm, x.dtype, engine
    ctx.w_dtypes = [w.dtype for w in (w_q, w_k, w_v, w_r, w_down, w_up)]


def _backward(ctx, dq, dk, dv, dgk, dr, *_) -> tuple:
    """The weights' gradients come back in w_q's dtype and are cast to each weight's (no-ops when they agree, as in
    the model). No second-order terms: proj_in_bwd has no gradient of its own, so a double backward raises."""
    xc, low, w_cat, wu, b_up = ctx.saved_tensors
    grads = contiguous(*(g.to(xc.dtype) for g in (dq, dk, dv)), dgk.float(), dr.to(xc.dtype))
    dx, *dws, db = proj_in_bwd(*grads, xc, low, w_cat, wu, b_up, ctx.inv_norm, ctx.x_dtype, ctx.w_dtypes[0],
                               ctx.engine)
    return (dx, *(g.to(dt) for g, dt in zip(dws, ctx.w_dtypes)), db, None, None, None)


proj_in_fwd.register_autograd(_backward, setup_context=_setup_context)


def launch(engine: str, x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor,
           w_r: torch.Tensor, w_down: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor, n_heads: int,
           normalizer: float) -> tuple[torch.Tensor, ...]:
    """Checks proj_in's arguments and applies the operator proj_in_fwd with `engine` (a key of ENGINES) to x as
    [B·T, d]. The compute dtype (autocast's, which does not reach an operator's inputs) is chosen here."""
    from ops import BackendError

    B, T, d = x.shape
    H = n_heads
    HK, HV, L, starts = widths(w_q, w_v, w_down)
    if not (w_q.shape == w_k.shape == (HK, d) and w_v.shape == w_r.shape == (HV, d) and w_down.shape == (L, d)
            and w_up.shape == (HK, L) and b_up.shape == (HK,) and HK % H == 0 and HV % H == 0):
        raise ValueError(f"proj_in: shapes x {tuple(x.shape)}, w_q {tuple(w_q.shape)}, w_k {tuple(w_k.shape)}, "
                         f"w_v {tuple(w_v.shape)}, w_r {tuple(w_r.shape)}, w_down {tuple(w_down.shape)}, "
                         f"w_up {tuple(w_up.shape)}, b_up {tuple(b_up.shape)}, {H} heads do not agree")
    if B * T * max(starts[-1], d) >= 2 ** 31:
        raise BackendError(f"op 'proj_in', backend 'fused': B·T·max(N, d) = {B * T * max(starts[-1], d)} overflows "
                           "the kernels' int32 offsets; use a smaller micro-batch or drop 'proj' from --fuse")
    if L > MAX_RANK:
        raise BackendError(f"op 'proj_in', backend 'fused': gate low rank {L} > {MAX_RANK} (the gk kernels keep "
                           f"[rows, rank] tiles in registers); use gate_low_rank ≤ {MAX_RANK} or drop 'proj' "
                           "from --fuse")
    if engine not in ENGINES:
        raise ValueError(f"proj_in: engine {engine!r} is not one of {', '.join(ENGINES)}")
    dev = x.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    q, k, v, gk, r, *_ = proj_in_fwd(x.reshape(B * T, d).contiguous(), w_q, w_k, w_v, w_r, w_down, w_up,
                                     b_up.contiguous(), dtype, 1.0 / normalizer, engine)
    return q.view(B, T, H, -1), k.view(B, T, H, -1), v.view(B, T, H, -1), gk.view(B, T, H, -1), r.view(B, T, HV)


@backend_fn(plan=plan)
def proj_in(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_r: torch.Tensor,
            w_down: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor, n_heads: int,
            normalizer: float = 16.0) -> tuple[torch.Tensor, ...]:
    """Shapes as ops.proj_in.naive.proj_in: x [B, T, d]; w_q, w_k [H·K, d]; w_v, w_r [H·V, d]; w_down [L, d];
    w_up [H·K, L]; b_up [H·K] → q, k [B, T, H, K], v [B, T, H, V] (x's dtype, or autocast's), gk [B, T, H, K]
    fp32, r [B, T, H·V]. Any K, V, L ≤ 64 (tiles are masked)."""
    check_dtypes("proj_in", "fused", x, w_q)
    return launch("library", x, w_q, w_k, w_v, w_r, w_down, w_up, b_up, n_heads, normalizer)


def proj_in_cat(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_r: torch.Tensor,
                w_down: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor, n_heads: int,
                normalizer: float = 16.0) -> tuple[torch.Tensor, ...]:
    """proj_in with the `cat` engines, dx by cuBLAS (tested and timed beside the library's)."""
    return launch("cat", x, w_q, w_k, w_v, w_r, w_down, w_up, b_up, n_heads, normalizer)


def proj_in_triton(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_r: torch.Tensor,
                   w_down: torch.Tensor, w_up: torch.Tensor, b_up: torch.Tensor, n_heads: int,
                   normalizer: float = 16.0) -> tuple[torch.Tensor, ...]:
    """proj_in with the `triton` engines, both GEMMs ours: tested against the oracle like the op's own engines."""
    return launch("triton", x, w_q, w_k, w_v, w_r, w_down, w_up, b_up, n_heads, normalizer)


def build(fuse: frozenset[str]) -> Callable:
    """`proj` is this op's one component (ops.get_op has checked the names)."""
    return proj_in
