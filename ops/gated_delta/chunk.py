"""Gated delta rule on the `chunk` backend: the WY / UT chunkwise form (ops/gated_delta/naive.py
derives it) as separate Triton stages, forward and a hand-written backward.

Forward, per chunk (b = chunk-local cumsum of g, held in fp32):
    Tm, w, u   = WY transform of the chunk (wy.py)
    h, v_new   = sequential state recurrence, v_new = u − w h_n (delta_state.py)
    o          = scale (q ⊙ exp(b)) h_n + A v_new, A the causal decayed scores: GLA's output stage
                 with a scalar decay and v := v_new, A formed in the output kernel (ops/chunkwise/output.py)
Backward, in reverse: the output stage's dA and intra dq, dk; the reverse recurrence for dh and
dv_new (which also carries the −wᵀ dv_new term of v_new = u − w h_n); GLA's dq, dk, db with
v := v_new; the WY backward (du = dv_new, dw = −dv_new h_nᵀ) into dk, dv, dβ, db; finally
dg = reverse chunk cumsum of db. Saved for backward: b, r, Tm, w, h, v_new and A (no recomputation).

Every exponent b_i − b_j, forward and backward, adds r_i − r_j, the residual of b's fp32 rounding
(ops/chunkwise/cumsum.py). GLA's and SSD's forward add it only in their state pass (ops/chunkwise/decay_attention.py:
their output is ruled by the undecayed diagonal pairs), but here Tm and the output's A are read back as well, by
v_new = u − w h_n and by the backward. At strong decay a chunk ending in weak steps has |b| ~ 10³ and exponents
near 0 off by ulp(|b|) in b alone, and the decay gradient of the chunk after it was then off by up to 1e-5
relative (tests/ops/test_decay_grad.py's mixed head).

The two passes are the operators chunkfuse::gated_delta_chunk_fwd and chunkfuse::gated_delta_chunk_bwd
(ops/library.py), so torch.compile traces through them: the forward returns the saved intermediates as extra,
non-differentiable outputs, and register_autograd joins the two.
"""
from __future__ import annotations

import torch

from ops import backend_fn, varlen
from ops.library import absent, contiguous, kernel_op, maybe
from ops.chunkwise.cumsum import chunk_cumsum, chunk_residual
from ops.chunkwise.decay_attention import check_inputs, documents, documents_args
from ops.chunkwise.output import chunk_bwd_dA, chunk_bwd_dqkb, chunk_fwd_o_scalar
from ops.gated_delta.delta_state import MAX_K, delta_h_bwd, delta_h_fwd, state_tiles
from ops.gated_delta.wy import wy_bwd, wy_fwd
from ops.triton_utils import cdiv, check_dtypes, check_triton_device

# 128 is not among them: the stages' [C, C] tiles at C = 128 need more shared memory than Hopper's 227 KB.
CHUNK_SIZES = (16, 32, 64)

check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def plan(device: torch.device, B: int, T: int, H: int, K: int, V: int, chunk_size: int, **_) -> str:
    """The stages at these dims, for the run log."""
    if K > MAX_K:
        return f"cannot run: K = {K} > {MAX_K} (the state kernels hold all of K in one program)"
    BK, BV = state_tiles(K, V, None)
    return (f"stages at C={chunk_size}: cumsum, WY transform, delta-rule state pass sequential over "
            f"{cdiv(T, chunk_size)} chunks (state tile {BK}x{BV}, {cdiv(V, BV) * B * H} programs), "
            "output; backward through the same stages")


def _fwd_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
              initial_state: torch.Tensor | None, output_final_state: bool, chunk_size: int,
              state_dtype: torch.dtype, reset: torch.Tensor | None, n_docs: int) -> tuple[torch.Tensor, ...]:
    """chunk_fwd's outputs as empty tensors, from shape arithmetic alone (tracing launches nothing)."""
    B, T, H, K = q.shape
    V, C, NT = v.shape[-1], chunk_size, cdiv(T, chunk_size)
    ht = q.new_empty(n_docs or B, H, K, V, dtype=torch.float32) if output_final_state else absent(q)
    b = q.new_empty(B, T, H, 1, dtype=torch.float32)
    return (v.new_empty(B, T, H, V), ht, b, torch.empty_like(b), k.new_empty(B, T, H, C),
            k.new_empty(B, T, H, K), k.new_empty(B, NT, H, K, V, dtype=state_dtype), v.new_empty(B, T, H, V),
            q.new_empty(B, T, H, C))


@kernel_op("gated_delta_chunk_fwd", _fwd_fake)
def chunk_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
              initial_state: torch.Tensor | None, output_final_state: bool, chunk_size: int, state_dtype: torch.dtype,
              reset: torch.Tensor | None, n_docs: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                         torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k [B, T, H, K]; v [B, T, H, V]; g, beta [B, T, H]; initial_state [B, H, K, V] fp32 or None.
    Returns o [B, T, H, V] (v's dtype), the final state [B, H, K, V] fp32 (0 elements unless asked), and what the
    backward reads: b [B, T, H, 1] fp32 and its residual r [B, T, H, 1] fp32, Tm [B, T, H, C] and w [B, T, H, K]
    (k's dtype), h [B, NT, H, K, V] (state_dtype), v_new [B, T, H, V] (v's dtype), A [B, T, H, C] (q's dtype).
    All are made by the forward anyway, so returning them costs no work. reset, n_docs: packed documents
    (ops/varlen.Documents; states [n_docs, H, K, V]), or None, 0."""
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    h0 = initial_state.contiguous() if initial_state is not None else None
    b = chunk_cumsum(g.unsqueeze(-1), chunk_size)                             # [B, T, H, 1] fp32
    res = chunk_residual(g.unsqueeze(-1), b, chunk_size)
    Ai, w, u = wy_fwd(k, v, b, res, beta, chunk_size)
    h, v_new, ht = delta_h_fwd(k, w, u, b, res, h0, output_final_state, chunk_size, state_dtype=state_dtype,
                               docs=documents(reset, n_docs))
    o, A = chunk_fwd_o_scalar(q, k, v_new, b, h, scale, chunk_size, res)
    return o, (ht if output_final_state else absent(q)), b, res, Ai, w, h, v_new, A


def _bwd_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, b: torch.Tensor,
              res: torch.Tensor, Ai: torch.Tensor, w: torch.Tensor, h: torch.Tensor, v_new: torch.Tensor,
              A: torch.Tensor, do: torch.Tensor, dht: torch.Tensor | None, scale: float, chunk_size: int,
              need_dh0: bool, g_dtype: torch.dtype, reset: torch.Tensor | None, n_docs: int
              ) -> tuple[torch.Tensor, ...]:
    """chunk_bwd's outputs as empty tensors, from shape arithmetic alone."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    dh0 = q.new_empty(n_docs or B, H, K, V, dtype=torch.float32) if need_dh0 else absent(q)
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), q.new_empty(B, T, H, dtype=g_dtype),
            beta.new_empty(beta.shape), dh0)


@kernel_op("gated_delta_chunk_bwd", _bwd_fake)
def chunk_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, b: torch.Tensor,
              res: torch.Tensor, Ai: torch.Tensor, w: torch.Tensor, h: torch.Tensor, v_new: torch.Tensor,
              A: torch.Tensor, do: torch.Tensor, dht: torch.Tensor | None, scale: float, chunk_size: int,
              need_dh0: bool, g_dtype: torch.dtype, reset: torch.Tensor | None, n_docs: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The saved tensors as chunk_fwd returns them (with the inputs q, k, v, beta); do [B, T, H, V] contiguous;
    dht [B, H, K, V] or None. Returns dq, dk, dv (input dtypes), dg [B, T, H] in g_dtype, dβ [B, T, H] in beta's
    dtype, dh0 [B, H, K, V] fp32 (0 elements unless need_dh0). dh is stored in h's dtype (the state_dtype)."""
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    C = chunk_size
    dA = chunk_bwd_dA(do, v_new, C)
    dh, dv_new, dh0 = delta_h_bwd(q, k, w, b, res, A, do, dht, need_dh0, scale, C, state_dtype=h.dtype,
                                  docs=documents(reset, n_docs))
    dq, dk_o, db_o = chunk_bwd_dqkb(q, k, v_new, b, res, h, dh, do, dA, None, None, scale, C)
    dk, dv, dbeta, db_wy = wy_bwd(k, v, b, res, beta, Ai, h, dv_new, dk_o, C)
    dg = chunk_cumsum(db_o + db_wy.unsqueeze(-1), C, reverse=True).squeeze(-1)
    return dq, dk, dv, dg.to(g_dtype), dbeta.to(beta.dtype), (dh0 if need_dh0 else absent(q))


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    """Saves the inputs the backward reads and the intermediates, which carry no gradient of their own."""
    q, k, v, g, beta, scale, _, output_final_state, chunk_size, _, reset, n_docs = inputs
    _, ht, b, res, Ai, w, h, v_new, A = output
    ctx.mark_non_differentiable(b, res, Ai, w, h, v_new, A)
    ctx.save_for_backward(q, k, v, beta, b, res, Ai, w, h, v_new, A, reset)
    ctx.n_docs = n_docs
    ctx.scale, ctx.chunk_size, ctx.g_dtype, ctx.has_ht = scale, chunk_size, g.dtype, output_final_state


def _backward(ctx, do: torch.Tensor, dht: torch.Tensor | None, *_) -> tuple:
    # the grads of an absent ht (0 elements) and of the saved intermediates arrive as zeros: ignored
    do, dht = contiguous(do, dht if ctx.has_ht else None)
    need_dh0 = ctx.needs_input_grad[6]
    *saved, reset = ctx.saved_tensors
    dq, dk, dv, dg, dbeta, dh0 = chunk_bwd(*saved, do, dht, ctx.scale, ctx.chunk_size, need_dh0, ctx.g_dtype,
                                           reset, ctx.n_docs)
    return dq, dk, dv, dg, dbeta, None, maybe(dh0, need_dh0), None, None, None, None, None


chunk_fwd.register_autograd(_backward, setup_context=_setup_context)


def chunk_gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      scale: float, initial_state: torch.Tensor | None, output_final_state: bool,
                      chunk_size: int = 64, state_dtype: torch.dtype | None = None,
                      docs: varlen.Documents | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gated_delta with an explicit scale, chunk size (CHUNK_SIZES) and dtype of the per-chunk states h and dh
    kept between the stages (None: the inputs', as fla keeps them). fp32 storage changes little: the stages still
    round h and dh to bf16 for their dots, so o, dq and dv are unchanged; it doubles the saved h, so the op keeps
    the inputs' dtype. docs: packed documents in the chunk-aligned layout (ops/varlen.run_chunk_aligned)."""
    check_inputs(q, k, v, chunk_size, CHUNK_SIZES)
    o, ht, *_ = chunk_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size,
                          state_dtype or k.dtype, *documents_args(docs))
    return o, maybe(ht, output_final_state)


@backend_fn(chunk_sizes=CHUNK_SIZES, plan=plan)
def gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                scale: float | None = None, initial_state: torch.Tensor | None = None,
                output_final_state: bool = False, chunk_size: int = 64,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as ops.gated_delta.naive.gated_delta: q, k [B, T, H, K] (k L2-normalised); v [B, T, H, V];
    g (log-decay ≤ 0), beta [B, T, H]; states [B, H, K, V] fp32. Returns o in v's dtype and the
    final state if asked. cu_seqlens: packed documents in ops/varlen.py's chunk-aligned layout (B = 1, states
    [N, H, K, V]; padding k = v = 0, β = 0, g = 0 leaves every state unchanged; at most N·(C − 1) padded tokens)."""
    check_dtypes("gated_delta", "chunk", q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if cu_seqlens is not None:
        return varlen.run_chunk_aligned(
            "gated_delta", cu_seqlens, chunk_size, initial_state, (q, k, v, g, beta),
            lambda q, k, v, g, beta, docs: chunk_gated_delta(q, k, v, g, beta, scale, initial_state,
                                                             output_final_state, chunk_size, docs=docs))
    return chunk_gated_delta(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)
