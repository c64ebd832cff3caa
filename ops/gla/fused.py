"""GLA on the `fused` backend. Components (`--fuse`):
- `chunk`: the whole forward in one launch (scan.py: each program walks its chunks with the state in registers,
  so the cumsum, states, scores and output never meet in HBM), and the backward per chunk after the dh pass
  (scan_bwd.py; one launch when K fits one tile). Both factorise a chunk's scores into one dot while its decay
  allows and take an exact path where it does not. Where the data-movement model (movement.py) says the scan does
  not pay, the forward is the chunkwise stages with the scores in one program per chunk (fused_intra.py).
- `state`: the state passes split into chunk ranges where the (K, V, batch·head) tiles cannot fill the SMs
  (ops/chunkwise/state.py). With `chunk` too, a split forward runs the parallel stages instead of the scan.
`state` alone runs inside the chunkwise stages; with neither, the op is the `chunk` backend's.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton

from ops import backend_fn
from ops.chunkwise.decay_attention import (CHUNK_SIZES as STAGE_CHUNK_SIZES, check_inputs, chunk_decay_attention,
                                           input_grads, stages_plan, state_segments, states_backward, states_forward)
from ops.chunkwise.output import chunk_fwd_o
from ops.chunkwise.state import chunk_fwd_h_from, split_segments
from ops.gla import chunk
from ops.gla.fused_intra import fused_intra_fwd
from ops.gla.movement import bwd_key_tile, device_model, kernel_tiles, scan_pays
from ops.gla.scan import MAX_RANGE, fused_scan_fwd
from ops.gla.scan_bwd import fused_scan_bwd
from ops.triton_utils import check_dtypes, check_triton_device

COMPONENTS = ("chunk", "state")
CHUNK_SIZES = (16, 32, 64, 128, 256)
# The kernels hold a chunk's [C, C] scores in registers, and past 64 rows they run slower than at 64 (at 256 the
# fp32 scores alone exceed an SM's register file). A longer chunk is therefore a state interval of SUB_BLOCK-row
# sub-blocks: every kernel works on the sub-blocks (b is local to each), and only the state entering each interval
# is kept for the backward, which recomputes the sub-blocks' states from it (chunk_fwd_h_from).
SUB_BLOCK = 64

check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def sub_block(chunk_size: int) -> int:
    """The rows each kernel works on for a given chunk size: the chunk itself up to SUB_BLOCK rows."""
    return min(chunk_size, SUB_BLOCK)


def scan_forward(B: int, T: int, H: int, K: int, V: int, C: int, elem: int, device: torch.device,
                 segments: int) -> bool:
    """Whether the forward is scan.py's one launch, or the parallel stages (cumsum, states, scores by fused_intra,
    output), which leave the same b and h for the same backward. The scan runs B·H·V/BV programs, each sequential
    over its chunks; the data-movement model keeps it where its floor beats the stages', which it does not when
    those programs leave SMs idle (one long sequence; the state split is then on too, segments > 1) or at K = 256,
    where the state and the [C, K] operands force narrow V tiles."""
    return segments == 1 and scan_pays(B, T, H, K, V, C, elem, device_model(device))


class FusedScanGLA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, scale, initial_state, output_final_state, chunk_size, split_state, save,
                max_range):
        C = sub_block(chunk_size)                           # ctx.chunk_size: the backward works on these too
        segments = state_segments(k, v, C, split_state)
        B, T, H, K = q.shape
        if scan_forward(B, T, H, K, v.shape[-1], C, v.element_size(), q.device, segments):
            q, k, v = (x.contiguous() for x in (q, k, v))     # once: fused_scan_fwd's own call is then free
            o, ht, b, h = fused_scan_fwd(q, k, v, g, scale, initial_state, output_final_state, C, save,
                                         max_range=max_range, interval=chunk_size)
            ctx.segments, ctx.scale, ctx.chunk_size = 1, scale, C
            ctx.has_h0, ctx.g_dtype = initial_state is not None, g.dtype
        else:
            q, k, v, b, h, ht = states_forward(ctx, q, k, v, g, scale, initial_state, output_final_state, C,
                                               split_state)
            o = chunk_fwd_o(q, v, b, h, fused_intra_fwd(q, k, b, scale, C, max_range), scale, C)
            h = h[:, :: chunk_size // C].contiguous() if save and chunk_size > C else h
        ctx.max_range, ctx.interval = max_range, chunk_size
        if save:
            ctx.save_for_backward(q, k, v, b, h)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, b, h = ctx.saved_tensors
        if ctx.interval > ctx.chunk_size:
            h = chunk_fwd_h_from(k, v, b, h, ctx.chunk_size, ctx.interval)
        do, dh, dh0 = states_backward(ctx, q, b, do, dht)
        dq, dk, dv, db = fused_scan_bwd(q, k, v, b, h, do, dh, ctx.scale, ctx.chunk_size, ctx.max_range)
        return input_grads(ctx, dq, dk, dv, db, dh0) + (None, None)


def fused_chunk_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, scale: float,
                    initial_state: torch.Tensor | None, output_final_state: bool, chunk_size: int = 64,
                    split_state: bool = True, max_range: float = MAX_RANGE) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as ops.gla.naive.gla. A scalar decay [B, T, H, 1] is broadcast over K: the fused kernels
    take a per-key decay, and autograd sums the broadcast's gradient back. max_range: the decay up to
    which a chunk's scores are factorised (scan.py); < 0 takes the exact path everywhere (tests).
    chunk_size: one of CHUNK_SIZES; past SUB_BLOCK rows, the interval at which states are kept for the
    backward, the kernels working on SUB_BLOCK-row sub-blocks."""
    check_inputs(q, k, v, chunk_size, CHUNK_SIZES)
    if gk.shape[-1] == 1 and q.shape[-1] != 1:
        gk = gk.expand(*gk.shape[:-1], q.shape[-1])
    # what the backward needs is stored only when there will be one
    save = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (q, k, v, gk, initial_state))
    return FusedScanGLA.apply(q, k, v, gk, scale, initial_state, output_final_state, chunk_size, split_state, save,
                              max_range)


def plan(fuse_chunk: bool, split_state: bool, device: torch.device, B: int, T: int, H: int, K: int, V: int,
         chunk_size: int, dtype: torch.dtype, **_) -> str:
    """What the op with these components launches at these dims, decided as FusedScanGLA decides it."""
    if not fuse_chunk:
        return stages_plan(device, B, T, H, K, V, chunk_size, split_state)
    C = sub_block(chunk_size)
    segments = split_segments(B, H, K, V, T, C, device) if split_state else 1
    elem = torch.empty((), dtype=dtype).element_size()
    if scan_forward(B, T, H, K, V, C, elem, device, segments):
        t = kernel_tiles(B, T, H, K, V, C, elem, device_model(device))
        fwd = f"forward: one-launch scan over {triton.cdiv(T, C)} chunks of {C} (V tile {t.BV}, {t.num_warps} warps)"
    else:
        fwd = "forward: " + stages_plan(device, B, T, H, K, V, C, split_state,
                                        scores="intra-chunk scores fused per chunk").split(";")[0]
    BK = bwd_key_tile(K)
    bwd = f"backward: dh pass, then fused per chunk (key tile {BK}{', dv in the same launch' if BK >= K else ''})"
    long = f"; chunk {chunk_size} as {chunk_size // C} sub-blocks of {C}, states kept every {chunk_size} rows" \
        if chunk_size > C else ""
    return f"{fwd}; {bwd}{long}"


@functools.cache
def _op(fuse_chunk: bool, split_state: bool) -> Callable:
    """The op with the chosen components, one function object per choice (the registry's tests
    compare them by identity)."""
    @backend_fn(chunk_sizes=CHUNK_SIZES if fuse_chunk else STAGE_CHUNK_SIZES,
                plan=functools.partial(plan, fuse_chunk, split_state))
    def gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor,
            scale: float | None = None, initial_state: torch.Tensor | None = None,
            output_final_state: bool = False, chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Shapes as ops.gla.naive.gla."""
        check_dtypes("gla", "fused", q, k, v)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        if fuse_chunk:
            return fused_chunk_gla(q, k, v, gk, scale, initial_state, output_final_state, chunk_size, split_state)
        return chunk_decay_attention(q, k, v, gk, scale, initial_state, output_final_state, chunk_size, split_state)
    return gla


gla = _op(True, True)
gla.__doc__ = "Every fused component this op has (chunk, state). Shapes as ops.gla.naive.gla."


def build(fuse: frozenset[str]) -> Callable:
    """The op with only the components in `fuse` fused (ops.get_op has checked they exist here).
    With neither it is the `chunk` backend's computation, the ablation baseline, and the run log
    says so (ops.fused_label)."""
    if not fuse & set(COMPONENTS):
        return chunk.gla
    return _op("chunk" in fuse, "state" in fuse)
