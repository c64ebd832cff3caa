"""Gated delta rule: the chunkwise WY/UT oracle against the step recurrence, forward and every
gradient, at awkward shapes, β near 0 and 1, and strongly decaying gates; gradcheck on tiny shapes."""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from ops.gated_delta.naive import chunkwise_gated_delta, gated_delta, gated_delta_recurrent
from ops.gated_delta.naive import make_inputs as gdn_inputs
from tests.helpers import backends_under_test, grads_close, left_to_the_gpu, rel_err

SHAPES = [(2, 100, 3, 8, 5), (1, 7, 1, 4, 6), (1, 1, 2, 3, 3), (2, 130, 2, 16, 8), (1, 64, 1, 2, 4)]
# the builder's regimes (ops.gated_delta.naive.GATES, BETAS): gates in [−5, 0), [−1e-6, 0) and [−1e3, −50);
# β in [0, 1), [0, 1e-4) and [1 − 1e-4, 1)
GATES = ("realistic", "near0", "extreme")
BETAS = ("mid", "near0", "near1")


def make_inputs(B, T, H, K, V, gate, betas, dtype=torch.float64, seed=None):
    """q, k (L2-normalised, as the model feeds it), v, g, beta, h0 from the op's builder, fresh unless seeded."""
    return tuple(gdn_inputs(dict(B=B, T=T, H=H, K=K, V=V), dtype, seed=seed, requires_grad=False, decay=gate,
                            beta=betas, initial_state=True).values())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
@pytest.mark.parametrize("gate", list(GATES))
@pytest.mark.parametrize("betas", list(BETAS))
def test_chunk_matches_recurrence_fwd_bwd(shape, gate, betas):
    inputs = make_inputs(*shape, gate, betas)
    a = [x.clone().requires_grad_() for x in inputs]
    b = [x.clone().requires_grad_() for x in inputs]
    o1, s1 = gated_delta_recurrent(*a[:5], initial_state=a[5], output_final_state=True)
    o2, s2 = gated_delta(*b[:5], initial_state=b[5], output_final_state=True)
    assert rel_err(o2, o1) < 1e-10 and rel_err(s2, s1) < 1e-10
    do, ds = torch.randn_like(o1), torch.randn_like(s1)
    ((o1 * do).sum() + (s1 * ds).sum()).backward()
    ((o2 * do).sum() + (s2 * ds).sum()).backward()
    grads_close([x.grad for x in b], [y.grad for y in a], "q k v g beta h0".split(), 1e-9)


@pytest.mark.parametrize("chunk_size", [16, 32, 64, 128])
def test_chunk_sizes(chunk_size):
    q, k, v, g, beta, h0 = make_inputs(2, 150, 2, 8, 12, "realistic", "mid")
    o1, s1 = gated_delta_recurrent(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o2, s2 = chunkwise_gated_delta(q, k, v, g, beta, None, h0, chunk_size=chunk_size)
    assert rel_err(o2, o1) < 1e-10 and rel_err(s2, s1) < 1e-10


def test_fp32_against_fp64_reference():
    for gate in GATES:
        inputs = [x.float() for x in make_inputs(2, 200, 2, 32, 16, gate, "mid")]
        ref, _ = gated_delta_recurrent(*(x.double() for x in inputs[:5]), initial_state=inputs[5].double())
        out, _ = gated_delta(*inputs[:5], initial_state=inputs[5])
        assert out.dtype == torch.float32 and rel_err(out, ref) < 1e-5, gate


def test_beta_one_and_no_decay_is_the_delta_rule_overwrite():
    """β = 1, g = 0, one key repeated: the state forgets the old value for that key."""
    k = F.normalize(torch.randn(1, 1, 1, 4, dtype=torch.float64), dim=-1).expand(1, 2, 1, 4)
    v = torch.randn(1, 2, 1, 3, dtype=torch.float64)
    o, S = gated_delta(k, k, v, torch.zeros(1, 2, 1, dtype=torch.float64), torch.ones(1, 2, 1, dtype=torch.float64),
                       scale=1.0, output_final_state=True)
    assert torch.allclose(S[0, 0], k[0, 0, 0, :, None] * v[0, 1, 0][None], atol=1e-12)
    assert torch.allclose(o[0, 1, 0], v[0, 1, 0], atol=1e-12)


def test_gradcheck_tiny():
    xs = [x.requires_grad_() for x in make_inputs(1, 6, 1, 3, 2, "realistic", "mid")]
    f = lambda *a: chunkwise_gated_delta(*a[:5], None, a[5], chunk_size=4)  # noqa: E731
    assert torch.autograd.gradcheck(f, tuple(xs))


@pytest.mark.skipif(importlib.util.find_spec("fla") is None or not torch.cuda.is_available(),
                    reason="needs flash-linear-attention and a CUDA GPU")
def test_naive_matches_fla_reference():
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    q, k, v, g, beta, h0 = (x.float().cuda() for x in make_inputs(2, 100, 2, 16, 8, "realistic", "mid"))
    ref, s_ref = naive_recurrent_gated_delta_rule(q, k, v, beta, g, initial_state=h0, output_final_state=True)
    out, s = gated_delta(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert rel_err(out, ref) < 1e-5 and rel_err(s, s_ref) < 1e-5


# --- Triton backends --------------------------------------------------------------------------

TRITON_BACKENDS = backends_under_test("gated_delta")   # fused is chunk's function
# (B, T, H, K, V): T not a multiple of C = 64 (two chunks, ragged), T < C with B = H = 1, T = 1; K ≠ V
CHUNK_SHAPES = [(2, 70, 1, 8, 6), (1, 5, 1, 4, 4), (1, 1, 2, 4, 3)]


def recurrence_cases() -> list:
    """Every backend × gate × beta profile × shape on a GPU. Under the interpreter (no GPU) each profile runs on
    one backend per shape, the two alternating from shape to shape (left_to_the_gpu), so that every backend still
    meets every profile and every shape."""
    cases = []
    for j, shape in enumerate(CHUNK_SHAPES):
        for i, (gate, betas) in enumerate((g, b) for b in BETAS for g in GATES):
            for k, backend in enumerate(TRITON_BACKENDS):
                if left_to_the_gpu(i, j, k):
                    continue
                cases.append(pytest.param(backend, shape, gate, betas, id="{}-{}-B{}T{}H{}K{}V{}-{}".format(
                    betas, gate, *shape, backend)))
    return cases


@pytest.mark.parametrize("backend,shape,gate,betas", recurrence_cases())
def test_triton_backend_matches_recurrence(backend, shape, gate, betas, device, poison_empty):
    """fp32 inputs (no TF32): the output, the final state and every gradient (through both) against
    the fp64 recurrence on the same inputs, the 1e-5 bound."""
    from ops import get_op

    op = get_op("gated_delta", backend)
    inputs = [x.float().to(device) for x in make_inputs(*shape, gate, betas)]
    ref_in = [x.double().requires_grad_() for x in inputs]
    got_in = [x.clone().requires_grad_() for x in inputs]
    o1, s1 = gated_delta_recurrent(*ref_in[:5], initial_state=ref_in[5], output_final_state=True)
    o2, s2 = op(*got_in[:5], initial_state=got_in[5], output_final_state=True)
    assert o2.dtype == torch.float32 and s2.dtype == torch.float32
    assert rel_err(o2, o1) < 1e-5 and rel_err(s2, s1) < 1e-5
    do, ds = torch.randn_like(o1), torch.randn_like(s1)
    ((o1 * do).sum() + (s1 * ds).sum()).backward()
    ((o2 * do.float()).sum() + (s2 * ds.float()).sum()).backward()
    grads_close([x.grad for x in got_in], [y.grad for y in ref_in], "q k v g beta h0".split(), 1e-5)


@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_triton_chunk_sizes(chunk_size, device, poison_empty):
    """Every chunk size the Triton backends run (ops.gated_delta.chunk.CHUNK_SIZES), several chunks and a ragged
    tail; no initial or final state (the other branches of the state kernels)."""
    from ops.gated_delta.chunk import chunk_gated_delta

    inputs = [x.float().to(device) for x in make_inputs(1, 100, 1, 8, 12, "realistic", "mid")[:5]]
    ref_in = [x.double().requires_grad_() for x in inputs]
    got_in = [x.clone().requires_grad_() for x in inputs]
    o1, _ = gated_delta_recurrent(*ref_in)
    o2, s2 = chunk_gated_delta(*got_in, 8 ** -0.5, None, False, chunk_size)
    assert s2 is None and rel_err(o2, o1) < 1e-5
    do = torch.randn_like(o1)
    (o1 * do).sum().backward()
    (o2 * do.float()).sum().backward()
    grads_close([x.grad for x in got_in], [y.grad for y in ref_in], "q k v g beta".split(), 1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="full shapes need a CUDA GPU")
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.parametrize("shape", [(8, 2048, 8, 128, 128), (16, 2048, 16, 64, 64), (2, 1000, 3, 60, 100)],
                         ids=["wide", "mve", "odd"])
def test_triton_backend_bf16_full_shapes(backend, shape):
    """bf16 q, k, v, fp32 g, beta and states, fp32 accumulation: within 5e-3 of the fp32 naive
    oracle on the same (bf16-rounded) inputs, output, final state and every gradient."""
    from ops import get_op

    check_bf16(shape, get_op("gated_delta", backend))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 on a GPU")
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
def test_triton_backend_bf16_odd_shapes(backend, shape):
    """The CPU tests' odd shapes (T = 1, T < C, B = H = 1, K ≠ V) in bf16 on the GPU, with the same bounds as the
    full shapes above."""
    from ops import get_op

    check_bf16(shape, get_op("gated_delta", backend))


def state_dtypes(monkeypatch) -> list:
    """Records the dtype of every h and dh the chunk op's state stages return."""
    from ops.gated_delta import chunk

    seen = []
    for name in ("delta_h_fwd", "delta_h_bwd"):
        def wrapped(*args, _f=getattr(chunk, name), **kwargs):
            out = _f(*args, **kwargs)
            seen.append(out[0].dtype)
            return out
        monkeypatch.setattr(chunk, name, wrapped)
    return seen


def test_chunk_state_dtype_is_kept(monkeypatch, device):
    """state_dtype reaches both state stages: fp32 inputs with bf16 states round h and dh, and stay close."""
    from ops.gated_delta.chunk import chunk_gated_delta

    seen = state_dtypes(monkeypatch)
    q, k, v, g, beta, _ = (x.float().to(device) for x in make_inputs(1, 100, 2, 16, 8, "realistic", "mid", seed=0))
    q.requires_grad_()
    o = chunk_gated_delta(q, k, v, g, beta, 0.25, None, False, state_dtype=torch.bfloat16)[0]
    o.sum().backward()
    assert seen == [torch.bfloat16, torch.bfloat16]
    ref = gated_delta(q.detach(), k, v, g, beta, 0.25)[0]
    assert 0 < rel_err(o.detach(), ref) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 dots need a CUDA GPU")
def test_chunk_fp32_states_bf16(monkeypatch):
    """The chunk op with h and dh stored in fp32: within the bf16 bounds, and
    with the same output as bf16 states, since the output stage rounds h to bf16 for its dot."""
    from ops.gated_delta.chunk import chunk_gated_delta

    seen = state_dtypes(monkeypatch)
    outputs = []

    def op(q, k, v, g, beta, initial_state, output_final_state, state_dtype=torch.float32):
        o, s = chunk_gated_delta(q, k, v, g, beta, q.shape[-1] ** -0.5, initial_state, output_final_state,
                                 state_dtype=state_dtype)
        outputs.append(o.detach())
        return o, s
    check_bf16((2, 1000, 3, 60, 100), op)
    assert seen == [torch.float32, torch.float32]
    x = [t.detach() for t in make_inputs(2, 1000, 3, 60, 100, "realistic", "mid", torch.float32, seed=0)]
    x = [t.cuda() for t in x]
    x[:3] = [t.bfloat16() for t in x[:3]]
    with torch.no_grad():
        assert torch.equal(op(*x[:5], x[5], False)[0], op(*x[:5], x[5], False, torch.bfloat16)[0])


def check_bf16(shape, op):
    torch.manual_seed(0)                                                 # the output gradients below
    # bf16 q, k, v; fp32 g (the model's gate −exp(A_log) · softplus(x W_a + dt_bias)), β = sigmoid(·), h0
    got_in = list(gdn_inputs(dict(zip("BTHKV", shape)), torch.bfloat16, "cuda", initial_state=True).values())
    ref_in = [x.detach().float().requires_grad_() for x in got_in]      # the same (bf16-rounded) inputs
    o1, s1 = gated_delta(*ref_in[:5], initial_state=ref_in[5], output_final_state=True)
    o2, s2 = op(*got_in[:5], initial_state=got_in[5], output_final_state=True)
    assert o2.dtype == torch.bfloat16 and rel_err(o2, o1) < 5e-3 and rel_err(s2, s1) < 5e-3
    do, ds = torch.randn_like(o1), torch.randn_like(s1)
    ((o1 * do).sum() + (s1 * ds).sum()).backward()
    ((o2 * do.to(torch.bfloat16)).sum() + (s2 * ds).sum()).backward()
    for name, x, y in zip("q k v g beta h0".split(), got_in, ref_in):
        assert rel_err(x.grad, y.grad) < 5e-3, name
