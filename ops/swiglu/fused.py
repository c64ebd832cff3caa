"""The SwiGLU MLP's elementwise middle on the `fused` backend (component `proj`): one Triton kernel forward, one
backward (kernels.py), all math in fp32.

    h = silu(g) ⊙ u                                   gu = [g | u] [..., 2F] → h [..., F]
    dgu = [dh ⊙ u ⊙ σ(g)(1 + g(1 − σ(g))) | dh ⊙ silu(g)]                  → dgu [..., 2F]

The op saves only gu (the gate_up GEMM's output, which it reads in place, any row stride) and recomputes σ(g) in
the backward, where PyTorch's chain also keeps silu(g); the backward writes dgate and dup straight into the one
[M, 2F] gradient the gate_up GEMM's backward reads (no concatenation). Each value is rounded once, to gu's dtype,
where the PyTorch chain under bf16 rounds silu(g) and dh ⊙ u first: the results agree to bf16 rounding, not bit
for bit. Elementwise ops take their input's dtype under autocast, so the op computes in gu's.

The kernels are launched only from the operators chunkfuse::swiglu_fwd and chunkfuse::swiglu_bwd (ops/library.py),
which torch.compile(fullgraph=True) traces as opaque calls; their fake implementations give the real outputs'
shapes, dtypes and contiguous strides.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ops import BackendError, backend_fn
from ops.library import contiguous, kernel_op
from ops.swiglu.kernels import swiglu_bwd_kernel, swiglu_fwd_kernel
from ops.triton_utils import cdiv, check_dtypes, check_triton_device, next_power_of_2

COMPONENTS = ("proj",)
# CUDA: [BR, BF] tiles of CUDA_TILE elements on CUDA_WARPS warps, 16 per thread per operand (two 16-byte bf16
# vectors); the backward keeps three such fp32 operands live (g, u, dh). BF is a power of two from 64 to CUDA_BF,
# the one that pads F least (the widest among equals): F = 2816 (gla_340m, gdn_340m) takes BF = 256 with no padded
# column, BR = 16. Bound by HBM: [M, 2F] + [M, F] bytes forward, [M, 2F] + [M, F] read and [M, 2F] written backward.
# On an H200 at M = 16384, F = 2816 in bf16 (triton.testing.do_bench): forward 70 µs (3.9 TB/s), backward 113 µs
# (4.1 TB/s). 2K-element tiles on 4 warps ran the same; 4 warps at 4K, and 8K tiles, slowed the forward to 77-80 µs
# (the backward unchanged); 16K tiles ran 99 and 136 µs.
CUDA_TILE, CUDA_BF, CUDA_WARPS = 4096, 256, 8
# Under TRITON_INTERPRET=1 (CPU tests): 64-element tiles of at most 16 columns, so that test sizes give several
# programs along both rows and columns and ragged edges in each.
INTERPRET_TILE, INTERPRET_BF = 64, 16

check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def _tiles(F: int, cuda: bool) -> tuple[int, int]:
    """(BR, BF): the tile's rows and columns at width F."""
    tile, widest = (CUDA_TILE, CUDA_BF) if cuda else (INTERPRET_TILE, INTERPRET_BF)
    choices = [bf for bf in (widest >> i for i in range(8)) if bf >= min(64, widest)]
    bf = min(next_power_of_2(F), min(choices, key=lambda b: (cdiv(F, b) * b, -b)))
    return tile // bf, bf


def plan(device: torch.device, M: int, F: int, **_) -> str:
    """What the op launches for M rows at width F, for the run log."""
    br, bf = _tiles(F, device.type == "cuda")
    return (f"forward: one elementwise kernel ({cdiv(M, br) * cdiv(F, bf)} programs of {br}×{bf}); backward: one "
            "elementwise kernel on the same tiles, writing dgate and dup into one [M, 2F] gradient")


def _launch(kernel, gu: torch.Tensor, *args: torch.Tensor) -> None:
    M, F = gu.shape[0], gu.shape[1] // 2
    if M == 0 or F == 0:
        return
    br, bf = _tiles(F, gu.is_cuda)
    warps = dict(num_warps=CUDA_WARPS) if gu.is_cuda else {}
    kernel[(cdiv(M, br) * cdiv(F, bf),)](gu, *args, M, F, gu.stride(0), BR=br, BF=bf, **warps)


def _fwd_fake(gu: torch.Tensor) -> torch.Tensor:
    return gu.new_empty((gu.shape[0], gu.shape[1] // 2))


@kernel_op("swiglu_fwd", _fwd_fake)
def swiglu_fwd(gu: torch.Tensor) -> torch.Tensor:
    """gu [M, 2F] (unit column stride, any row stride) → h = silu(gu[:, :F]) ⊙ gu[:, F:], [M, F] contiguous in
    gu's dtype."""
    h = gu.new_empty((gu.shape[0], gu.shape[1] // 2))
    _launch(swiglu_fwd_kernel, gu, h)
    return h


def _bwd_fake(dh: torch.Tensor, gu: torch.Tensor) -> torch.Tensor:
    return gu.new_empty(gu.shape)


@kernel_op("swiglu_bwd", _bwd_fake)
def swiglu_bwd(dh: torch.Tensor, gu: torch.Tensor) -> torch.Tensor:
    """dh [M, F] contiguous; gu as swiglu_fwd's (as saved: the forward's view) → dgu = [dgate | dup], [M, 2F]
    contiguous in gu's dtype."""
    dgu = gu.new_empty((gu.shape[0], gu.shape[1]))
    _launch(swiglu_bwd_kernel, gu, dh, dgu)
    return dgu


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    (gu,) = inputs
    ctx.save_for_backward(gu)                   # as given: the gate_up GEMM's output (or a view of it), no copy


def _backward(ctx, dh: torch.Tensor) -> tuple:
    """No second-order terms: swiglu_bwd has no gradient of its own, so a double backward raises."""
    (gu,) = ctx.saved_tensors
    (dh,) = contiguous(dh)
    return (swiglu_bwd(dh, gu),)


swiglu_fwd.register_autograd(_backward, setup_context=_setup_context)


@backend_fn(plan=plan)
def swiglu(gu: torch.Tensor) -> torch.Tensor:
    """Shapes as ops.swiglu.naive.swiglu: gu [..., 2F] (gate first, then up) → silu(gate) ⊙ up, [..., F] in gu's
    dtype. gu is read in place where its last dim has unit stride (a column slice of a wider tensor too)."""
    check_dtypes("swiglu", "fused", gu)
    two_f = gu.shape[-1] if gu.dim() else 1
    if gu.dim() == 0 or two_f % 2:
        raise BackendError(f"op 'swiglu', backend 'fused': gu's last dim must be even, [..., 2F] = [gate | up] (the "
                           f"gate_up GEMM's output); got shape {tuple(gu.shape)}. Pass both halves, or use "
                           "--backend naive")
    lead = gu.shape[:-1]
    gu2 = gu.reshape(lead.numel(), two_f)       # a view when the leading dims merge (a column slice's too)
    if gu2.stride(1) != 1:
        gu2 = gu2.contiguous()
    return swiglu_fwd(gu2).view(*lead, two_f // 2)


def build(fuse: frozenset[str]) -> Callable:
    """`proj` is this op's one component (ops.get_op has checked the names)."""
    return swiglu
