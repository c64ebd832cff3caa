"""RA+MLA: the reciprocal band against an explicit double loop, α = 0 against latent attention on
SDPA, gradients of every input including α, and gradcheck on a tiny case."""
from __future__ import annotations

import math

import pytest
import torch

from ops.ramla.naive import mla_sdpa, ramla
from tests.helpers import rel_err


def make_inputs(B, T, H, D, L, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, D, generator=g, dtype=dtype)
    k_lat, v_lat = (torch.randn(B, T, L, generator=g, dtype=dtype) for _ in range(2))
    w_ql = torch.randn(H, D, L, generator=g, dtype=dtype) / math.sqrt(D)
    w_vu = torch.randn(H, L, D, generator=g, dtype=dtype) / math.sqrt(L)
    return q, k_lat, v_lat, w_ql, w_vu


def double_loop(q, k_lat, v_lat, w_ql, w_vu, alpha, W):
    """Every score written out by hand: s_ij = q_lat,i·K_j/√L (+ α q_lat,j·K_i/√L on the band)."""
    B, T, H, D = q.shape
    L = k_lat.shape[-1]
    out = torch.zeros(B, T, H, D, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            q_lat = [q[b, t, h] @ w_ql[h] for t in range(T)]
            for i in range(T):
                s = []
                for j in range(i + 1):
                    score = q_lat[i] @ k_lat[b, j] / math.sqrt(L)
                    if i - j <= W:
                        score = score + alpha * (q_lat[j] @ k_lat[b, i]) / math.sqrt(L)
                    s.append(score)
                p = torch.stack(s).softmax(0)
                ctx = sum(p[j] * v_lat[b, j] for j in range(i + 1))
                out[b, i, h] = ctx @ w_vu[h]
    return out


@pytest.mark.parametrize("W", [0, 1, 3, 100])
def test_band_matches_double_loop(W):
    inputs = make_inputs(2, 9, 2, 3, 4)
    alpha = torch.tensor(0.7, dtype=torch.float64)
    assert rel_err(ramla(*inputs, alpha, W), double_loop(*inputs, 0.7, W)) < 1e-12


def test_alpha_zero_is_plain_mla():
    inputs = make_inputs(2, 37, 3, 8, 16)
    zero = torch.tensor(0.0, dtype=torch.float64)
    ref = mla_sdpa(*inputs)
    assert rel_err(ramla(*inputs, zero, 5), ref) < 1e-12
    assert rel_err(ramla(*inputs, None, 5), ref) < 1e-12


def test_reciprocal_term_changes_the_output():
    inputs = make_inputs(1, 16, 2, 4, 4)
    a = ramla(*inputs, torch.tensor(0.5, dtype=torch.float64), 4)
    assert rel_err(a, mla_sdpa(*inputs)) > 1e-3


def test_gradients_match_double_loop():
    inputs = [x.requires_grad_() for x in make_inputs(1, 6, 2, 3, 4)]
    alpha = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    ref_inputs = [x.detach().clone().requires_grad_() for x in inputs]
    ref_alpha = alpha.detach().clone().requires_grad_()
    do = torch.randn(1, 6, 2, 3, dtype=torch.float64)
    (ramla(*inputs, alpha, 2) * do).sum().backward()
    (double_loop(*ref_inputs, ref_alpha, 2) * do).sum().backward()
    for x, y in zip(inputs + [alpha], ref_inputs + [ref_alpha]):
        assert rel_err(x.grad, y.grad) < 1e-10


def test_gradcheck_tiny():
    inputs = tuple(x.requires_grad_() for x in make_inputs(1, 5, 2, 2, 3))
    alpha = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: ramla(*a, 2), inputs + (alpha,))
