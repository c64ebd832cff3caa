"""The chunkwise decayed linear attention (GLA with per-key-dim decay, SSD with a scalar decay)
as separate Triton stages, fla-style: cumsum → states → intra-chunk A (to HBM) → output (a scalar
decay forms A inside the output kernel), and the hand-written backward through the same stages.

    o_t = Σ_{s ≤ t} (scale · q_t ⊙ exp(b_t − b_s)) · k_s  v_s  (+ the incoming state's share)

Precision: b = cumsum(g) is held in fp32, as in flash-linear-attention, so an exponent b_i − b_j
carries an absolute error of about ulp(|b|) ≈ |b| · 6e-8: invisible for realistic decays (|b| ≲ 100 within a
chunk), ~1e-4 relative where per-step log-decays of order −50 accumulate to |b| ~ 10³. The forward's output keeps
it (it is ruled by the undecayed diagonal pairs), but this module's operator gives the state pass its exponents
b_L − b summed by themselves (cumsum.chunk_cumsum_gap, state.py): a chunk of strong steps ending in weak ones leaves
a state made of its last rows, each ~1e-4 off when formed from b, and the next chunk's decay gradient reads it
(GLA's mixed decays in tests/ops/test_decay_grad.py reached 9.5e-6). The backward removes b's rounding everywhere,
since at strong decay the decay gradient is made of pairs one or two steps apart and nothing else: every exponent of
the kernels that form dq, dk and db adds the residual r of b's rounding (cumsum.py), (b_i − b_j) + (r_i − r_j),
which is exact where the pair carries weight (per-key kernels read r only in chunks whose decay exceeds
cumsum.RESIDUAL_FROM). The backward recomputes r from g (saved with the inputs) and b. With that and no undecayed
pair in db (output.py), the decay gradients hold 1e-5 relative at decays down to −50 per step
(tests/ops/test_decay_grad.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.chunkwise.state import chunk_bwd_dh, chunk_fwd_h, split_segments
from ops.chunkwise.intra import chunk_intra_bwd, chunk_intra_fwd
from ops.chunkwise.output import chunk_bwd_dA, chunk_bwd_dqkb, chunk_bwd_dv, chunk_fwd_o, chunk_fwd_o_scalar
from ops.chunkwise.cumsum import chunk_cumsum, chunk_cumsum_gap, chunk_residual
from ops.varlen import Documents
from ops.library import absent, contiguous, kernel_op, maybe
from ops.triton_utils import cdiv, next_power_of_2, tile

CHUNK_SIZES = (16, 32, 64, 128)


def _fwd_fake(q, k, v, g, scale, initial_state, output_final_state, chunk_size, split_state, reset, n_docs):
    B, T, H, V = v.shape
    K, NT = q.shape[-1], cdiv(T, chunk_size)
    ht = v.new_empty(n_docs or B, H, K, V, dtype=torch.float32) if output_final_state else absent(v)
    return (v.new_empty(B, T, H, V), ht, g.new_empty(B, T, H, g.shape[-1], dtype=torch.float32),
            k.new_empty(B, NT, H, K, V), q.new_empty(B, T, H, chunk_size))


@kernel_op("chunk_decay_fwd", fake=_fwd_fake)
def chunk_decay_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float,
                    initial_state: torch.Tensor | None, output_final_state: bool, chunk_size: int,
                    split_state: bool, reset: torch.Tensor | None, n_docs: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward stages. Returns o [B, T, H, V] (v's dtype), the final state [B, H, K, V] fp32 (0 elements unless
    asked), and for the backward b [B, T, H, K|1] fp32, h [B, NT, H, K, V] and A [B, T, H, C] (q's dtype).
    reset, n_docs: packed documents (ops/varlen.Documents; states [n_docs, H, K, V]), or None, 0."""
    H = v.shape[2]
    q, k, v, b, h, ht = states_forward(q, k, v, g, initial_state, output_final_state, chunk_size, split_state,
                                       documents(reset, n_docs), exact=True)
    if b.shape[-1] == 1:
        o, A = chunk_fwd_o_scalar(q, k, v, b, h, scale, chunk_size)
    else:
        A = chunk_intra_fwd(expand_heads(q, H), expand_heads(k, H), b, scale, chunk_size)
        o = chunk_fwd_o(q, v, b, h, A, scale, chunk_size)
    return o, absent(o) if ht is None else ht, b, h, A


def _bwd_fake(q, k, v, g, b, h, A, do, dht, scale, has_h0, chunk_size, split_state, g_dtype, reset, n_docs):
    return grads_fake(q, k, v, b, has_h0, g_dtype, n_docs)


@kernel_op("chunk_decay_bwd", fake=_bwd_fake)
def chunk_decay_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, b: torch.Tensor,
                    h: torch.Tensor, A: torch.Tensor, do: torch.Tensor, dht: torch.Tensor | None, scale: float,
                    has_h0: bool, chunk_size: int, split_state: bool, g_dtype: torch.dtype,
                    reset: torch.Tensor | None, n_docs: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward stages, from the forward's inputs q, k (grouped or not), v, g and outputs b, h, A. Returns dq,
    dk (q's and k's shapes), dv, dg (g_dtype) and dh0 [B, H, K, V] fp32 (0 elements without an initial state)."""
    G = q.shape[2]
    q, k, v = (x.contiguous() for x in (q, k, v))
    do, dh, dh0 = states_backward(q, k, v, b, do, dht, has_h0, scale, chunk_size, split_state,
                                  documents(reset, n_docs))
    dA = chunk_bwd_dA(do, v, chunk_size)
    dv = chunk_bwd_dv(k, b, A, do, dh, chunk_size)
    res = chunk_residual(g, b, chunk_size)
    # a scalar decay's intra-chunk parts are formed inside chunk_bwd_dqkb
    dq_intra, dk_intra = (None, None) if b.shape[-1] == 1 else chunk_intra_bwd(q, k, b, res, dA, scale, chunk_size)
    dq, dk, db = chunk_bwd_dqkb(q, k, v, b, res, h, dh, do, dA, dq_intra, dk_intra, scale, chunk_size)
    return (sum_groups(dq, G), sum_groups(dk, G), dv, decay_grad(db, chunk_size, g_dtype),
            absent(dv) if dh0 is None else dh0)


def _setup(ctx, inputs, output) -> None:
    q, k, v, g, scale, initial_state, output_final_state, chunk_size, split_state, reset, n_docs = inputs
    _, _, b, h, A = output
    # q and k shared by groups of heads (Mamba-2's B and C) are kept as given, not per head: at mamba2_370m
    # (32 heads, one group, N = 128) that is 268 MB less per layer at B8 T2048 bf16
    ctx.save_for_backward(q, k, v, g, b, h, A, reset)
    ctx.mark_non_differentiable(b, h, A)
    ctx.scale, ctx.chunk_size, ctx.split_state, ctx.n_docs = scale, chunk_size, split_state, n_docs
    ctx.has_h0, ctx.wants_ht, ctx.g_dtype = initial_state is not None, output_final_state, g.dtype


def _backward(ctx, do, dht, db, dh, dA):
    q, k, v, g, b, h, A, reset = ctx.saved_tensors
    do, dht = contiguous(do, dht if ctx.wants_ht else None)
    dq, dk, dv, dg, dh0 = chunk_decay_bwd(q, k, v, g, b, h, A, do, dht, ctx.scale, ctx.has_h0, ctx.chunk_size,
                                          ctx.split_state, ctx.g_dtype, reset, ctx.n_docs)
    return dq, dk, dv, dg, None, maybe(dh0, ctx.has_h0), None, None, None, None, None


chunk_decay_fwd.register_autograd(_backward, setup_context=_setup)


@triton.jit
def expand_heads_kernel(x, y, n, HG, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    """y[r, i, :] = x[r, :] for the rows r < n of x [n, D] and i < HG, y [n, HG, D] (both contiguous)."""
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)[:, None]
    cols = tl.arange(0, BD)[None, :]
    m = (rows < n) & (cols < D)
    v = tl.load(x + rows * D + cols, mask=m)
    for i in range(HG):
        tl.store(y + (rows * HG + i) * D + cols, v, mask=m)


def expand_heads(x: torch.Tensor, H: int) -> torch.Tensor:
    """[B, T, G, D] → [B, T, H, D] contiguous, head h reading group h // (H / G) (Mamba-2's convention); the
    tensor itself when G = H. A kernel rather than repeat_interleave, whose strided copy runs at a quarter of
    HBM bandwidth. Only the per-key decay's intra-chunk scores need it: every other kernel reads a group's q and k
    where its heads share them (their HG)."""
    B, T, G, D = x.shape
    if G == H:
        return x
    y = torch.empty(B, T, H, D, device=x.device, dtype=x.dtype)
    n, br = B * T * G, 16 if x.is_cuda else 4
    expand_heads_kernel[(cdiv(n, br),)](x.contiguous(), y, n, H // G, D=D, BR=br, BD=next_power_of_2(D))
    return y


def sum_groups(dx: torch.Tensor, G: int) -> torch.Tensor:
    """The gradient of expand_heads: [B, T, H, D] → [B, T, G, D], summed over each group's heads."""
    B, T, H, D = dx.shape
    return dx if G == H else dx.view(B, T, G, H // G, D).sum(3)


def states_forward(q, k, v, g, initial_state, output_final_state: bool, chunk_size: int, split_state: bool,
                   docs: Documents | None = None, exact: bool = False):
    """What every chunkwise forward (this module's operator, ops/gla/fused.py's) does first: contiguous
    inputs, b = chunk-local cumsum of g and the states entering each chunk (split or not; never split with
    packed documents, docs). exact: the state pass reads its exponents b_L − b summed by themselves
    (cumsum.chunk_cumsum_gap), not formed from b (module docstring).
    Returns q, k, v, b, h, final state."""
    q, k, v, g = (x.contiguous() for x in (q, k, v, g))
    h0 = initial_state.contiguous() if initial_state is not None else None
    b, gap = chunk_cumsum_gap(g, chunk_size) if exact else (chunk_cumsum(g, chunk_size), None)
    h, ht = chunk_fwd_h(k, v, b, h0, output_final_state, chunk_size,
                        state_segments(k, v, chunk_size, split_state and docs is None), docs=docs, gap=gap)
    return q, k, v, b, h, ht


def states_backward(q, k, v, b, do, dht, has_h0: bool, scale: float, chunk_size: int, split_state: bool,
                    docs: Documents | None = None):
    """The backward's first step: contiguous do and the state gradients, the dh pass split as the forward's state
    pass was (k, v contiguous, as states_forward returned them). Returns do, dh, dh0."""
    do = do.contiguous()
    dht = dht.contiguous() if dht is not None else None
    segments = state_segments(k, v, chunk_size, split_state and docs is None)
    dh, dh0 = chunk_bwd_dh(q, do, b, dht, has_h0, scale, chunk_size, segments, docs=docs)
    return do, dh, dh0


def decay_grad(db: torch.Tensor, chunk_size: int, g_dtype: torch.dtype) -> torch.Tensor:
    """dg, the reverse chunk-local cumsum of db (the gradient of b = cumsum(g)), in g's dtype."""
    return chunk_cumsum(db, chunk_size, reverse=True).to(g_dtype)


def grads_fake(q, k, v, b, has_h0: bool, g_dtype: torch.dtype, n_docs: int = 0) -> tuple[torch.Tensor, ...]:
    """The fake outputs of a chunkwise backward operator: dq, dk, dv as q, k, v, dg as b in g_dtype and dh0
    [B, H, K, V] fp32 ([n_docs, ...] with packed documents; 0 elements without an initial state)."""
    B, T, H, V = v.shape
    dh0 = v.new_empty(n_docs or B, H, q.shape[-1], V, dtype=torch.float32) if has_h0 else absent(v)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), b.new_empty(b.shape, dtype=g_dtype), dh0


def chunk_decay_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float,
                          initial_state: torch.Tensor | None, output_final_state: bool,
                          chunk_size: int = 64, split_state: bool = False, docs: Documents | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q, k: [B, T, H, K], or [B, T, G, K] shared by groups of H / G heads (head h reads group
    h // (H / G)); v: [B, T, H, V]; g: [B, T, H, K] or [B, T, H, 1] log-decays ≤ 0;
    initial_state: [B, H, K, V]. Returns o [B, T, H, V] (v's dtype) and the final state (fp32).
    split_state: the `fused` backend's `state` component (state.py's split scan).
    docs: packed documents in the chunk-aligned layout (ops/varlen.run_chunk_aligned; states [N, H, K, V]); their
    state pass is never split (the split's carry fix-up knows no document boundaries)."""
    check_inputs(q, k, v, chunk_size, CHUNK_SIZES)
    if q.shape[2] != k.shape[2] or v.shape[2] % q.shape[2]:
        raise ValueError(f"q and k need the same head count G dividing v's {v.shape[2]} heads; got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}")
    o, ht = chunk_decay_fwd(q, k, v, g, scale, initial_state, output_final_state, chunk_size, split_state,
                            *documents_args(docs))[:2]
    return o, maybe(ht, output_final_state)


def documents(reset: torch.Tensor | None, n_docs: int) -> Documents | None:
    """An operator's (reset, n_docs) arguments back as Documents, or None without packed documents."""
    return None if reset is None else Documents(reset, n_docs)


def documents_args(docs: Documents | None) -> tuple[torch.Tensor | None, int]:
    """Documents as an operator's (reset, n_docs) arguments: (None, 0) without packed documents."""
    return (None, 0) if docs is None else (docs.reset, docs.n)


def stages_plan(device: torch.device, B: int, T: int, H: int, K: int, V: int, chunk_size: int, split_state: bool,
                scores: str = "intra-chunk scores", **_) -> str:
    """The stages chunk_decay_attention launches at these dims, for the run log (`scores`: how the intra-chunk
    scores are formed)."""
    NT = cdiv(T, chunk_size)
    segments = split_segments(B, H, K, V, T, chunk_size, device) if split_state else 1
    state = (f"state pass in {segments} ranges of {cdiv(NT, segments)} chunks + carry fix-up" if segments > 1
             else f"state pass sequential over {NT} chunks")
    return (f"stages at C={chunk_size}: cumsum, {state}, {scores}, output; state tiles {tile(K)}x{tile(V)}; "
            "backward through the same stages")


def state_segments(k: torch.Tensor, v: torch.Tensor, chunk_size: int, split: bool) -> int:
    """How many segments the state scan runs in: 1 (sequential over chunks) unless split."""
    if not split:
        return 1
    B, T, H, V = v.shape
    return split_segments(B, H, k.shape[-1], V, T, chunk_size, k.device)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int,
                 chunk_sizes: tuple[int, ...]) -> None:
    """The argument checks every chunkwise entry point makes before launching anything."""
    if chunk_size not in chunk_sizes:
        raise ValueError(f"chunk_size must be one of {chunk_sizes}, got {chunk_size}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")

