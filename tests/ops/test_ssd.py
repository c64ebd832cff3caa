"""Mamba-2 SSD: the chunkwise form (GLA's, with a scalar decay) against an independent step
recurrence, forward and every gradient; groups shared by heads; gradcheck on tiny shapes."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from ops.ssd.naive import make_inputs as ssd_inputs
from ops.ssd.naive import ssd, ssd_recurrent
from tests.helpers import backends_under_test, chunkwise_dg_terms, grads_close, rel_err

# (B, T, H, P, G, N)
SHAPES = [(2, 100, 4, 8, 1, 6), (1, 7, 1, 4, 1, 3), (2, 130, 4, 5, 2, 8), (1, 1, 2, 3, 2, 2), (1, 64, 6, 4, 3, 4)]
DT = ("realistic", "large")   # the builder's dt ranges (ops.ssd.naive.DT): dt · A spans mild to extreme decays


def make_inputs(B, T, H, P, G, N, dts, dtype=torch.float64, seed=None):
    """x, dt, A, B, C, h0 from the op's builder, fresh unless seeded."""
    return tuple(ssd_inputs(dict(B=B, T=T, H=H, P=P, G=G, N=N), dtype, seed=seed, requires_grad=False, decay=dts,
                            initial_state=True).values())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}P{}G{}N{}".format(*s))
@pytest.mark.parametrize("dts", list(DT))
def test_chunk_matches_recurrence_fwd_bwd(shape, dts):
    inputs = make_inputs(*shape, dts)
    a = [x.clone().requires_grad_() for x in inputs]
    b = [x.clone().requires_grad_() for x in inputs]
    y1, h1 = ssd_recurrent(*a[:5], initial_state=a[5], output_final_state=True)
    y2, h2 = ssd(*b[:5], initial_state=b[5], output_final_state=True)
    assert rel_err(y2, y1) < 1e-10 and rel_err(h2, h1) < 1e-10
    dy, dh = torch.randn_like(y1), torch.randn_like(h1)
    ((y1 * dy).sum() + (h1 * dh).sum()).backward()
    ((y2 * dy).sum() + (h2 * dh).sum()).backward()
    grads_close([x.grad for x in b], [y.grad for y in a], "x dt A B C h0".split(), 1e-9)


def test_fp32_against_fp64_reference():
    inputs = [x.float() for x in make_inputs(2, 200, 4, 16, 1, 32, "realistic")]
    ref, _ = ssd_recurrent(*(x.double() for x in inputs[:5]), initial_state=inputs[5].double())
    out, _ = ssd(*inputs[:5], initial_state=inputs[5])
    assert out.dtype == torch.float32 and rel_err(out, ref) < 1e-5


def test_gradcheck_tiny():
    xs = tuple(x.requires_grad_() for x in make_inputs(1, 5, 2, 2, 1, 3, "realistic"))
    assert torch.autograd.gradcheck(lambda *a: ssd(*a[:5], initial_state=a[5], output_final_state=True), xs)


@pytest.mark.parametrize("backend", backends_under_test("ssd"))
# T = 600: ten chunks of 64, which `fused`'s split state scan runs as two segments (short_segments)
@pytest.mark.parametrize("shape", [(2, 70, 4, 8, 2, 16), (1, 5, 2, 4, 1, 8), (1, 600, 1, 8, 1, 8)],
                         ids=lambda s: "B{}T{}H{}P{}G{}N{}".format(*s))
@pytest.mark.parametrize("dts", list(DT))
def test_triton_backend_matches_recurrence(backend, shape, dts, device, poison_empty, short_segments):
    """fp32 inputs (no TF32), every output and gradient (x, dt, A, B, C, h0) against the fp64 recurrence."""
    from ops import get_op

    if backend == "fused" and shape[1] == 600:
        from ops.chunkwise.state import split_segments
        assert split_segments(shape[0], shape[2], shape[5], shape[3], 600, 64, torch.device(device)) == 2
    seed = torch.seed() % 2**31                                  # fresh inputs, named in a failure's message
    torch.manual_seed(seed)                                      # and the output gradients drawn below from it
    inputs = [t.float().to(device) for t in make_inputs(*shape, dts, seed=seed)]
    ref_in = [t.double().requires_grad_() for t in inputs]
    got_in = [t.clone().requires_grad_() for t in inputs]
    y1, h1 = ssd_recurrent(*ref_in[:5], initial_state=ref_in[5], output_final_state=True)
    y2, h2 = get_op("ssd", backend)(*got_in[:5], initial_state=got_in[5], output_final_state=True)
    # exp(b_L − b) of two large chunk-local cumsums b: each carries ~|b|·2⁻²⁴ of rounding (more on the GPU, whose
    # exp2 takes x·log₂e rounded). 'large' dt at a mild A (−1.2) reached 1.5e-5 in 1 of 200 draws on the H100
    b = (ref_in[1] * ref_in[2]).detach().cpu()
    b_max = max(c.cumsum(1).abs().max().item() for c in b.split(64, dim=1))
    tol = max(1e-5, b_max * 2.0 ** -24)
    assert rel_err(y2, y1) < tol and rel_err(h2, h1) < tol, (seed, rel_err(y2, y1), rel_err(h2, h1), tol)
    dy, dh = torch.randn_like(y1), torch.randn_like(h1)
    ((y1 * dy).sum() + (h1 * dh).sum()).backward()
    ((y2 * dy.float()).sum() + (h2 * dh.float()).sum()).backward()
    # ∂dt and ∂A go through ∂g: its exponents add the residual of b's rounding, but it reads the forward's states,
    # which keep it: the outputs' bound (tol). ∂g_t = Σ_{s≥t} ∂b_s adds the steps after t, which cancel where they
    # span no step of t's (after a chunk's strong steps a weak last one left 1e-6 of its ∂b in their ∂g), so ∂g_t is
    # held relative to chunkwise_dg_terms: ∂dt = A ∂g + ⟨x, ∂v⟩ to the larger of A times that and itself, and
    # ∂A_h = Σ_{b,t} dt ∂g, whose terms also cancel between steps, to Σ dt times that (dt weighed those strong steps a
    # dozen times the weak one: 5e-5 of Σ |dt ∂g|). At strong decays that is often ten times Σ |dt ∂g| or more:
    # tests/ops/test_decay_grad.py holds ∂A to Σ |dt ∂g| itself
    det = [t.detach() for t in ref_in]
    dg_terms = chunkwise_dg_terms(*det, dy, dh)                                          # [B, T, H]
    mags = [t.grad.abs() for t in ref_in]
    mags[1] = torch.maximum(mags[1], det[2].abs() * dg_terms)
    mags[2] = (det[1] * dg_terms).sum(dim=(0, 1))
    b_terms = {n: (tol - 1e-5) * m.norm().item() for n, m in (("dt", mags[1]), ("A", mags[2]))}
    try:
        grads_close([t.grad for t in got_in], [t.grad for t in ref_in], "x dt A B C h0".split(), 1e-5, b_terms, mags)
    except AssertionError as e:                     # the draw, so that a failure can be replayed
        raise AssertionError(f"seed {seed}: {e}") from None


@pytest.mark.parametrize("backend", backends_under_test("ssd"))
def test_groups_stay_unexpanded_for_the_backward(backend, device):
    """B and C shared by a group of heads are kept for the backward per group, not copied per head
    (mamba2_370m: 32 heads, one group; 268 MB per layer at B8 T2048 bf16); the gradient check above
    covers their summed gradients (G = 2 of H = 4)."""
    from ops import get_op

    x, dt, A, Bm, Cm, _ = (t.float().to(device).requires_grad_() for t in make_inputs(1, 64, 8, 4, 1, 16, "realistic"))
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
        get_op("ssd", backend)(x, dt, A, Bm, Cm)
    assert (1, 64, 1, 16) in shapes and (1, 64, 8, 16) not in shapes, shapes


# (B, T, H, P, G, N): Mamba-2's layer, and a ragged one (T % 64 ≠ 0, P and N not powers of two)
GPU_SHAPES = {"mamba2": (8, 2048, 24, 64, 1, 128), "odd": (2, 1000, 3, 60, 1, 100)}


def bf16_full_shape_errors(backend: str, shape: tuple = GPU_SHAPES["mamba2"], seeds=(0,)) -> dict[str, float]:
    """bf16 x/B/C (fp32 dt, A, initial state and final-state gradient): relative error of y, the final state and
    every gradient, ∂h0 included, against the fp32 naive oracle on the same (bf16-rounded) inputs, taken over the
    draws of all `seeds` together (one ‖Δ‖ / ‖ref‖ of the concatenated tensors)."""
    runs = [bf16_pairs(backend, shape, seed) for seed in seeds]
    return {n: rel_err(torch.cat([r[n][0].flatten().float() for r in runs]),
                       torch.cat([r[n][1].flatten().float() for r in runs])) for n in runs[0]}


def bf16_pairs(backend: str, shape: tuple, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(backend's, oracle's) y, final state and every gradient on one draw of bf16_full_shape_errors' inputs."""
    from ops import get_op

    torch.manual_seed(seed)                                              # the output gradients below
    got_in = list(ssd_inputs(dict(zip(("B", "T", "H", "P", "G", "N"), shape)), torch.bfloat16, "cuda", seed=seed,
                             initial_state=True).values())               # bf16 x, B, C; fp32 dt, A, h0
    ref_in = [t.detach().float().requires_grad_() for t in got_in]
    y1, s1 = ssd(*ref_in[:5], initial_state=ref_in[5], output_final_state=True)
    y2, s2 = get_op("ssd", backend)(*got_in[:5], initial_state=got_in[5], output_final_state=True)
    dy, ds = torch.randn_like(y1), torch.randn_like(s1)
    ((y1 * dy).sum() + (s1 * ds).sum()).backward()
    ((y2 * dy.bfloat16()).sum() + (s2 * ds).sum()).backward()
    return {"y": (y2, y1), "final state": (s2, s1),
            **{name: (a.grad, b.grad) for name, a, b in zip("x dt A B C h0".split(), got_in, ref_in)}}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="full shapes need a CUDA GPU")
@pytest.mark.parametrize("shape", list(GPU_SHAPES.values()), ids=list(GPU_SHAPES))
@pytest.mark.parametrize("backend", backends_under_test("ssd"))
def test_triton_backend_bf16_full_shape(backend, shape, seeds=(0,)):
    """y, the final state and every gradient but ∂A within 5e-3. ∂A: chunk's is held to fla's error (the test
    below); every other backend's to 1.1× chunk's on the same inputs, or 5e-3."""
    errs = bf16_full_shape_errors(backend, shape, seeds)
    assert all(e < 5e-3 for n, e in errs.items() if n != "A"), errs
    if backend != "chunk":
        ref = bf16_full_shape_errors("chunk", shape, seeds)["A"]
        assert errs["A"] <= max(5e-3, 1.1 * ref), (errs["A"], ref)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 on a GPU")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}P{}G{}N{}".format(*s))
@pytest.mark.parametrize("backend", backends_under_test("ssd"))
def test_triton_backend_bf16_odd_shapes(backend, shape):
    """The CPU tests' odd shapes (T = 1, T < C, B = H = 1, several groups, tiny N and P) in bf16 on the GPU,
    held to the full shapes' bounds: the fp32 tests cover their logic, this their bf16 loads, stores and masks as
    Hopper compiles them. A tensor of a few dozen elements gives a noisy estimate of the relative error (one bf16
    rounding alone is 2.3e-3 rms), so the error is taken over eight fresh draws together."""
    test_triton_backend_bf16_full_shape(backend, shape, seeds=range(8))


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("fla") is None or not torch.cuda.is_available(),
                    reason="compares with flash-linear-attention on a CUDA GPU")
def test_triton_backend_bf16_dA_no_worse_than_fla(monkeypatch):
    """∂A = Σ over (batch, time) of dt · ∂g, where ∂g = reverse cumsum of q⊙dq − k⊙dk: terms of mixed
    sign that cancel, so the bf16 rounding of the decomposition's tensor-core operands (h, dh, q⊙e^b)
    shows there most. Measured on the H100 (without h0): ours 6.0e-3, fla's chunk_simple_gla 7.1e-3 on
    these inputs, both over the 5e-3 bf16 bound while every other gradient is within 3.4e-3. The bound is
    therefore the peer's own error on the same inputs: the same decomposition must not lose more."""
    import fla.ops.common.chunk_o as fla_chunk_o

    # fla refuses its backward on Hopper with Triton < 3.7.1 (GPU.md); lifted for this comparison only
    monkeypatch.setattr(fla_chunk_o, "TRITON_ABOVE_3_7_1", True)
    ours, peer = bf16_full_shape_errors("chunk")["A"], bf16_full_shape_errors("fla")["A"]
    assert ours <= max(5e-3, peer), (ours, peer)


@pytest.mark.skipif(importlib.util.find_spec("fla") is None or not torch.cuda.is_available(),
                    reason="needs flash-linear-attention and a CUDA GPU")
def test_naive_matches_fla_simple_gla_reference():
    """fla's scalar-decay GLA reference computes SSD with q = C, k = B, v = dt·x, g = dt·A, scale 1."""
    from fla.ops.simple_gla.naive import naive_recurrent_simple_gla

    x, dt, A, Bm, Cm, h0 = (t.float().cuda() for t in make_inputs(2, 100, 4, 8, 1, 16, "realistic"))
    H = x.shape[2]
    ref, s_ref = naive_recurrent_simple_gla(Cm.expand(-1, -1, H, -1), Bm.expand(-1, -1, H, -1), x * dt[..., None],
                                            dt * A, scale=1.0, initial_state=h0, output_final_state=True)
    out, s = ssd(x, dt, A, Bm, Cm, initial_state=h0, output_final_state=True)
    assert rel_err(out, ref) < 1e-5 and rel_err(s, s_ref) < 1e-5
