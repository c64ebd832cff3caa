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
dg = reverse chunk cumsum of db. Saved for backward: Tm, w, h, v_new and A (no recomputation).
"""
from __future__ import annotations

import torch
import triton

from ops import backend_fn
from ops.chunkwise.cumsum import chunk_cumsum
from ops.chunkwise.decay_attention import check_inputs
from ops.chunkwise.intra import chunk_intra_bwd
from ops.chunkwise.output import chunk_bwd_dA, chunk_bwd_dqkb, chunk_fwd_o_scalar
from ops.gated_delta.delta_state import MAX_K, delta_h_bwd, delta_h_fwd, state_tiles
from ops.gated_delta.wy import wy_bwd, wy_fwd
from ops.triton_utils import check_dtypes, check_triton_device

# 128 is not among them: the stages' [C, C] tiles at C = 128 need more shared memory than Hopper's 227 KB.
CHUNK_SIZES = (16, 32, 64)

check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def plan(device: torch.device, B: int, T: int, H: int, K: int, V: int, chunk_size: int, **_) -> str:
    """The stages at these dims, for the run log."""
    if K > MAX_K:
        return f"cannot run: K = {K} > {MAX_K} (the state kernels hold all of K in one program)"
    BK, BV = state_tiles(K, V, None)
    return (f"stages at C={chunk_size}: cumsum, WY transform, delta-rule state pass sequential over "
            f"{triton.cdiv(T, chunk_size)} chunks (state tile {BK}x{BV}, {triton.cdiv(V, BV) * B * H} programs), "
            "output; backward through the same stages")


class ChunkGatedDelta(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, state_dtype):
        q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
        h0 = initial_state.contiguous() if initial_state is not None else None
        b = chunk_cumsum(g.unsqueeze(-1), chunk_size)                             # [B, T, H, 1] fp32
        Ai, w, u = wy_fwd(k, v, b, beta, chunk_size)
        h, v_new, ht = delta_h_fwd(k, w, u, b, h0, output_final_state, chunk_size, state_dtype=state_dtype)
        o, A = chunk_fwd_o_scalar(q, k, v_new, b, h, scale, chunk_size)
        ctx.save_for_backward(q, k, v, b, beta, Ai, w, h, v_new, A)
        ctx.scale, ctx.chunk_size, ctx.has_h0 = scale, chunk_size, h0 is not None
        ctx.g_dtype, ctx.beta_dtype, ctx.state_dtype = g.dtype, beta.dtype, state_dtype
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, b, beta, Ai, w, h, v_new, A = ctx.saved_tensors
        C, scale = ctx.chunk_size, ctx.scale
        do = do.contiguous()
        dht = dht.contiguous() if dht is not None else None
        dA = chunk_bwd_dA(do, v_new, C)
        dq_intra, dk_intra = chunk_intra_bwd(q, k, b, dA, scale, C)
        dh, dv_new, dh0 = delta_h_bwd(q, k, w, b, A, do, dht, ctx.has_h0, scale, C, state_dtype=ctx.state_dtype)
        dq, dk_o, db_o = chunk_bwd_dqkb(q, k, v_new, b, h, dh, do, dq_intra, dk_intra, scale, C)
        dk, dv, dbeta, db_wy = wy_bwd(k, v, b, beta, Ai, h, dv_new, dk_o, C)
        dg = chunk_cumsum(db_o + db_wy.unsqueeze(-1), C, reverse=True).squeeze(-1)
        return dq, dk, dv, dg.to(ctx.g_dtype), dbeta.to(ctx.beta_dtype), None, dh0, None, None, None


def chunk_gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      scale: float, initial_state: torch.Tensor | None, output_final_state: bool,
                      chunk_size: int = 64, state_dtype: torch.dtype | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gated_delta with an explicit scale, chunk size (CHUNK_SIZES) and dtype of the per-chunk states h and dh
    kept between the stages (None: the inputs', as fla keeps them). fp32 storage changes little: the stages still
    round h and dh to bf16 for their dots, so o, dq and dv are unchanged; it doubles the saved h, so the op keeps
    the inputs' dtype."""
    check_inputs(q, k, v, chunk_size, CHUNK_SIZES)
    return ChunkGatedDelta.apply(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, state_dtype)


@backend_fn(chunk_sizes=CHUNK_SIZES, plan=plan)
def gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                scale: float | None = None, initial_state: torch.Tensor | None = None,
                output_final_state: bool = False, chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as ops.gated_delta.naive.gated_delta: q, k [B, T, H, K] (k L2-normalised); v [B, T, H, V];
    g (log-decay ≤ 0), beta [B, T, H]; states [B, H, K, V] fp32. Returns o in v's dtype and the
    final state if asked."""
    check_dtypes("gated_delta", "chunk", q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return chunk_gated_delta(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)
