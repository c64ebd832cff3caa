"""RA+MLA on the `fused` backend: flash-style attention in latent space, O(T) memory.

    q_lat = q_h W_ql[h]                      one batched GEMM over the heads (cuBLAS), [H, B, T, L]
    ctx_lat, lse = flash kernels             flash_kernels.py: online softmax, the band from the transposed
                                             tile, K_lat/V_lat shared by all heads
    ctx = ctx_lat,h W_vu[h]                  one batched GEMM, [B, T, H, D]

The backward recomputes the scores tile by tile from lse; nothing of size T×T is ever stored. The two per-head
maps run as cuBLAS GEMMs around the kernels rather than inside them: at GPT-2 shapes each is a [B·T, D]×[D, L]
product per head that cuBLAS runs near peak, while folding W_ql into the query tile would redo it once per key
block's band term, and the epilogue form of W_vu would still have to store ctx_lat for dW_vu.

The kernels are launched only from the operators chunkfuse::ramla_fwd and chunkfuse::ramla_bwd (ops/library.py),
which torch.compile(fullgraph=True) traces as opaque calls. The far-field choice (FAR, FAR_KERNEL, the device and
torch's deterministic mode) is made outside them, in `ramla`, and passed as a str; the backward's head groups and
register cap are planned inside ramla_bwd. lse is the forward's extra, non-differentiable output.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ops import backend_fn
from ops.library import absent, contiguous, kernel_op, maybe
from ops.ramla import far
from ops.ramla.bwd_passes import ramla_bwd_delta_kernel, ramla_bwd_reduce_kernel
from ops.ramla.flash_kernels import ramla_bwd_dkv_kernel, ramla_bwd_dq_kernel, ramla_fwd_kernel
from ops.triton_utils import cdiv, check_dtypes, check_triton_device, dot_precision, sm_count

COMPONENTS = ()                  # the whole op is one fused component; `--fuse` has nothing to choose here
LATENT_DIMS = (16, 32, 64, 128)  # tl.arange needs a power of two; 16 is tl.dot's minimum
# query rows × key rows per tile, and the launch, per kernel
TILES = {"fwd": dict(BM=64, BN=64, num_warps=4, num_stages=2),
         "dkv": dict(BM=64, BN=64, num_warps=4, num_stages=2),
         "dq": dict(BM=64, BN=64, num_warps=4, num_stages=2)}
# Registers per thread for the backward kernels on plain MLA (α = None): at 168 three 4-warp programs fit an SM
# instead of two, which pays on the H100 despite a small spill. With the band the kernels need 255 and run far
# slower capped, so they stay uncapped. None: no cap.
PLAIN_MAXNREG: int | None = 168
ROWS = 64                        # rows per program of the backward's δ and dk/dv-sum passes (memory-bound)
PROGRAMS_PER_SM = 4              # backward: enough programs to even out the causal tiles' unequal work
HEADS_PER_PROGRAM: int | None = None   # backward head-group size; None: heads_per_program's choice
# The split form: the keys past the band (j < i − W, plain causal attention) on SDPA's kernel, the band in the
# Triton kernels ('sdpa'); or every score in the Triton kernels ('triton'). 'auto' splits where SDPA has a kernel
# that returns the log-sum-exp (far.supports: fp16/bf16 on a GPU, any dtype on the CPU), T ≥ FAR_MIN_T and
# torch.use_deterministic_algorithms is off. On the H100 the split pays from T = 8192 and ties or loses below; its
# cuDNN backward is not bitwise repeatable (the all-Triton form is), so 'auto' splits only where it saves a sixth
# or more. Before Hopper 'auto' takes FlashAttention-2 for the far field (cuDNN's where SDPA's flash kernel is
# disabled).
FAR = "auto"
FAR_KERNEL = "auto"              # SDPA's kernel for the far field: 'auto', 'cudnn' or 'flash' (far.choose)
FAR_MIN_T = 8192


check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def _far(far_kernel: str | None, T: int, W: int) -> str | None:
    """The far field's kernel as launched: none where it would have fewer than two rows (cuDNN's frontend rejects
    a sequence of 1, "s_q = s_kv = 1"). The forward and the backward both decide it so, from the same shapes."""
    return far_kernel if T - W - 1 >= 2 else None


def _band(alpha: torch.Tensor | None, window: int, T: int) -> int:
    """The band's width W as the kernels take it: 0 without α; a band wider than T is the whole causal triangle
    (and so stays in int32)."""
    return min(window, T) if alpha is not None else 0


def _alpha(alpha: torch.Tensor | None, q: torch.Tensor, dummy: torch.Tensor) -> torch.Tensor:
    """α as the kernels read it (an fp32 scalar on q's device), or `dummy` as a pointer the kernels never read."""
    return alpha.detach().reshape(()).to(q.device, torch.float32) if alpha is not None else dummy


def _fwd_fake(q, k, v, alpha, window, scale, far_kernel):
    H, B, T, L = q.shape
    return q.new_empty(q.shape), q.new_empty((H, B, T), dtype=torch.float32)


@kernel_op("ramla_fwd", fake=_fwd_fake)
def ramla_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor | None, window: int,
              scale: float, far_kernel: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [H, B, T, L] (head-major q_lat); k, v: [B, T, L], q's dtype; alpha 0-d or [1] (any float dtype) or None
    (plain MLA, no band) → o [H, B, T, L] (q's dtype) and the backward's lse [H, B, T] fp32. far_kernel: None (every
    score in the Triton kernels) or one of far.KERNELS (the keys past the band on SDPA's kernel), chosen by the
    caller (far_kernel())."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    H, B, T, L = q.shape
    band = alpha is not None
    W = _band(alpha, window, T)
    far_kernel = _far(far_kernel, T, W)
    o = torch.empty_like(q)
    lse = torch.empty(H, B, T, device=q.device, dtype=torch.float32)
    a = _alpha(alpha, q, lse)
    o_far, lse_far = lse, lse                # dummies without the far field
    if far_kernel:   # SDPA's aux (dropout's RNG state) is not kept: without dropout the backward has stand-ins
        o_far, lse_far, _ = far.forward(far_kernel, *far_inputs(q, k, v, W), scale)
    fwd = TILES["fwd"]
    ramla_fwd_kernel[(H, cdiv(T, fwd["BM"]), B)](
        q, k, v, o, lse, a, scale, B, T, W, o_far, lse_far, *far_strides(o_far, far_kernel),
        *far_strides(lse_far, far_kernel), H=H, L=L, BAND=band, PREC=dot_precision(q), FAR=bool(far_kernel),
        **fwd)
    return o, lse


def _bwd_fake(do, q, k, v, o, lse, alpha, window, scale, far_kernel):
    da = alpha.new_empty(alpha.shape) if alpha is not None else absent(q)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), da


@kernel_op("ramla_bwd", fake=_bwd_fake)
def ramla_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, alpha: torch.Tensor | None, window: int, scale: float, far_kernel: str | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """do, o: [H, B, T, L] (contiguous); q, k, v, alpha, window, scale, far_kernel as ramla_fwd's; lse [H, B, T]
    its output → dq [H, B, T, L], dk, dv [B, T, L] (their inputs' dtypes) and dα (α's shape and dtype; 0 elements
    without the band). The head groups (heads_per_program) and the register cap are planned here."""
    q, k, v, do = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous()
    H, B, T, L = q.shape
    band = alpha is not None
    W = _band(alpha, window, T)
    far_kernel = _far(far_kernel, T, W)
    HP = heads_per_program(B, T, H, q.device)
    G = H // HP
    delta = torch.empty(H, B, T, device=q.device, dtype=torch.float32)
    ramla_bwd_delta_kernel[(cdiv(H * B * T, ROWS),)](o, do, delta, H * B * T, L=L, BR=ROWS)
    dq_far = dk_far = dv_far = delta                                                  # dummy pointers
    if far_kernel:   # first, so that the dq kernel adds dq_far (SDPA's, in bf16) to its fp32 sum before storing
        fq, fk, fv = far_inputs(q, k, v, W)
        dq_far, dk_far, dv_far = far.backward(far_kernel, far_rows(do, W), fq, fk, fv, far_rows(o, W),
                                              far_rows(lse, W), far.stand_in_aux(far_kernel, fq), scale)
    # fp32 partial sums of dk and dv, one slot per head group and kernel (the dq kernel adds the band's
    # row part of dk after the dk/dv kernel's slots); ramla_bwd_reduce_kernel sums them once
    KS = 2 * G if band else G
    f32 = dict(device=q.device, dtype=torch.float32)
    dk_part, dv_part = torch.empty(B, T, KS, L, **f32), torch.empty(B, T, G, L, **f32)
    dq_band = torch.empty(H, B, T, L, **f32) if band else dk_part
    cap = {"maxnreg": PLAIN_MAXNREG} if PLAIN_MAXNREG and not band else {}
    dkv, dqt = {**TILES["dkv"], **cap}, {**TILES["dq"], **cap}
    dalpha = torch.empty(B, cdiv(T, dkv["BN"]), G, **f32)
    a = _alpha(alpha, q, lse)
    meta = dict(H=H, HP=HP, KS=KS, L=L, BAND=band, PREC=dot_precision(q), FAR=bool(far_kernel))
    ramla_bwd_dkv_kernel[(G, B, cdiv(T, dkv["BN"]))](q, k, v, do, lse, delta, a, dk_part, dv_part,
                                                            dq_band, dalpha, scale, B, T, W, **meta, **dkv)
    dq = torch.empty_like(q)
    ramla_bwd_dq_kernel[(G, B, cdiv(T, dqt["BM"]))](q, k, v, do, lse, delta, a, dq_band, dq, dk_part,
                                                           scale, B, T, W, dq_far,
                                                           *far_strides(dq_far, far_kernel), **meta, **dqt)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    ramla_bwd_reduce_kernel[(cdiv(T, ROWS), B)](
        dk_part, dv_part, dk_far, dv_far, dk, dv, T, T - W - 1, *far_strides(dk_far, far_kernel),
        *far_strides(dv_far, far_kernel), KS=KS, VS=G, H=H, L=L, BT=ROWS, FAR=bool(far_kernel))
    da = dalpha.sum().reshape(alpha.shape).to(alpha) if band else absent(q)
    return dq, dk, dv, da


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    q, k, v, alpha, window, scale, far_kernel = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, alpha)
    ctx.mark_non_differentiable(lse)
    ctx.window, ctx.scale, ctx.far_kernel = window, scale, far_kernel


def _backward(ctx, do: torch.Tensor, dlse: torch.Tensor) -> tuple:
    """lse's gradient is none (non-differentiable). No second-order terms: a double backward raises (_no_double)."""
    q, k, v, o, lse, alpha = ctx.saved_tensors
    (do,) = contiguous(do)
    dq, dk, dv, da = ramla_bwd(do, q, k, v, o, lse, alpha, ctx.window, ctx.scale, ctx.far_kernel)
    return dq, dk, dv, maybe(da, alpha is not None), None, None, None


def _no_double(ctx, *grads: torch.Tensor) -> tuple:
    raise RuntimeError("ramla (fused): no double backward; second-order terms are not implemented (the kernels' "
                       "backward is once differentiable)")


ramla_fwd.register_autograd(_backward, setup_context=_setup_context)
ramla_bwd.register_autograd(_no_double, setup_context=lambda ctx, inputs, output: None)


def flash_ramla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor | None, window: int,
                scale: float, far_kernel: str | None) -> torch.Tensor:
    """The attention kernels alone, differentiable in q, k, v and α: q [H, B, T, L] (head-major q_lat), k, v
    [B, T, L] → o [H, B, T, L]. Arguments as ramla_fwd's."""
    return ramla_fwd(q, k, v, alpha, window, float(scale), far_kernel)[0]


def far_rows(x: torch.Tensor, W: int) -> torch.Tensor:
    """The far field's query rows of a head-major [H, B, T, …] tensor, as the view [B, H, T − W − 1, …]."""
    return x.transpose(0, 1)[:, :, W + 1:]


def far_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, W: int) -> tuple[torch.Tensor, ...]:
    """SDPA's q, k, v for the far field: the query rows W + 1 … and the keys … T − W − 2, each key shared by
    the H heads through a stride-0 view rather than a copy."""
    H, B, T, L = q.shape
    keys = (x[:, None, :T - W - 1].expand(B, H, T - W - 1, L) for x in (k, v))
    return (far_rows(q, W), *keys)


def far_strides(x: torch.Tensor, far_kernel: str | None) -> tuple[int, int, int]:
    """Batch, head and row strides of a far-field tensor [B, H, T', ...] for the kernels (0s for a dummy)."""
    if not far_kernel:
        return 0, 0, 0
    if x.dim() == 4 and x.stride(-1) != 1:
        raise RuntimeError(f"ramla: SDPA's far-field tensor has strides {x.stride()}; the kernels need the "
                           "last dim contiguous")
    return x.stride(0), x.stride(1), x.stride(2)


def heads_per_program(B: int, T: int, H: int, device: torch.device) -> int:
    """Heads per backward program (a divisor of H): the most that still launch PROGRAMS_PER_SM
    programs per SM, so the group's dk, dv partial sums stay few. HEADS_PER_PROGRAM overrides."""
    if HEADS_PER_PROGRAM is not None:
        if H % HEADS_PER_PROGRAM:
            raise ValueError(f"ramla: HEADS_PER_PROGRAM={HEADS_PER_PROGRAM} does not divide H={H}")
        return HEADS_PER_PROGRAM
    blocks = B * cdiv(T, TILES["dkv"]["BN"])
    fits = [hp for hp in range(1, H + 1) if H % hp == 0 and blocks * (H // hp) >= PROGRAMS_PER_SM * sm_count(device)]
    return max(fits, default=1)


def plan(device: torch.device, B: int, T: int, H: int, L: int, W: int, plain: bool, dtype: torch.dtype,
         **_) -> str:
    """What the op launches at these dims, decided as ramla and far_kernel decide it, for the run log."""
    far_k = far_kernel(torch.empty((0, 0, T, L), dtype=dtype, device=device))
    scores = f"keys past the band on SDPA's {far_k} kernel, the band in Triton" if far_k else "all scores in Triton"
    cap = f", registers capped at {PLAIN_MAXNREG}" if plain and PLAIN_MAXNREG else ""
    band = "plain MLA (no band)" if plain else f"reciprocal band W={W}"
    return (f"{band}; flash kernels with {TILES['fwd']['BM']}x{TILES['fwd']['BN']} tiles, {scores}; backward "
            f"{heads_per_program(B, T, H, device)} heads per program{cap}; W_ql and W_vu by cuBLAS")


@backend_fn(plan=plan)
def ramla(q: torch.Tensor, k_lat: torch.Tensor, v_lat: torch.Tensor, w_ql: torch.Tensor,
          w_vu: torch.Tensor, alpha: torch.Tensor | None, window: int,
          scale: float | None = None, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """RA+MLA attention. Shapes as ops.ramla.naive.ramla: q [B, T, H, D], k_lat, v_lat [B, T, L],
    w_ql [H, D, L], w_vu [H, L, D], alpha 0-d or None (plain MLA) → [B, T, H, D]. cu_seqlens is refused."""
    from ops import BackendError, varlen

    if cu_seqlens is not None:
        raise varlen.refuse("ramla", "fused")

    L = k_lat.shape[-1]
    if L not in LATENT_DIMS:
        raise BackendError(f"op 'ramla', backend 'fused': latent dim L={L} is not supported by the flash "
                           f"kernel (L must be one of {LATENT_DIMS}); choose --model.latent_dim among them "
                           "or use --backend naive")
    if window < 0:
        raise ValueError(f"ramla: the band W must be ≥ 0, got {window}")
    check_dtypes("ramla", "fused", q, k_lat, v_lat)
    scale = L ** -0.5 if scale is None else scale
    B, T, H, D = q.shape
    q_lat = latent_queries(q, w_ql)
    k_lat, v_lat = (x.to(q_lat.dtype).contiguous() for x in (k_lat, v_lat))
    ctx = flash_ramla(q_lat, k_lat, v_lat, alpha, window, scale, far_kernel(q_lat))
    out = torch.bmm(ctx.view(H, B * T, L), w_vu.to(ctx.dtype))                       # [H, B·T, D]
    return out.transpose(0, 1).view(B, T, H, D)


def far_kernel(q_lat: torch.Tensor) -> str | None:
    """The far field's SDPA kernel under FAR and FAR_KERNEL (None: all scores in the Triton kernels)."""
    from ops import BackendError

    if FAR not in ("auto", "sdpa", "triton"):
        raise ValueError(f"ramla: FAR must be 'auto', 'sdpa' or 'triton', got {FAR!r}")
    # under torch.use_deterministic_algorithms 'auto' keeps every score in Triton: the split's SDPA backward is
    # bitwise repeatable there only on FlashAttention-2, which is slower than all Triton on the H100
    declines = q_lat.shape[2] < FAR_MIN_T or torch.are_deterministic_algorithms_enabled() or not far.supports(q_lat)
    if FAR == "triton" or (FAR == "auto" and declines):
        return None
    if not far.supports(q_lat):
        raise BackendError(f"op 'ramla', backend 'fused': SDPA's far-field kernels take fp16 or bf16 on a GPU, "
                           f"got {q_lat.dtype}; train in bf16 or set ops.ramla.fused.FAR = 'triton'")
    return far.choose(q_lat, FAR_KERNEL)


def latent_queries(q: torch.Tensor, w_ql: torch.Tensor) -> torch.Tensor:
    """q [B, T, H, D], w_ql [H, D, L] → q_lat [H, B, T, L]: one batched GEMM over the heads, in the layout
    bmm writes (and its backward reads) without copies, which is the one the kernels take."""
    B, T, H, D = q.shape
    return torch.bmm(q.reshape(B * T, H, D).transpose(0, 1), w_ql.to(q.dtype)).view(H, B, T, -1)


def build(fuse: frozenset[str]) -> Callable:
    """The op has no components to switch (ops.get_op has checked the names)."""
    return ramla
