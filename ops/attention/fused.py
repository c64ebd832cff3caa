"""Softmax attention on the `fused` backend: a hand-written CUDA tensor-core (WMMA) flash-attention
forward for the plain GPT-2's small-shape regime (issue [J]; the kernel: ops/attention/csrc/).

Built at first use with torch's C++-extension loader (cached under $CHUNKFUSE_EXT_DIR, default
~/.cache/chunkfuse/ext, so later processes load it without compiling); head dim 64, causal or not.
The kernel takes fp16: bf16 or fp32 inputs are cast to fp16 and the output back. It has no backward:
it serves evaluation and generation, and a forward that would need gradients raises an error naming
the op rather than training on another kernel.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
import math
import os
import shutil
from pathlib import Path

import torch

from ops import BackendError

COMPONENTS = ()                # one kernel; `--fuse` has nothing to choose here
HEAD_DIMS = (64,)
_SOURCE = Path(__file__).parent / "csrc" / "wmma_attention.cu"


def check_available() -> None:
    if not torch.cuda.is_available():
        raise BackendError("op 'attention', backend 'fused': the WMMA kernel needs a CUDA GPU; on this machine "
                           "use --backend naive (SDPA)")
    if torch.cuda.get_device_capability() < (8, 0):
        raise BackendError("op 'attention', backend 'fused': the WMMA kernel uses cp.async, which needs compute "
                           "capability 8.0 (A100) or newer; use --backend naive (SDPA)")
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        raise BackendError("op 'attention', backend 'fused': the WMMA kernel is compiled at first use and needs "
                           "nvcc (the CUDA toolkit) on PATH or CUDA_HOME set; or use --backend naive (SDPA)")


@functools.cache
def extension():
    """The compiled extension (forward, kernel_info). kernel_info() reports registers, spills and shared
    memory; CHUNKFUSE_EXT_VERBOSE=1 prints the build, nvcc's -Xptxas -v report included."""
    from torch.utils.cpp_extension import load

    build = Path(os.environ.get("CHUNKFUSE_EXT_DIR", Path.home() / ".cache" / "chunkfuse" / "ext")) / "wmma_attention"
    build.mkdir(parents=True, exist_ok=True)
    try:
        return load(name="chunkfuse_wmma_attention", sources=[str(_SOURCE)], build_directory=str(build),
                    extra_cuda_cflags=["-O3", "-Xptxas=-v", "--use_fast_math"],
                    verbose=os.environ.get("CHUNKFUSE_EXT_VERBOSE") == "1")
    except (RuntimeError, OSError) as e:
        raise BackendError(f"op 'attention', backend 'fused': building the WMMA kernel failed ({e}); see the build "
                           f"log in {build}, or use --backend naive (SDPA)") from e


def kernel_info(causal: bool = True) -> dict:
    """Registers per thread, spilled bytes, shared memory per block and resident blocks per SM."""
    regs, local, static_smem, dyn_smem, blocks = extension().kernel_info(causal)
    return {"registers": regs, "spill_bytes": local, "smem_bytes": static_smem + dyn_smem, "blocks_per_sm": blocks,
            "warps_per_sm": blocks * 4}


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
              scale: float | None = None) -> torch.Tensor:
    """q, k, v: [B, T, H, 64] → o [B, T, H, 64] in q's dtype (computed in fp16 with fp32 accumulation)."""
    if q.shape[-1] not in HEAD_DIMS:
        raise BackendError(f"op 'attention', backend 'fused': head dim {q.shape[-1]} is not supported by the WMMA "
                           f"kernel (head dims: {HEAD_DIMS}); use --backend naive (SDPA)")
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise BackendError("op 'attention', backend 'fused': the WMMA kernel is forward-only (evaluation and "
                           "generation); train with --backend naive (SDPA), or run under torch.no_grad()")
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    # fp16, contiguous, and 16-byte aligned (a view at an odd storage offset is copied)
    qh, kh, vh = (x.half().contiguous() for x in (q, k, v))
    qh, kh, vh = (x if x.data_ptr() % 16 == 0 else x.clone() for x in (qh, kh, vh))
    o = torch.empty_like(qh)
    extension().forward(qh, kh, vh, o, causal, scale)
    return o.to(q.dtype)


def build(fuse: frozenset[str]) -> Callable:
    """The op has no components to switch (ops.get_op has checked the names)."""
    return attention
