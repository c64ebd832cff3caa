"""Softmax attention on the `fused` backend: a hand-written CUDA tensor-core (WMMA) flash-attention
forward for the plain GPT-2's small-shape regime (the kernel: ops/attention/csrc/).

Built at first use with torch's C++-extension loader (cached under $CHUNKFUSE_EXT_DIR, default
~/.cache/chunkfuse/ext, so later processes load it without compiling); head dim 64, causal or not.
The kernel takes fp16: bf16 or fp32 inputs are cast to fp16 and the output back. It has no backward:
it serves evaluation and generation, and a forward that would need gradients raises an error naming
the op rather than training on another kernel.

Key split: a block owns a 64-row query tile; when B·H·⌈T/64⌉ blocks leave SMs idle, its warps form 2 or
4 groups that each take every 2nd/4th key tile and are merged at the end (`plan_split`, logged by
`kernel_info`). The kernel relies on the fp32 accumulator fragment layout of sm_80/sm_90, and on the fp16
matrix_a layout holding the same elements in the same lanes (P passes from one to the other in registers);
the first build checks both (`probe_layout()`, `probe_a_layout()`) and refuses to run if this GPU and
compiler lay them out differently.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
import math
import os
import shutil
from pathlib import Path

import torch

from ops import BackendError, backend_fn, varlen

COMPONENTS = ()                # one kernel; `--fuse` has nothing to choose here
HEAD_DIMS = (64,)
SPLITS = (1, 2, 4)             # key groups per block: 4, 8 or 16 warps
TILE_BYTES = 64 * (64 + 8) * 2  # csrc's Tile: 64 rows of fp16 at the padded pitch PAD_H = 72
_SOURCE = Path(__file__).parent / "csrc" / "wmma_attention.cu"


def check_available(op: str, backend: str) -> None:
    if not torch.cuda.is_available():
        raise BackendError(f"op {op!r}, backend {backend!r}: the WMMA kernel needs a CUDA GPU; on this machine "
                           "use --backend naive (SDPA)")
    if torch.cuda.get_device_capability() < (8, 0):
        raise BackendError(f"op {op!r}, backend {backend!r}: the WMMA kernel uses cp.async, which needs compute "
                           "capability 8.0 (A100) or newer; use --backend naive (SDPA)")
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        raise BackendError(f"op {op!r}, backend {backend!r}: the WMMA kernel is compiled at first use and needs "
                           "nvcc (the CUDA toolkit) on PATH or CUDA_HOME set; or use --backend naive (SDPA)")


@functools.cache
def extension():
    """The compiled extension (forward, kernel_info). kernel_info() reports registers, spills and shared
    memory; CHUNKFUSE_EXT_VERBOSE=1 prints the build, nvcc's -Xptxas -v report included."""
    from torch.utils.cpp_extension import load

    build = Path(os.environ.get("CHUNKFUSE_EXT_DIR", Path.home() / ".cache" / "chunkfuse" / "ext")) / "wmma_attention"
    build.mkdir(parents=True, exist_ok=True)
    try:
        ext = load(name="chunkfuse_wmma_attention", sources=[str(_SOURCE)], build_directory=str(build),
                   extra_cuda_cflags=["-O3", "-Xptxas=-v", "--use_fast_math"],
                   verbose=os.environ.get("CHUNKFUSE_EXT_VERBOSE") == "1")
    except (RuntimeError, OSError) as e:
        raise BackendError(f"op 'attention', backend 'fused': building the WMMA kernel failed ({e}); see the build "
                           f"log in {build}, or use --backend naive (SDPA)") from e
    got = ext.probe_layout()
    if not torch.equal(got, assumed_layout()):
        raise BackendError("op 'attention', backend 'fused': this GPU/compiler lays out WMMA's fp32 accumulator "
                           "fragments differently from the sm_80/sm_90 layout the kernel's softmax assumes "
                           f"(probe: {got.tolist()[:2]}…); use --backend naive (SDPA)")
    got = ext.probe_a_layout()
    if not a_layout_matches(got):
        raise BackendError("op 'attention', backend 'fused': this GPU/compiler lays out WMMA's fp16 matrix_a "
                           "fragments differently from the accumulator's, which the kernel's register-resident P "
                           f"assumes (probe: {got.tolist()[:2]}…); use --backend naive (SDPA)")
    return ext


def assumed_layout() -> torch.Tensor:
    """[32, 8] flat index row·16 + col of each lane's accumulator element, as the kernel assumes it
    (two mma.m16n8k16 C tiles side by side: g = lane // 4, t = lane % 4)."""
    lane, i = torch.arange(32)[:, None], torch.arange(8)[None, :]
    row = lane // 4 + 8 * ((i // 2) % 2)
    col = 2 * (lane % 4) + i % 2 + 8 * (i // 4)
    return (row * 16 + col).to(torch.int32)


def a_layout_matches(got: torch.Tensor) -> bool:
    """Whether a [32, 16] probe of fp16 matrix_a fragments (flat row·16 + col per lane and slot, -1 past the
    fragment's elements) has, in slot e, the accumulator's element e mod 8: the kernel converts P from S's
    fragments slot by slot. Slots 8-15 are either absent or repeat 0-7 (Volta's duplicated layout)."""
    c = assumed_layout()
    high = got[:, 8:]
    return torch.equal(got[:, :8], c) and (bool((high == -1).all()) or torch.equal(high, c))


def smem_bytes(split: int) -> int:
    """Shared memory per block of the kernel with `split` key groups, sizeof(Smem<split>) in csrc: the query
    tile and each group's double-buffered K and V tiles (the larger member of its union); on the H100 kernel_info
    reports the same (tests/ops/test_attention.py)."""
    return (1 + 4 * split) * TILE_BYTES


def max_smem_bytes(device: torch.device | None = None) -> int:
    """A GPU's opt-in shared memory per block (None: the current one's): 227 KB on the H100, 163 KB on the A100,
    99 KB on sm86."""
    return _max_smem_bytes(torch.cuda.current_device() if device is None or device.index is None else device.index)


@functools.cache    # a driver query: once per device, not on every call of a microsecond-scale op
def _max_smem_bytes(device: int) -> int:
    import triton

    return triton.runtime.driver.active.utils.get_device_properties(device)["max_shared_mem"]


def plan_split(B: int, H: int, T: int, causal: bool, sms: int | None = None, smem_limit: int | None = None) -> int:
    """Key groups per block. Splitting pays only when the B·H·⌈T/64⌉ blocks leave SMs idle; each group
    keeps at least two key tiles (the longest row of a causal launch has ⌈T/64⌉), and the block's shared memory
    must fit the GPU's (split 4 needs 153 KB: not on sm86/sm89). sms, smem_limit: None for the current GPU's."""
    sms = sms or torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    smem_limit = smem_limit or max_smem_bytes()
    tiles = -(-T // 64)
    blocks = B * H * tiles
    split = 1
    for s in SPLITS:
        if blocks <= sms and tiles >= 2 * s and smem_bytes(s) <= smem_limit:
            split = s
    return split


def kernel_info(causal: bool = True, split: int = 1) -> dict:
    """Registers per thread, spilled bytes, shared memory per block and resident blocks per SM."""
    regs, local, static_smem, dyn_smem, blocks, threads = extension().kernel_info(causal, split)
    return {"split": split, "registers": regs, "spill_bytes": local, "smem_bytes": static_smem + dyn_smem,
            "blocks_per_sm": blocks, "warps_per_sm": blocks * threads // 32}


def plan(device: torch.device, B: int, T: int, H: int, **_) -> str:
    """The key split the kernel launches with at these dims (causal), for the run log."""
    return f"WMMA flash-attention forward, 64-row query tiles, {plan_split(B, H, T, True)} key group(s) per block"


@backend_fn(plan=plan, trains=False)
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
              scale: float | None = None, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """q, k, v: [B, T, H, 64] → o [B, T, H, 64] in q's dtype (computed in fp16 with fp32 accumulation).
    cu_seqlens (packed documents) is refused: the WMMA kernel masks only causally."""
    if cu_seqlens is not None:
        raise varlen.refuse("attention", "fused")
    return wmma_attention(q, k, v, causal, scale)


def wmma_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                   scale: float | None = None, split: int | None = None) -> torch.Tensor:
    """The op with the key split made explicit (None: plan_split's choice); tests and the benchmark
    pin it to check and time each variant."""
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
    B, T, H, _ = q.shape
    limit = max_smem_bytes(q.device)          # q's GPU, which the extension launches on
    if split is None:
        split = plan_split(B, H, T, causal, torch.cuda.get_device_properties(q.device).multi_processor_count, limit)
    elif split not in SPLITS:
        raise BackendError(f"op 'attention', backend 'fused': key split {split} is not built (splits: {SPLITS})")
    elif smem_bytes(split) > limit:
        raise BackendError(f"op 'attention', backend 'fused': key split {split} needs {smem_bytes(split):,} B of "
                           f"shared memory per block, more than this GPU's {limit:,} B; leave split to plan_split "
                           "(None)")
    o = torch.empty_like(qh)
    extension().forward(qh, kh, vh, o, causal, scale, split)
    return o.to(q.dtype)


def build(fuse: frozenset[str]) -> Callable:
    """The op has no components to switch (ops.get_op has checked the names)."""
    return attention
