"""Each Triton stage of the chunk backend (ops/chunkwise/) against the `_ref` beside it, forward and backward.

fp32 (no TF32) everywhere: within 1e-6 of the reference. bf16 on the GPU as well, where Triton takes
another code path (tensor-core dots; the H100 miscompiled one of these stages only in bf16): each
product there has one operand rounded to bf16 inside the kernel (q ⊙ exp(b), h, A), 2⁻⁸ relative,
so 1e-2 holds any correct kernel and a wrong one lands near 1.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ops.chunkwise.state import chunk_bwd_dh, chunk_bwd_dh_ref, chunk_fwd_h, chunk_fwd_h_ref
from ops.chunkwise.intra import chunk_intra_bwd, chunk_intra_bwd_ref, chunk_intra_fwd, chunk_intra_fwd_ref
from ops.chunkwise.output import (chunk_bwd_dA, chunk_bwd_dA_ref, chunk_bwd_dqkb, chunk_bwd_dqkb_ref, chunk_bwd_dv,
                                chunk_bwd_dv_ref, chunk_fwd_o, chunk_fwd_o_ref, chunk_fwd_o_scalar)
from ops.chunkwise.cumsum import chunk_cumsum, chunk_cumsum_gap, chunk_cumsum_ref
from ops.chunkwise.decay_attention import chunk_decay_attention, expand_heads
from tests.helpers import rel_err

# B, T, H, K, V, C: ragged T, T < C, several K tiles (K = 140) and V tiles (V = 140)
CASES = [(2, 50, 2, 8, 6, 16), (1, 70, 1, 20, 140, 64), (1, 5, 1, 4, 4, 32), (1, 40, 1, 140, 12, 16)]
# on the GPU, also the shapes where bf16 went wrong (four or more V tiles) and the kernel benchmark's layer shape
GPU_CASES = [(2, 256, 2, 64, 256, 64), (2, 256, 2, 256, 512, 64), (2, 1000, 3, 60, 100, 64), (1, 300, 2, 128, 64, 128)]


def cases():
    out = [pytest.param(c, torch.float32, id=f"{c}-fp32") for c in CASES]
    if torch.cuda.is_available():
        out += [pytest.param(c, dt, id=f"{c}-{str(dt)[6:]}") for c in CASES + GPU_CASES
                for dt in (torch.float32, torch.bfloat16) if (c, dt) not in [(c2, torch.float32) for c2 in CASES]]
    return out


def stage_inputs(B, T, H, K, V, C, dtype, scalar, device):
    g = -torch.rand(B, T, H, 1 if scalar else K, device=device) * 3 / (1 if scalar else 8)
    q, k = (torch.randn(B, T, H, K, device=device).to(dtype) for _ in range(2))
    v, do = (torch.randn(B, T, H, V, device=device).to(dtype) for _ in range(2))
    h0, dht = (torch.randn(B, H, K, V, device=device) for _ in range(2))
    return g, q, k, v, do, h0, dht


@pytest.mark.parametrize("case,dtype", cases())
@pytest.mark.parametrize("scalar", [False, True], ids=["gk", "scalar"])
def test_stages_match_refs(case, dtype, scalar, device, poison_empty):
    B, T, H, K, V, C = case
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    g, q, k, v, do, h0, dht = stage_inputs(B, T, H, K, V, C, dtype, scalar, device)
    scale = K ** -0.5
    for reverse in (False, True):
        assert rel_err(chunk_cumsum(g, C, reverse), chunk_cumsum_ref(g, C, reverse)) < 1e-6
    b = chunk_cumsum(g, C)
    h, ht = chunk_fwd_h(k, v, b, h0, True, C)
    h_ref, ht_ref = chunk_fwd_h_ref(k, v, b, h0, C)
    assert h.dtype == dtype and rel_err(h, h_ref) < tol and rel_err(ht, ht_ref) < tol, "h"
    if scalar:                                          # A formed inside the output kernel, once per V tile
        o2, A = chunk_fwd_o_scalar(q, k, v, b, h, scale, C)
        assert rel_err(o2, chunk_fwd_o_ref(q, v, b, h, A, scale, C)) < tol, "o (inline A)"
        with pytest.raises(ValueError, match="per-key-dim decay"):
            chunk_intra_fwd(q, k, b, scale, C)
    else:
        A = chunk_intra_fwd(q, k, b, scale, C)
    assert rel_err(A, chunk_intra_fwd_ref(q, k, b, scale, C)) < tol, "A"
    assert rel_err(chunk_fwd_o(q, v, b, h, A, scale, C), chunk_fwd_o_ref(q, v, b, h, A, scale, C)) < tol, "o"
    dh, dh0 = chunk_bwd_dh(q, do, b, dht, True, scale, C)
    dh_ref, dh0_ref = chunk_bwd_dh_ref(q, do, b, dht, scale, C)
    assert rel_err(dh, dh_ref) < tol and rel_err(dh0, dh0_ref) < tol, "dh"
    dA = chunk_bwd_dA(do, v, C)
    assert rel_err(dA, chunk_bwd_dA_ref(do, v, C)) < tol, "dA"
    assert rel_err(chunk_bwd_dv(k, b, A, do, dh, C), chunk_bwd_dv_ref(k, b, A, do, dh, C)) < tol, "dv"
    res = torch.zeros_like(b)                           # b taken as exact: its residual is 0
    dqi_ref, dki_ref = chunk_intra_bwd_ref(q, k, b, dA, scale, C)
    if scalar:                                          # formed inside chunk_bwd_dqkb (below), never by this stage
        dqi, dki = dqi_ref, dki_ref
        with pytest.raises(ValueError, match="per-key-dim decay"):
            chunk_intra_bwd(q, k, b, res, dA, scale, C)
    else:
        dqi, dki = chunk_intra_bwd(q, k, b, res, dA, scale, C)
        assert rel_err(dqi, dqi_ref) < tol and rel_err(dki, dki_ref) < tol, "intra dq, dk"
    got = chunk_bwd_dqkb(q, k, v, b, res, h, dh, do, dA, dqi, dki, scale, C)
    ref = chunk_bwd_dqkb_ref(q, k, v, b, h, dh, do, dqi, dki, scale, C)
    for name, x, y in zip(("dq", "dk", "db"), got, ref):
        assert rel_err(x, y) < tol, name
    if scalar:                                          # the intra-chunk parts formed inside, from dA
        got = chunk_bwd_dqkb(q, k, v, b, res, h, dh, do, dA, None, None, scale, C)
        for name, x, y in zip(("dq", "dk", "db"), got, ref):
            assert rel_err(x, y) < tol, f"{name} (intra inside)"


@pytest.mark.parametrize("B,T,G,H,D", [(2, 7, 1, 4, 12), (1, 33, 2, 6, 16), (1, 5, 3, 9, 8)])
def test_expand_heads_copies_each_group_to_its_heads(B, T, G, H, D, device):
    """expand_heads' kernel against repeat_interleave: ragged rows, D not a power of two, 1-3 groups, and G = H
    (no copy). The input is a strided slice, as Mamba-2's B and C are."""
    x = torch.randn(B, T, G, 2 * D, device=device)[..., :D]
    y = expand_heads(x, H)
    assert y.is_contiguous() and torch.equal(y, x.repeat_interleave(H // G, dim=2))
    assert expand_heads(x, G) is x


@pytest.mark.parametrize("scalar", [False, True], ids=["gk", "scalar"])
@pytest.mark.parametrize("split", [False, True], ids=["sequential", "split"])
def test_grouped_q_k_are_read_in_place(scalar, split, device):
    """q and k shared by groups of heads (Mamba-2's C and B) are read by the kernels where they lie, not copied to
    every head: the output, the final state and every gradient equal, bit for bit, those of the same call on q and k
    repeated to every head (each head's kernels compute the same values; dq and dk are summed over a group's heads
    in both). A kernel reading another head's or group's rows, or striding by the wrong head count, differs at
    once. Ragged T, two groups of two heads."""
    B, T, G, H, K, V, C = 1, 37, 2, 4, 8, 5, 16
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    q, k = (torch.randn(B, T, G, K, generator=gen) for _ in range(2))
    v, h0 = torch.randn(B, T, H, V, generator=gen), torch.randn(B, H, K, V, generator=gen)
    g = -torch.rand(B, T, H, 1 if scalar else K, generator=gen) * 2
    leaves = [x.to(device).requires_grad_() for x in (q, k, v, g, h0)]

    def run(expand: bool) -> list[torch.Tensor]:
        q, k, v, g, h0 = leaves
        if expand:
            q, k = q.repeat_interleave(H // G, 2), k.repeat_interleave(H // G, 2)
        o, ht = chunk_decay_attention(q, k, v, g, K ** -0.5, h0, True, C, split_state=split)
        return [o, ht, *torch.autograd.grad((o * o).sum() + (ht * ht).sum(), leaves)]

    for a, b in zip(run(False), run(True)):
        assert torch.equal(a, b), (a - b).abs().max().item()


@pytest.mark.parametrize("scalar", [False, True], ids=["gk", "scalar"])
def test_state_pass_reads_exact_gaps(scalar, device):
    """A chunk of strong steps (−500) closed by eight weak ones (−0.2): |b| ~ 3e4 at its end, where b alone is off
    by up to ulp(|b|) ~ 2e-3, and the state leaving the chunk is mostly those rows. With the gaps b_L − b summed by
    themselves the state pass matches the fp64 recurrence at the exact cumsum of g; formed from b, it does not
    (≥ 2e-4 over 20 seeds: the bound can fail). The ragged last chunk is weak (−0.1 a step)."""
    B, T, H, K, V, C = 1, 70, 2, 8, 4, 64
    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    g = -500 * (0.9 + 0.2 * torch.rand(B, T, H, 1 if scalar else K, generator=gen, dtype=torch.float64))
    g[:, C - 8:C] /= 2500
    g[:, C:] /= 5000
    k, v, h0 = (torch.randn(*shape, generator=gen) for shape in ((B, T, H, K), (B, T, H, V), (B, H, K, V)))
    k, v, h0, g = (x.to(device) for x in (k, v, h0, g.float()))
    b, gap = chunk_cumsum_gap(g, C)
    exact = F.pad(g.double(), (0, 0, 0, 0, 0, -T % C)).unflatten(1, (-1, C)).cumsum(2).flatten(1, 2)[:, :T]
    h_ref, ht_ref = chunk_fwd_h_ref(k.double(), v.double(), exact, h0.double(), C)
    h, ht = chunk_fwd_h(k, v, b, h0, True, C, gap=gap)
    assert rel_err(h, h_ref) < 1e-6 and rel_err(ht, ht_ref) < 1e-6, f"seed {seed}"
    assert rel_err(chunk_fwd_h(k, v, b, h0, True, C)[0][:, 1], h_ref[:, 1]) > 2e-5, f"from b (seed {seed})"


@pytest.mark.parametrize("T,S,C", [(70, 8, 64), (33, 5, 16), (16, 1, 16), (5, 3, 8)])
def test_cumsum_gaps_are_exact_to_their_own_size(T, S, C, device, poison_empty):
    """chunk_cumsum_gap: b as chunk_cumsum gives it, and each gap Σ_{t<u≤L} g_u within 32 ulps of its own size
    against fp64, at mixed decays (−50 or −1e-4 a step, so gaps of 1e-4 follow rows with |b| ~ 10³), ragged T,
    S not a power of two; every row written (poison_empty: a row left out is NaN)."""
    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    g = torch.where(torch.rand(2, T, 3, S, generator=gen) < 0.5, -50.0, -1e-4).to(device)
    b, gap = chunk_cumsum_gap(g, C)
    assert torch.equal(b, chunk_cumsum(g, C)), f"seed {seed}"
    total = F.pad(g.double(), (0, 0, 0, 0, 0, -T % C)).unflatten(1, (-1, C))
    ref = (total.flip(2).cumsum(2).flip(2) - total).flatten(1, 2)[:, :T]                # Σ_{u>t} in fp64
    err = (gap.double() - ref).abs()
    assert bool((err <= 32 * 6e-8 * ref.abs() + 1e-12).all()), f"seed {seed}: {err.max().item()}"
