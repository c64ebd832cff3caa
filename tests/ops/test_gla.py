"""GLA: the chunkwise oracle (the `naive` backend) against the step recurrence, forward and every
gradient, at awkward shapes and extreme decays; gradcheck on tiny shapes."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from ops import get_op
from ops.gla.naive import chunkwise_gla, gla, gla_recurrent
from ops.gla.naive import make_inputs as gla_inputs
from tests.helpers import backends_under_test, grads_close, left_to_the_gpu, rel_err

# (B, T, H, K, V): T not a multiple of C, T < C, T = 1, B = H = 1, K ≠ V, K = 1
SHAPES = [(2, 100, 3, 8, 5), (1, 7, 1, 4, 6), (1, 1, 2, 3, 3), (2, 130, 2, 16, 8), (1, 64, 1, 1, 4)]
# log-decay regimes of the builder (ops.gla.naive.DECAYS): realistic [−5, 0), near 0 (no decay), very negative
# (state wiped each step), and mixed (half the channels barely decay, half are wiped out)
DECAYS = ("realistic", "near0", "extreme", "mixed")


def make_inputs(B, T, H, K, V, decay, scalar=False, dtype=torch.float64, seed=None):
    """q, k, v, gk, h0 from the op's builder, fresh unless seeded."""
    return tuple(gla_inputs(dict(B=B, T=T, H=H, K=K, V=V), dtype, seed=seed, requires_grad=False, decay=decay,
                            scalar=scalar, initial_state=True).values())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
@pytest.mark.parametrize("decay", list(DECAYS))
@pytest.mark.parametrize("scalar", [False, True], ids=["gk", "scalar"])
def test_chunk_matches_recurrence_fwd_bwd(shape, decay, scalar):
    inputs = make_inputs(*shape, decay, scalar)
    a = [x.clone().requires_grad_() for x in inputs]
    b = [x.clone().requires_grad_() for x in inputs]
    o1, s1 = gla_recurrent(*a[:4], initial_state=a[4], output_final_state=True)
    o2, s2 = gla(*b[:4], initial_state=b[4], output_final_state=True)
    assert rel_err(o2, o1) < 1e-10 and rel_err(s2, s1) < 1e-10
    do, ds = torch.randn_like(o1), torch.randn_like(s1)
    ((o1 * do).sum() + (s1 * ds).sum()).backward()
    ((o2 * do).sum() + (s2 * ds).sum()).backward()
    grads_close([x.grad for x in b], [y.grad for y in a], "q k v gk h0".split(), 1e-9)


@pytest.mark.parametrize("chunk_size", [16, 32, 64, 128])
def test_chunk_sizes(chunk_size):
    q, k, v, gk, h0 = make_inputs(2, 150, 2, 8, 12, "realistic")
    o1, s1 = gla_recurrent(q, k, v, gk, initial_state=h0, output_final_state=True)
    o2, s2 = chunkwise_gla(q, k, v, gk, None, h0, True, chunk_size=chunk_size)
    assert rel_err(o2, o1) < 1e-10 and rel_err(s2, s1) < 1e-10


def test_fp32_against_fp64_reference():
    """fp32 inputs stay within fp32 rounding of the fp64 recurrence, also at extreme decays."""
    for decay in ("realistic", "extreme", "mixed"):
        inputs = [x.float() for x in make_inputs(2, 200, 2, 32, 16, decay)]
        # the reference sees the same fp32-rounded inputs: only the arithmetic differs
        ref, _ = gla_recurrent(*(x.double() for x in inputs[:4]), initial_state=inputs[4].double())
        out, _ = gla(*inputs[:4], initial_state=inputs[4])
        assert out.dtype == torch.float32 and torch.isfinite(out).all()
        assert rel_err(out, ref) < 1e-5, decay


def test_scale_and_no_state_defaults():
    q, k, v, gk, _ = make_inputs(1, 20, 2, 4, 4, "realistic")
    o1, s1 = gla(q, k, v, gk)
    o2, _ = gla(q, k, v, gk, scale=4 ** -0.5)
    assert s1 is None and rel_err(o1, o2) == 0
    o3, _ = gla(q * 2, k, v, gk, scale=0.5 * 4 ** -0.5)
    assert rel_err(o3, o1) < 1e-14


def test_autocast_keeps_the_oracle_in_fp32():
    q, k, v, gk, _ = make_inputs(1, 70, 2, 8, 8, "realistic", dtype=torch.float32)
    ref, _ = gla(q, k, v, gk)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = gla(q, k, v, gk)
    assert rel_err(out, ref) < 1e-6


def test_gradcheck_tiny():
    q, k, v, gk, h0 = (x.requires_grad_() for x in make_inputs(1, 6, 1, 3, 2, "realistic"))
    f = lambda *xs: chunkwise_gla(*xs[:4], None, xs[4], True, chunk_size=4, sub_chunk=2)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v, gk, h0))


# --- Triton backends --------------------------------------------------------------------------

TRITON_BACKENDS = backends_under_test("gla")       # chunk, fused and any backend added later
# B = 2 runs through the same kernels in the stage, fused-scan and model tests
CHUNK_SHAPES = [(1, 50, 2, 8, 6), (1, 5, 1, 4, 4), (1, 1, 1, 4, 3), (1, 130, 1, 16, 8)]


def fp32_bound(decay: str, gk: torch.Tensor, chunk_size: int = 64) -> float:
    """fp32 Triton vs the fp64 oracle: the 1e-5 bound, plus, for the `mixed` decays or chunks
    longer than 128, 4 ulp of the largest within-chunk |b| = |cumsum(gk)|: the kernels hold b in
    fp32 (ops/chunkwise/cumsum.py), and steps of −50 accumulate to |b| ~ 1600 inside one chunk, where
    ulp(b) = 1.2e-4 (steps down to −5 over C = 256: |b| ~ 600)."""
    if decay != "mixed" and chunk_size <= 128:
        return 1e-5
    from ops.chunkwise.cumsum import chunk_cumsum_ref

    return 1e-5 + 4 * 2.0 ** -23 * chunk_cumsum_ref(gk.double().cpu(), chunk_size).abs().max().item()


def recurrence_cases() -> list:
    """With a per-key decay: every backend × decay profile × shape on a GPU; under the interpreter (no GPU) each
    backend runs half the profiles on each shape, the halves swapped from shape to shape and between backends
    (left_to_the_gpu), so that every backend meets every profile on two shapes, one short (T = 1, 5) and one long
    (T = 50, 130; strong decays at C = 64 are also test_decay_grad's). With a scalar decay, one profile per shape.
    What a scalar decay adds here is GLA's way into kernels tested elsewhere at every decay: `chunk` runs the
    scalar-decay stages SSD runs (tests/ops/test_ssd.py, test_decay_grad.py), `fused` expands it to the per-key
    kernels above."""
    cases = []
    for scalar in (False, True):
        for i, decay in enumerate(DECAYS):
            for j, shape in enumerate(CHUNK_SHAPES):
                for b, backend in enumerate(TRITON_BACKENDS):
                    if scalar and i != j % len(DECAYS):
                        continue
                    if not scalar and left_to_the_gpu(i, j, b):
                        continue
                    cases.append(pytest.param(backend, shape, decay, scalar, id="{}-{}-B{}T{}H{}K{}V{}-{}".format(
                        "scalar" if scalar else "gk", decay, *shape, backend)))
    return cases


@pytest.mark.parametrize("backend,shape,decay,scalar", recurrence_cases())
def test_triton_backend_matches_recurrence(backend, shape, decay, scalar, device, poison_empty):
    """fp32 inputs (no TF32), every output and gradient against the fp64 recurrence on the same inputs."""
    inputs = [x.float().to(device) for x in make_inputs(*shape, decay, scalar)]
    assert_matches_recurrence(get_op("gla", backend), inputs, fp32_bound(decay, inputs[3]))


def assert_matches_recurrence(op, inputs: list[torch.Tensor], tol: float) -> None:
    """op on fp32 inputs (q, k, v, gk, h0) against the fp64 recurrence on the same values: o, the
    final state and every gradient within tol, relative to the size of the terms each one sums
    (`magnitudes`): at T = 1, K = 4 an output of three 5-term sums can cancel to 1% of its terms,
    and fp32's rounding of the terms alone then exceeds 1e-5 of the result (seen once on the H100)."""
    ref_in = [x.double().requires_grad_() for x in inputs]
    got_in = [x.clone().requires_grad_() for x in inputs]
    o1, s1 = gla_recurrent(*ref_in[:4], initial_state=ref_in[4], output_final_state=True)
    o2, s2 = op(*got_in[:4], initial_state=got_in[4], output_final_state=True)
    do, ds = torch.randn_like(o1), torch.randn_like(s1)
    (o_mag, s_mag), grad_mags = magnitudes(inputs, do, ds)
    assert o2.dtype == torch.float32
    for name, got, ref, mag in (("o", o2, o1, o_mag), ("final state", s2, s1, s_mag)):
        err, bound = (got.double() - ref).norm().item(), tol * mag.norm().item()
        assert err <= bound, f"{name}: ‖Δ‖ = {err:.3e} > {bound:.3e} (‖ref‖ = {ref.norm().item():.3e})"
    ((o1 * do).sum() + (s1 * ds).sum()).backward()
    ((o2 * do.float()).sum() + (s2 * ds.float()).sum()).backward()
    grads_close([x.grad for x in got_in], [y.grad for y in ref_in], "q k v gk h0".split(), tol, magnitudes=grad_mags)


def magnitudes(inputs: list[torch.Tensor], do: torch.Tensor, ds: torch.Tensor):
    """The recurrence on |q|, |k|, |v|, |h0| with the same decays, and its gradients for |do|, |ds|:
    every term of every sum taken positive, so each entry bounds the size of the terms the true
    value adds up (the forward-error scale of a sum). Returns (o, final state), [∂q, ∂k, ∂v, ∂gk, ∂h0]."""
    q, k, v, gk, h0 = [x.double().abs().requires_grad_() if i != 3 else x.double().requires_grad_()
                       for i, x in enumerate(inputs)]
    o, s = gla_recurrent(q, k, v, gk, initial_state=h0, output_final_state=True)
    ((o * do.abs()).sum() + (s * ds.abs()).sum()).backward()
    return (o.detach(), s.detach()), [x.grad.abs() for x in (q, k, v, gk, h0)]


# every chunk size each backend offers besides 64 (the default, which every other test here runs), each with one of
# the two decay profiles in turn; the largest size of each backend with the mixed one (b grows longest there)
SIZES = [("chunk", 16, "mixed"), ("chunk", 32, "realistic"), ("chunk", 128, "mixed"),
         ("fused", 16, "realistic"), ("fused", 32, "mixed"), ("fused", 128, "realistic"), ("fused", 256, "mixed")]


@pytest.mark.parametrize("backend,chunk_size,decay", SIZES)
def test_triton_chunk_sizes(backend, chunk_size, decay, device, poison_empty):
    """Chunk sizes other than the default, with random output gradients (an all-ones gradient cannot tell a
    row or tile read from the wrong place) and unwritten outputs poisoned."""
    from ops.chunkwise.decay_attention import chunk_decay_attention
    from ops.gla.fused import fused_chunk_gla, sub_block

    run = chunk_decay_attention if backend == "chunk" else fused_chunk_gla
    T = min(150, 2 * chunk_size + 7)          # two whole chunks and a partial one: the state crosses chunks twice
    inputs = [x.float().to(device) for x in make_inputs(1, T, 1, 8, 12, decay)]
    # fused holds b per 64-row sub-block, so only chunk's b spans the whole chunk
    tol = fp32_bound(decay, inputs[3], chunk_size if backend == "chunk" else sub_block(chunk_size))
    assert_matches_recurrence(lambda q, k, v, g, initial_state, output_final_state: run(
        q, k, v, g, 8 ** -0.5, initial_state, output_final_state, chunk_size), inputs, tol)


@pytest.mark.parametrize("backend,chunk_size", [("chunk", 256), ("fused", 512), ("fused", 48)])
def test_unsupported_chunk_sizes_are_refused(backend, chunk_size):
    from ops.chunkwise.decay_attention import chunk_decay_attention
    from ops.gla.fused import fused_chunk_gla

    x = torch.zeros(1, 4, 1, 4)
    run = chunk_decay_attention if backend == "chunk" else fused_chunk_gla
    with pytest.raises(ValueError, match=rf"chunk_size must be one of \(16, 32, 64, 128.*\), got {chunk_size}"):
        run(x, x, x, x, 1.0, None, False, chunk_size)


# with `chunk`, near0 keeps every chunk on the factorised paths and realistic sends every one to the exact ones; the
# stages alone have no such branch, and the model's gate decays the carry by a few e-folds per chunk, neither to 0
# (realistic) nor not at all (near0)
@pytest.mark.parametrize("fuse,decay", [("chunk,state", "near0"), ("chunk,state", "realistic"), ("state", "model")])
def test_fused_state_split_matches_recurrence(fuse, decay, device, poison_empty, monkeypatch):
    """The `state` component with and without `chunk`, at T = 200: four chunks (the last ragged), split into two
    segments of two (asserted; segments of two chunks allowed here), so the carry between segments is exercised,
    forward and every gradient."""
    from ops import parse_fuse
    from ops.chunkwise.state import segment_plan, split_segments

    monkeypatch.setattr("ops.chunkwise.state.MIN_SEGMENT_CHUNKS", 2)
    assert split_segments(1, 1, 8, 6, 200, 64, torch.device(device)) == 2 and segment_plan(4, 2) == (2, 2)
    inputs = [x.float().to(device) for x in make_inputs(1, 200, 1, 8, 6, decay)]
    assert_matches_recurrence(get_op("gla", "fused", parse_fuse(fuse)), inputs, 1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="full shapes need a CUDA GPU")
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.parametrize("shape", [(16, 2048, 12, 64, 64), (8, 2048, 4, 256, 512), (8, 2048, 4, 128, 256),
                                   (2, 1000, 3, 60, 100), (4, 1000, 12, 64, 64)],
                         ids=["mve", "gla340m_layer", "gla340m_model", "odd", "ragged_scan"])
def test_triton_backend_bf16_full_shapes(backend, shape):
    """bf16 inputs, fp32 accumulation: within 5e-3 of the fp32 naive oracle on the same inputs,
    forward and gradients. fused runs the scan forward at mve, gla340m_model and ragged_scan (T % 64 ≠ 0),
    chunk's parallel stages at gla340m_layer and odd (ops.gla.fused.scan_forward)."""
    assert_bf16_matches_naive(get_op("gla", backend), shape)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="full shapes need a CUDA GPU")
@pytest.mark.parametrize("chunk_size", [32, 128, 256])
@pytest.mark.parametrize("shape", [(16, 2048, 12, 64, 64), (8, 2048, 4, 256, 512), (2, 1000, 3, 60, 100)],
                         ids=["mve", "gla340m_layer", "odd"])
def test_fused_bf16_chunk_sizes(chunk_size, shape):
    """The fused op at the chunk sizes the model does not use (it runs 64, above), at full shapes in bf16, with
    the initial and final states: the scan where ops.gla.fused.scan_forward takes it (mve at C ≤ 128,
    gla340m_layer at C = 32) and chunk's parallel forward elsewhere, C = 256 as 64-row sub-blocks."""
    from ops.gla.fused import fused_chunk_gla

    assert_bf16_matches_naive(lambda q, k, v, g, initial_state, output_final_state: fused_chunk_gla(
        q, k, v, g, q.shape[-1] ** -0.5, initial_state, output_final_state, chunk_size), shape)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 on a GPU")
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
def test_triton_backend_bf16_odd_shapes(backend, shape):
    """The CPU tests' odd shapes (T = 1, T < C, B = H = 1, K ≠ V, K = 1) in bf16 on the GPU, with the initial and
    final states: the fp32 tests cover their logic, this their bf16 loads, stores and masks as Hopper compiles
    them (Triton on Hopper has miscompiled kernels that pass in the interpreter)."""
    assert_bf16_matches_naive(get_op("gla", backend), shape)


def assert_bf16_matches_naive(op, shape, gk: torch.Tensor | None = None, gk_tol: float = 5e-3) -> dict[str, float]:
    """bf16 q, k, v and fp32 gates, initial state and final-state gradient (as the model and the state API hold
    them) against the fp32 naive oracle on the same values: o, the final state and every gradient, h0's
    included, within 5e-3 (∂gk within gk_tol). gk defaults to the model's logsigmoid(·)/16. Returns the errors."""
    torch.manual_seed(0)                                                 # the output gradients below
    x = gla_inputs(dict(zip("BTHKV", shape)), torch.bfloat16, "cuda", requires_grad=False, initial_state=True)
    if gk is not None:
        x["gk"] = gk
    got_in = [t.clone().requires_grad_() for t in x.values()]            # bf16 q, k, v; fp32 gk, h0
    ref_in = [x.detach().float().requires_grad_() for x in got_in]      # the same (bf16-rounded) inputs
    o1, s1 = gla(*ref_in[:4], initial_state=ref_in[4], output_final_state=True)
    o2, s2 = op(*got_in[:4], initial_state=got_in[4], output_final_state=True)
    err = {"o": rel_err(o2, o1), "final state": rel_err(s2, s1)}
    do, ds = torch.randn_like(o1), torch.randn_like(s1)
    ((o1 * do).sum() + (s1 * ds).sum()).backward()
    ((o2 * do.to(o2.dtype)).sum() + (s2 * ds).sum()).backward()
    err.update({name: rel_err(x.grad, y.grad) for name, x, y in zip("q k v gk h0".split(), got_in, ref_in)})
    for name, e in err.items():
        assert e < (gk_tol if name == "gk" else 5e-3), f"{name}: {e:.2e} ({err})"
    return err


def chunk_ranges(gk: torch.Tensor, C: int) -> torch.Tensor:
    """−b_L per (batch, chunk, head, key dim): each chunk's total log-decay, what fused_scan.MAX_RANGE bounds."""
    B, T, H, K = gk.shape
    pad = torch.nn.functional.pad(gk, (0, 0, 0, 0, 0, -T % C))
    return -pad.view(B, -1, C, H, K).sum(2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="full shapes need a CUDA GPU")
@pytest.mark.parametrize("shape", [(4, 1000, 12, 64, 64), (2, 1000, 4, 256, 128)], ids=["scan", "parallel"])
def test_fused_bf16_decays_at_and_past_the_fast_path_limit(shape):
    """fused forms a chunk's scores as one factorised dot while −b_L ≤ MAX_RANGE (64) in every key dim, with q̃
    growing to exp(−b_L); past that the forward takes the exact recurrence and the backward the sub-block kernels
    of fused_chunk.py. The model's gates give −b_L ≈ 3, so the tests above never leave the fast path. Here the
    chunks of one sequence cycle through totals of 5, 40, 60, 63 (factorised, near the limit) and 90, 500
    (exact), at ragged T, in bf16, through the scan forward and through chunk's parallel stages. ∂gk sums two
    terms that cancel more as the decay grows: it is held to 1.5× chunk's error on the same inputs, or 5e-3."""
    from ops.chunkwise.decay_attention import state_segments
    from ops.gla.scan import MAX_RANGE
    from ops.gla.fused import scan_forward

    B, T, H, K, V = shape
    C = 64
    totals = torch.tensor([5.0, 40.0, 60.0, 63.0, 90.0, 500.0], device="cuda")
    per_step = (totals[torch.arange((T + C - 1) // C, device="cuda") % len(totals)] / C).repeat_interleave(C)[:T]
    gen = torch.Generator(device="cuda").manual_seed(1)
    gk = -per_step[None, :, None, None] * (0.9 + 0.1 * torch.rand(B, T, H, K, device="cuda", generator=gen))
    wild = (chunk_ranges(gk, C) > MAX_RANGE).flatten(2).any(-1)                     # [B, chunks]
    assert wild.any() and not wild.all() and (chunk_ranges(gk, C) > 55).any()
    q = torch.empty(B, T, H, K, device="cuda", dtype=torch.bfloat16)
    v = torch.empty(B, T, H, V, device="cuda", dtype=torch.bfloat16)
    segments = state_segments(q, v, C, True)
    assert scan_forward(B, T, H, K, V, C, 2, q.device, segments) == (shape[3] == 64)   # each id takes its path
    chunk_err = assert_bf16_matches_naive(get_op("gla", "chunk"), shape, gk, gk_tol=float("inf"))["gk"]
    assert_bf16_matches_naive(get_op("gla", "fused"), shape, gk, gk_tol=max(5e-3, 1.5 * chunk_err))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="full shapes need a CUDA GPU")
@pytest.mark.parametrize("fuse", ["chunk,state", "state"])
def test_fused_bf16_split_state_scan(fuse):
    """The split state scan against naive where it splits on the GPU (B1 H4 K=V=128, T = 8192: 16 state tiles
    for 132 SMs, 4 segments), with the initial and final states, every gradient, in bf16."""
    from ops import parse_fuse
    from ops.chunkwise.decay_attention import state_segments

    shape = (1, 8192, 4, 128, 128)
    x = torch.empty(*shape[:4], device="cuda", dtype=torch.bfloat16)
    assert state_segments(x, x, 64, True) > 1
    assert_bf16_matches_naive(get_op("gla", "fused", parse_fuse(fuse)), shape)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="full shapes need a CUDA GPU")
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.parametrize("shape", [(1, 2048, 12, 64, 64), (4, 2048, 12, 64, 64), (6, 2048, 12, 64, 64),
                                   (4, 2048, 4, 128, 256), (3, 1000, 3, 64, 32)],
                         ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
def test_triton_backend_bf16_evaluation_shapes(backend, shape):
    """Without gradients (evaluation, generation) and at the small batches evaluation runs: within 5e-3 of
    the fp32 naive oracle. The fused scan once picked V tiles that miscompile on the H100 only here
    (ops/gla/movement.py MIN_BV): the training-shape test above, with gradients, passed."""
    q, k, v, gk = gla_inputs(dict(zip("BTHKV", shape)), torch.bfloat16, "cuda", requires_grad=False).values()
    with torch.no_grad():
        o2, _ = get_op("gla", backend)(q, k, v, gk)
        o1, _ = gla(q.float(), k.float(), v.float(), gk)
    assert rel_err(o2, o1) < 5e-3


@pytest.mark.skipif(importlib.util.find_spec("fla") is None or not torch.cuda.is_available(),
                    reason="needs flash-linear-attention and a CUDA GPU")
def test_naive_matches_fla_reference():
    from fla.ops.gla.naive import naive_recurrent_gla

    q, k, v, gk, h0 = (x.float().cuda() for x in make_inputs(2, 100, 2, 16, 8, "realistic"))
    ref, s_ref = naive_recurrent_gla(q, k, v, gk, initial_state=h0, output_final_state=True)
    out, s = get_op("gla", "naive")(q, k, v, gk, initial_state=h0, output_final_state=True)
    assert rel_err(out, ref) < 1e-5 and rel_err(s, s_ref) < 1e-5
