"""Each Triton stage of the gated delta rule's chunk backend (ops/gated_delta/wy.py, delta_state.py) against
the fp64 `_ref` beside it, forward and backward, at ragged shapes and strong decays. Outputs of a
stage are compared together by tests/helpers.py's grads_close: under extreme gates some vanish
(dh0 ~ 1e-150, below fp32's range), and are then held to the others' scale."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ops.chunkwise.intra import chunk_intra_fwd_ref
from ops.chunkwise.cumsum import chunk_cumsum, chunk_residual
from ops.chunkwise.output import chunk_fwd_o_scalar
from ops.gated_delta.delta_state import delta_h_bwd, delta_h_bwd_ref, delta_h_fwd, delta_h_fwd_ref
from ops.gated_delta.wy import wy_bwd, wy_bwd_ref, wy_fwd, wy_fwd_ref
from tests.helpers import grads_close, rel_err

# The fp32 bound (1e-5): the WY backward goes through (I + L)⁻¹ twice, and its fp32 rounding,
# times that solve's condition number, reached 2e-6 of the fp64 reference at T = 5 (seen once in ~10 runs).
TOL = 1e-5

CASES = [(2, 50, 2, 8, 6, 16), (1, 70, 1, 20, 12, 64), (1, 5, 1, 4, 4, 32)]   # B, T, H, K, V, C
GATES = {"realistic": (-5.0, 0.0), "extreme": (-1e3, -50.0)}


def make(case, gate, device):
    B, T, H, K, V, C = case
    lo, hi = GATES[gate]
    q = torch.randn(B, T, H, K, device=device)
    k = F.normalize(torch.randn(B, T, H, K, device=device), dim=-1)
    v = torch.randn(B, T, H, V, device=device)
    b = chunk_cumsum((torch.rand(B, T, H, 1, device=device) * (hi - lo) + lo), C)
    beta = torch.rand(B, T, H, device=device)
    return q, k, v, b, beta


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("gate", list(GATES))
def test_wy_fwd_bwd(case, gate, device, poison_empty):
    C = case[-1]
    _, k, v, b, beta = make(case, gate, device)
    Ai, w, u = wy_fwd(k, v, b, torch.zeros_like(b), beta, C)                    # b exact: residual 0
    grads_close([Ai, w, u], wy_fwd_ref(k, v, b, beta, C), "Tm w u".split(), TOL)
    B, T, H, K, V, _ = case
    h = torch.randn(B, -(-T // C), H, K, V, device=device)
    dv_new, dk_in = torch.randn(B, T, H, V, device=device), torch.randn(B, T, H, K, device=device)
    dk, dv, dbeta, db = wy_bwd(k, v, b, torch.zeros_like(b), beta, Ai, h, dv_new, dk_in, C)   # b exact: residual 0
    dk_ref, dv_ref, dbeta_ref, db_ref = wy_bwd_ref(k, v, b, beta, h, dv_new, C)
    # the kernel adds dk_in into dk in fp32, so dk − dk_in carries rounding of dk_in's size: measured against
    # ‖dk_ref‖ alone that failed 1 in 300 seeds at T = 5 (1.25e-5). The scale is the sum's terms.
    grads_close([dk - dk_in, dv, dbeta, db], [dk_ref, dv_ref, dbeta_ref, db_ref], "k v beta b".split(), TOL,
                magnitudes=[dk_ref.abs() + dk_in.abs(), dv_ref, dbeta_ref, db_ref])


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("gate", list(GATES))
def test_delta_h_fwd_bwd(case, gate, device, poison_empty):
    B, T, H, K, V, C = case
    q, k, v, b, beta = make(case, gate, device)
    _, w, u = (x.float().contiguous() for x in wy_fwd_ref(k, v, b, beta, C))
    h0 = torch.randn(B, H, K, V, device=device)
    h, v_new, ht = delta_h_fwd(k, w, u, b, torch.zeros_like(b), h0, True, C)
    grads_close([h, v_new, ht], delta_h_fwd_ref(k, w, u, b, h0, C), "h v_new ht".split(), TOL)
    A = chunk_intra_fwd_ref(q, k, b, 0.5, C).contiguous()                    # the launchers take contiguous inputs
    do, dht = torch.randn(B, T, H, V, device=device), torch.randn(B, H, K, V, device=device)
    dh, dv_new, dh0 = delta_h_bwd(q, k, w, b, torch.zeros_like(b), A, do, dht, True, 0.5, C)   # b exact: residual 0
    grads_close([dh, dv_new, dh0], delta_h_bwd_ref(q, k, w, b, A, do, dht, 0.5, C), "dh dv_new dh0".split(), TOL)


def test_forward_stages_add_b_residual(device, poison_empty):
    """A chunk of strong steps (−500) ending in eight weak ones (−0.2): |b| ~ 3e4 at its end, where b alone is off
    by up to ulp(|b|) ~ 2e-3 and the last rows' exponents near 0 with it, relative. The state leaving the chunk is
    mostly those rows. wy_fwd, delta_h_fwd and the output's inline A add b's residual r and match the fp64
    references at the exact cumsum b + r; with r = 0 the state leaving the chunk does not (≥ 1.5e-4 over 106
    seeds: the bound can fail)."""
    B, T, H, K, V, C = 1, 70, 2, 8, 4, 64
    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(B, T, H, 1, generator=gen, dtype=torch.float64)
    g = -500 * (0.9 + 0.2 * u)
    g[:, C - 8:C] /= 2500                                                     # the weak steps closing chunk 0
    q, k = torch.randn(B, T, H, K, generator=gen), F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v, beta = torch.randn(B, T, H, V, generator=gen), torch.rand(B, T, H, generator=gen)
    h0 = torch.randn(B, H, K, V, generator=gen)
    q, k, v, beta, h0, g = (x.to(device) for x in (q, k, v, beta, h0, g.float()))
    b = chunk_cumsum(g, C)
    res = chunk_residual(g, b, C)
    exact = b.double() + res.double()
    assert (b.double() - exact).abs().max() > 1e-5                               # b's rounding is real here
    Tm_ref, w_ref, u_ref = (x.float().contiguous() for x in wy_fwd_ref(k, v, exact, beta, C))
    Ai, w, u = wy_fwd(k, v, b, res, beta, C)
    grads_close([Ai, w, u], [Tm_ref, w_ref, u_ref], [f"{n} (seed {seed})" for n in ("Tm", "w", "u")], TOL)
    h_ref, vn_ref, ht_ref = delta_h_fwd_ref(k, w_ref, u_ref, exact, h0, C)
    h, v_new, ht = delta_h_fwd(k, w_ref, u_ref, b, res, h0, True, C)
    grads_close([h, v_new, ht], [h_ref, vn_ref, ht_ref], [f"{n} (seed {seed})" for n in ("h", "v_new", "ht")], TOL)
    h_without, _, _ = delta_h_fwd(k, w_ref, u_ref, b, torch.zeros_like(res), h0, True, C)
    assert rel_err(h_without[:, 1], h_ref[:, 1]) > 2 * TOL, f"without r, chunk 0's state should be off (seed {seed})"
    _, A = chunk_fwd_o_scalar(q, k, v_new, b, h, 0.5, C, res)
    A_ref = chunk_intra_fwd_ref(q.double(), k.double(), exact, 0.5, C)                # fp64 at b + r
    assert rel_err(A, A_ref) < TOL, f"A (inline, with r; seed {seed})"
