"""GLA on the `fused` backend. Components (`--fuse`):
- `chunk`: the whole forward in one launch (scan.py: each program walks its chunks with the state in registers,
  so the cumsum, states, scores and output never meet in HBM), and the backward per chunk after the dh pass
  (scan_bwd.py; one launch when K fits one tile). Both factorise a chunk's scores into one dot while its decay
  allows and take an exact path where it does not. Where the data-movement model (movement.py) says the scan does
  not pay, the forward is the chunkwise stages with the scores in one program per chunk (fused_intra.py).
- `state`: the state passes split into chunk ranges where the (K, V, batch·head) tiles cannot fill the SMs
  (ops/chunkwise/state.py). With `chunk` too, a split forward runs the parallel stages instead of the scan.
`state` alone runs inside the chunkwise stages; with neither, the op is the `chunk` backend's.

With `chunk`, the mixer is two operators (ops/library.py), chunkfuse::gla_fused_fwd and gla_fused_bwd, so that
torch.compile traces through it; every tile and path decision is made inside their bodies.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ops import backend_fn, varlen
from ops.chunkwise.decay_attention import (CHUNK_SIZES as STAGE_CHUNK_SIZES, check_inputs, chunk_decay_attention,
                                           decay_grad, documents, documents_args, grads_fake, stages_plan,
                                           state_segments, states_backward, states_forward)
from ops.chunkwise.output import chunk_fwd_o
from ops.chunkwise.state import chunk_fwd_h_from, split_segments
from ops.gla import chunk
from ops.gla.fused_intra import fused_intra_fwd
from ops.gla.movement import bwd_key_tile, device_model, kernel_tiles, scan_pays
from ops.gla.scan import MAX_RANGE, fused_scan_fwd
from ops.gla.scan_bwd import fused_scan_bwd
from ops.library import absent, contiguous, kernel_op, maybe
from ops.triton_utils import cdiv, check_dtypes, check_triton_device

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


def _fwd_fake(q, k, v, g, scale, initial_state, output_final_state, chunk_size, split_state, save, max_range, reset,
              n_docs):
    B, T, H, V = v.shape
    K, NT = q.shape[-1], cdiv(T, chunk_size)
    ht = v.new_empty(n_docs or B, H, K, V, dtype=torch.float32) if output_final_state else absent(v)
    if not save:
        return v.new_empty(B, T, H, V), ht, absent(v), absent(v)
    return (v.new_empty(B, T, H, V), ht, g.new_empty(B, T, H, g.shape[-1], dtype=torch.float32),
            v.new_empty(B, NT, H, K, V))


@kernel_op("gla_fused_fwd", fake=_fwd_fake)
def gla_fused_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float,
                  initial_state: torch.Tensor | None, output_final_state: bool, chunk_size: int, split_state: bool,
                  save: bool, max_range: float, reset: torch.Tensor | None, n_docs: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward: scan.py's one launch, or the parallel stages with fused_intra's scores (scan_forward decides,
    here, from the shapes and the device). q, k, g: [B, T, H, K]; v: [B, T, H, V]. Returns o [B, T, H, V] (v's
    dtype), the final state [B, H, K, V] fp32 (0 elements unless asked), and with `save` the backward's b
    [B, T, H, K] fp32 (cumsum of g local to each sub-block) and h [B, cdiv(T, chunk_size), H, K, V] (v's dtype;
    the state entering every chunk_size-th row), else 0 elements each. reset, n_docs: packed documents
    (ops/varlen.Documents, in the layout of sub-blocks; states [n_docs, H, K, V]; the state pass unsplit), or
    None, 0."""
    C = sub_block(chunk_size)
    docs = documents(reset, n_docs)
    split_state = split_state and docs is None
    segments = state_segments(k, v, C, split_state)
    B, T, H, K = q.shape
    if scan_forward(B, T, H, K, v.shape[-1], C, v.element_size(), q.device, segments):
        o, ht, b, h = fused_scan_fwd(q, k, v, g, scale, initial_state, output_final_state, C, save,
                                     max_range=max_range, interval=chunk_size, docs=docs)
    else:
        # b alone here, unlike the chunk operator: reading the exact gaps b_L − b costs this state pass a tenth of
        # its time (H200, K = 256: 187 → 208 µs) and the cumsum a second store, and realistic decays never need them
        q, k, v, b, h, ht = states_forward(q, k, v, g, initial_state, output_final_state, C, split_state, docs)
        o = chunk_fwd_o(q, v, b, h, fused_intra_fwd(q, k, b, scale, C, max_range), scale, C)
        h = h[:, :: chunk_size // C].contiguous() if save and chunk_size > C else h
    ht = absent(v) if ht is None else ht
    return (o, ht, b, h) if save else (o, ht, absent(v), absent(v))


def _bwd_fake(q, k, v, g, b, h, do, dht, scale, has_h0, chunk_size, split_state, max_range, g_dtype, reset, n_docs,
              initial_state):
    return grads_fake(q, k, v, b, has_h0, g_dtype, n_docs)


@kernel_op("gla_fused_bwd", fake=_bwd_fake)
def gla_fused_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, b: torch.Tensor,
                  h: torch.Tensor, do: torch.Tensor, dht: torch.Tensor | None, scale: float, has_h0: bool,
                  chunk_size: int, split_state: bool, max_range: float, g_dtype: torch.dtype,
                  reset: torch.Tensor | None, n_docs: int, initial_state: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward from the forward's inputs q, k, v, g and outputs b, h: the dh pass (split as the forward's
    state pass was), the states of the sub-blocks between the kept ones when chunk_size > SUB_BLOCK, then
    scan_bwd.py per sub-block. Returns dq, dk, dv (their inputs' shapes and dtypes), dg [B, T, H, K] (g_dtype)
    and dh0 [B, H, K, V] fp32 (0 elements without an initial state). reset, n_docs: packed documents as the
    forward's; initial_state [n_docs, H, K, V] is then given where chunk_size > SUB_BLOCK (a document starting
    inside a kept interval restarts there from it), else None."""
    C = sub_block(chunk_size)
    docs = documents(reset, n_docs)
    q, k, v = (x.contiguous() for x in (q, k, v))
    if chunk_size > C:
        h = chunk_fwd_h_from(k, v, b, h, C, chunk_size, docs=docs, h0=initial_state)
    # the forward's scan ran only where the state pass is not split, so the dh pass splits as on the stage path
    do, dh, dh0 = states_backward(q, k, v, b, do, dht, has_h0, scale, C, split_state, docs)
    dq, dk, dv, db = fused_scan_bwd(q, k, v, b, g, h, do, dh, scale, C, max_range)
    return dq, dk, dv, decay_grad(db, C, g_dtype), absent(dv) if dh0 is None else dh0


def _setup(ctx, inputs, output) -> None:
    q, k, v, g, scale, initial_state, output_final_state, chunk_size, split_state, save, max_range, reset, n_docs = \
        inputs
    _, _, b, h = output
    # the recompute of the states between kept ones restarts documents from their initial states
    h0 = initial_state if reset is not None and chunk_size > sub_block(chunk_size) else None
    ctx.save_for_backward(q, k, v, g, b, h, reset, h0)   # q, k, v, g as given (views of a projection, say)
    ctx.n_docs = n_docs
    ctx.mark_non_differentiable(b, h)
    ctx.scale, ctx.chunk_size, ctx.split_state, ctx.max_range = scale, chunk_size, split_state, max_range
    ctx.save = save
    ctx.has_h0, ctx.wants_ht, ctx.g_dtype = initial_state is not None, output_final_state, g.dtype


def _backward(ctx, do, dht, db, dh):
    if not ctx.save:
        raise RuntimeError("gla_fused_fwd ran with save=False: it kept nothing for a backward")
    q, k, v, g, b, h, reset, h0 = ctx.saved_tensors
    do, dht = contiguous(do, dht if ctx.wants_ht else None)
    dq, dk, dv, dg, dh0 = gla_fused_bwd(q, k, v, g, b, h, do, dht, ctx.scale, ctx.has_h0, ctx.chunk_size,
                                        ctx.split_state, ctx.max_range, ctx.g_dtype, reset, ctx.n_docs, h0)
    return dq, dk, dv, dg, None, maybe(dh0, ctx.has_h0), None, None, None, None, None, None, None


gla_fused_fwd.register_autograd(_backward, setup_context=_setup)


def fused_chunk_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, scale: float,
                    initial_state: torch.Tensor | None, output_final_state: bool, chunk_size: int = 64,
                    split_state: bool = True, max_range: float = MAX_RANGE, docs: varlen.Documents | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as ops.gla.naive.gla. A scalar decay [B, T, H, 1] is broadcast over K: the fused kernels
    take a per-key decay, and autograd sums the broadcast's gradient back. max_range: the decay up to
    which a chunk's scores are factorised (scan.py); < 0 takes the exact path everywhere (tests).
    chunk_size: one of CHUNK_SIZES; past SUB_BLOCK rows, the interval at which states are kept for the
    backward, the kernels working on SUB_BLOCK-row sub-blocks. docs: packed documents in the layout of
    sub-blocks (ops/varlen.run_chunk_aligned with sub_block(chunk_size); states [N, H, K, V])."""
    check_inputs(q, k, v, chunk_size, CHUNK_SIZES)
    if gk.shape[-1] == 1 and q.shape[-1] != 1:
        gk = gk.expand(*gk.shape[:-1], q.shape[-1])
    # what the backward needs is stored only when there will be one
    save = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (q, k, v, gk, initial_state))
    o, ht = gla_fused_fwd(q, k, v, gk, scale, initial_state, output_final_state, chunk_size, split_state, save,
                          float(max_range), *documents_args(docs))[:2]
    return o, maybe(ht, output_final_state)


def plan(fuse_chunk: bool, split_state: bool, device: torch.device, B: int, T: int, H: int, K: int, V: int,
         chunk_size: int, dtype: torch.dtype, **_) -> str:
    """What the op with these components launches at these dims, decided as gla_fused_fwd decides it."""
    if not fuse_chunk:
        return stages_plan(device, B, T, H, K, V, chunk_size, split_state)
    C = sub_block(chunk_size)
    segments = split_segments(B, H, K, V, T, C, device) if split_state else 1
    elem = torch.empty((), dtype=dtype).element_size()
    if scan_forward(B, T, H, K, V, C, elem, device, segments):
        t = kernel_tiles(B, T, H, K, V, C, elem, device_model(device))
        fwd = f"forward: one-launch scan over {cdiv(T, C)} chunks of {C} (V tile {t.BV}, {t.num_warps} warps)"
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
            output_final_state: bool = False, chunk_size: int = 64,
            cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Shapes as ops.gla.naive.gla. cu_seqlens: packed documents in ops/varlen.py's chunk-aligned layout (B = 1,
        states [N, H, K, V]; documents padded to whole sub-blocks, at most N·(min(C, SUB_BLOCK) − 1) tokens; the
        state pass unsplit)."""
        check_dtypes("gla", "fused", q, k, v)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        if cu_seqlens is not None:
            run = functools.partial(fused_chunk_gla, split_state=False) if fuse_chunk else chunk_decay_attention
            return varlen.run_chunk_aligned(
                "gla", cu_seqlens, sub_block(chunk_size) if fuse_chunk else chunk_size, initial_state, (q, k, v, gk),
                lambda q, k, v, gk, docs: run(q, k, v, gk, scale, initial_state, output_final_state, chunk_size,
                                              docs=docs))
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
