"""Decay gradients (GLA ∂gk, SSD ∂A, Gated DeltaNet ∂g) of every Triton backend at per-step log-decays from 0 to
−50, against the fp64 step recurrence, each held relative to its own norm: the 1e-5 bound, no allowance.

The tests in test_gla.py, test_ssd.py and test_gated_delta.py hold every gradient relative to the largest one
(tests/helpers.grads_close), so a decay gradient of e^−20 next to ∂q ~ 1 passes whatever it holds. Here each
head runs one decay regime and its decay gradient is measured on its own. The oracle is the recurrence, not the
chunkwise naive backend: that one forms ∂g through b_i − b_j, whose diagonal pairs cancel even in fp64 at −50
per step (e^−50 is below fp64's 2⁻⁵³), where it returns 0.

What the bound tests, in two parts. How the gradient is formed: the pairs without decay (a step with itself; the
chunk's last key with the state it leaves, through the final state's gradient) must never enter it, since at strong
decay they dwarf the true ∂g and would cancel to their rounding. And the exponents: b = Σ g is held in fp32, so
b_t − b_s carries ulp(|b|) of rounding, up to 2e-4 relative at |b| ~ 3000 (C = 64 at −50 per step), and a decay
gradient made of near pairs only, as at strong decay, has that relative error unless the backward adds the residual
of b's rounding to every exponent (ops/chunkwise/cumsum.py); the decays are drawn off any grid, so b's rounding is
real. The forward is exact too where the next chunk or the backward reads what it forms: the chunkwise operator's
state pass (GLA, SSD) reads its exponents b_L − b summed by themselves (cumsum.chunk_cumsum_gap), and Gated
DeltaNet's Tm, state and A add the residual. Without that a MIXED chunk ending in weak steps put up to 1e-5 of error
into the next chunk's ∂g (ops/chunkwise/decay_attention.py). The MIXED head puts −1 next to −50 at
random steps (test_ssd_dA says why not for SSD's ∂A); ∂g_u = Σ_{t≥u} db_t within the chunk, whose reverse cumsum
must be a scan of its own (test_reverse_cumsum_keeps_small_suffixes).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ops import get_op
from tests.helpers import backends_under_test, dA_terms

# per head: the per-step log-decay (each ±10 %; 0: uniform in [−1e-6, 0); MIXED: −1 or −50 at random per step)
MIXED = None
DECAYS = (0.0, -1.0, -5.0, -20.0, -50.0, MIXED)
H = len(DECAYS)
SSD_DECAYS = DECAYS[:-1]                # MIXED: see test_ssd_dA
C = 64                                  # the default chunk: four 16-row sub-blocks, |b| up to 3500 at −50
T = 72                                  # a chunk and a ragged one
TOL = 1e-5


def head_decays(B: int, T: int, K: int, gen: torch.Generator, regimes=DECAYS) -> torch.Tensor:
    """[B, T, len(regimes), K] fp64 log-decays, head h in regime regimes[h] (module docstring)."""
    u = torch.rand(B, T, len(regimes), K, generator=gen, dtype=torch.float64)
    mixed = torch.where(torch.rand(u.shape, generator=gen, dtype=torch.float64) < 0.5, -1.0, -50.0)
    c = torch.stack([mixed[:, :, h] if d is MIXED else torch.full_like(u[:, :, h], d)
                     for h, d in enumerate(regimes)], dim=2)
    return torch.where(c == 0, -1e-6 * u, c * (0.9 + 0.2 * u))


def assert_per_head(got: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor, what: str, regimes=DECAYS):
    """‖got − ref‖ / ‖scale‖ ≤ TOL per head (dim 2, or 0 for a per-head parameter)."""
    dim = 0 if got.dim() == 1 else 2
    errs = [((got - ref).double().select(dim, h).norm() / scale.double().select(dim, h).norm()).item()
            for h in range(got.shape[dim])]
    bad = {f"head {h} ({'mixed' if c is MIXED else c}/step)": f"{e:.2e}"
           for h, (e, c) in enumerate(zip(errs, regimes)) if not e <= TOL}
    assert not bad, f"{what} above {TOL:.0e}: {bad}"


def grads(ref_fn, op, inputs: list[torch.Tensor], gen: torch.Generator, device: str):
    """The gradients of ⟨o, do⟩ + ⟨final state, ds⟩ (random do, ds) for every input: op's on fp32 `inputs` on
    device, and ref_fn's on the same values in fp64. Returns op's, ref_fn's (both on the CPU), do, ds."""
    ref = [x.double().requires_grad_() for x in inputs]
    got = [x.to(device).requires_grad_() for x in inputs]
    o1, s1 = ref_fn(*ref)
    o2, s2 = op(*got)
    do, ds = (torch.randn(x.shape, generator=gen, dtype=torch.float64) for x in (o1, s1))
    ((o1 * do).sum() + (s1 * ds).sum()).backward()
    ((o2 * do.float().to(device)).sum() + (s2 * ds.float().to(device)).sum()).backward()
    return [x.grad.cpu() for x in got], [x.grad for x in ref], do, ds


@pytest.mark.parametrize("backend", backends_under_test("gla"))
def test_gla_dgk(backend, device, poison_empty):
    """Per-key-dim decays, so one head holds every regime: key dims 2r and 2r + 1 run DECAYS[r] (∂gk of a key
    dim sums only that dim's pairs). A scalar decay runs the stages test_ssd_dA checks (`fused` expands it to
    per-key decays, the kernels here)."""
    from ops.gla.naive import gla_recurrent

    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    B, K, V = 1, 2 * H, 4
    q, k = (torch.randn(B, T, 1, K, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, 1, V, generator=gen, dtype=torch.float64)
    gk = head_decays(B, T, 2, gen).flatten(2).unsqueeze(2)                          # [B, T, 1, K]
    h0 = torch.randn(B, 1, K, V, generator=gen, dtype=torch.float64)
    inputs = [x.float() for x in (q, k, v, gk, h0)]
    got, ref, _, _ = grads(lambda *x: gla_recurrent(*x[:4], initial_state=x[4], output_final_state=True),
                           lambda *x: get_op("gla", backend)(*x[:4], initial_state=x[4], output_final_state=True,
                                                             chunk_size=C), inputs, gen, device)
    per_regime = lambda x: x[:, :, 0].unflatten(-1, (H, 2))                         # noqa: E731  [B, T, H, 2]
    assert_per_head(per_regime(got[3]), per_regime(ref[3]), per_regime(ref[3]), f"dgk (seed {seed})")


@pytest.mark.parametrize("backend", backends_under_test("ssd"))
def test_ssd_dA(backend, device, poison_empty):
    """∂A_h = Σ_{b,t} dt ∂g: held relative to Σ |dt ∂g| (the terms it sums, which may cancel), ∂g from the GLA
    recurrence in fp64 with q = C, k = B, v = dt·x. Not at MIXED decays: there ∂g_u of a strong step sums, besides
    its own pairs, the pairs of the weak steps after it, which cancel (they span no strong step) and leave fp32's
    rounding of them, ~1e-7 of the weak steps' ∂g. Harmless to ∂g (test_gla_dgk, test_gated_delta_dg), but ∂A
    weighs each step by its dt, 50 times larger at the strong steps: up to 4e-5 of ∂A's terms."""
    from ops.ssd.naive import ssd_recurrent

    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    B, H, P, N = 1, len(SSD_DECAYS), 4, 8
    x = torch.randn(B, T, H, P, generator=gen, dtype=torch.float64)
    A = -(2.0 ** torch.randint(0, 4, (H,), generator=gen)).double()     # powers of two: dt · A exact in fp32
    dt = head_decays(B, T, 1, gen, SSD_DECAYS)[..., 0] / A
    Bm, Cm = (torch.randn(B, T, 1, N, generator=gen, dtype=torch.float64) for _ in range(2))
    h0 = torch.randn(B, H, N, P, generator=gen, dtype=torch.float64)
    inputs = [t.float() for t in (x, dt, A, Bm, Cm, h0)]
    got, ref, dy, ds = grads(lambda *a: ssd_recurrent(*a[:5], initial_state=a[5], output_final_state=True),
                             lambda *a: get_op("ssd", backend)(*a[:5], initial_state=a[5], output_final_state=True,
                                                               chunk_size=C), inputs, gen, device)
    x, dt, A, Bm, Cm, h0 = (t.double() for t in inputs)
    terms = dA_terms(x, dt, A, Bm, Cm, h0, dy, ds)                                     # [H]
    assert_per_head(got[2], ref[2], terms, f"dA (seed {seed})", SSD_DECAYS)


@pytest.mark.parametrize("backend", backends_under_test("gated_delta"))
def test_gated_delta_dg(backend, device, poison_empty):
    from ops.gated_delta.naive import gated_delta_recurrent

    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    B, K, V = 1, 8, 4
    q = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    g = head_decays(B, T, 1, gen)[..., 0]
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    h0 = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)
    inputs = [t.float() for t in (q, k, v, g, beta, h0)]
    got, ref, _, _ = grads(lambda *a: gated_delta_recurrent(*a[:5], initial_state=a[5], output_final_state=True),
                           lambda *a: get_op("gated_delta", backend)(*a[:5], initial_state=a[5],
                                                                     output_final_state=True, chunk_size=C),
                           inputs, gen, device)
    assert_per_head(got[3], ref[3], ref[3], f"dg (seed {seed})")


def test_reverse_cumsum_keeps_small_suffixes(device, poison_empty):
    """∂g_u = Σ_{t≥u} db_t: after a large db (a weak decay) the suffix sums are far smaller, and each must keep
    its own relative precision. A chunk total minus the forward cumsum leaves ulp(total) in every row there."""
    from ops.chunkwise.cumsum import chunk_cumsum

    x = torch.rand(2, 2 * C + 5, 3, 4, dtype=torch.float64) * 1e-6
    x[:, 3::C] = 1.0                                                    # row 3 of every chunk
    got = chunk_cumsum(x.float().to(device), C, reverse=True).double().cpu()
    ref = F.pad(x.float().double(), (0, 0, 0, 0, 0, -x.shape[1] % C)).unflatten(1, (-1, C)).flip(2).cumsum(2).flip(2)
    ref = ref.flatten(1, 2)[:, :x.shape[1]]
    assert ((got - ref).abs() <= 1e-5 * ref.abs()).all()


def test_residual_completes_b(device, poison_empty):
    """b + r is the chunk-local cumsum of g to fp32's precision of r, where b alone is off by ulp(|b|): at −50 per
    step, with one step of −1000 (the largest the exact part of r allows at C = 64) and T ragged."""
    from ops.chunkwise.cumsum import chunk_cumsum, chunk_residual

    g = -55 * torch.rand(2, 2 * C + 5, 3, 4, dtype=torch.float64)
    g[:, 7] = -1000.0 * torch.rand(3, 4)
    g = g.float().double()                                              # what the kernels see
    exact = F.pad(g, (0, 0, 0, 0, 0, -g.shape[1] % C)).unflatten(1, (-1, C)).cumsum(2).flatten(1, 2)[:, :g.shape[1]]
    b = chunk_cumsum(g.float().to(device), C)
    r = chunk_residual(g.float().to(device), b, C)
    assert ((b.double().cpu() - exact).abs() > 1e-5).any()             # b alone: ulp(|b|) ~ 2e-4
    assert ((b.double() + r.double()).cpu() - exact).abs().max() <= 1e-6
