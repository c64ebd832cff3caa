"""ops/loss/cross_entropy.py's per-row kernel (the chunk step of ops/loss/linear_cross_entropy.py) against PyTorch:
the loss terms and the gradient it writes over the logits, fp32 and bf16, with ignored targets, at vocab sizes that
are not multiples of the block (interpreter: 32 columns), and without grad (z left alone)."""
from __future__ import annotations

import pytest
import torch

from ops.loss.cross_entropy import ce_rows
from tests.helpers import rel_err


def reference(z, t, inv):
    zf = z.detach().float().requires_grad_()
    terms = torch.nn.functional.cross_entropy(zf, t, reduction="none")            # 0 where ignored
    grad, = torch.autograd.grad(terms.sum() * inv, zf)
    return terms, grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [61, 96, 7])
def test_matches_pytorch(V, dtype, device):
    g = torch.Generator().manual_seed(V)
    z = (3 * torch.randn(9, V, generator=g)).to(device, dtype)
    t = torch.randint(0, V, (9,), generator=g).to(device)
    t[[2, 7]] = -100
    inv = torch.tensor([1 / 7], device=device)
    ref_terms, ref_grad = reference(z, t, inv.item())
    loss = ce_rows(z, t, inv, grad=True)
    tol = 1e-6 if dtype == torch.float32 else 8e-3                                   # z itself holds bf16 grads
    assert rel_err(loss, ref_terms) < 1e-6
    assert rel_err(z.float(), ref_grad) < tol
    assert (z[[2, 7]] == 0).all()


def test_without_grad_leaves_z(device):
    z = torch.randn(4, 50, device=device)
    t = torch.tensor([0, 49, -100, 3], device=device)
    before = z.clone()
    loss = ce_rows(z, t, torch.ones(1, device=device), grad=False)
    assert torch.equal(z, before)
    assert rel_err(loss, reference(before, t, 1.0)[0]) < 1e-6


def test_extreme_logits_stay_finite(device):
    """A row whose logits span 1e4 (softmax underflows to exact zeros) and one of -1e4 everywhere."""
    z = torch.zeros(2, 70, device=device)
    z[0, 5], z[1] = 1e4, -1e4
    t = torch.tensor([5, 69], device=device)
    loss = ce_rows(z, t, torch.ones(1, device=device), grad=True)
    assert torch.isfinite(loss).all() and torch.isfinite(z).all()
    # fp32 spacing at 1e4 is 1e-3: lse − z_t = log 70 can come out only that exactly
    assert loss[0].item() == 0.0 and abs(loss[1].item() - torch.log(torch.tensor(70.0)).item()) < 2e-3


def test_leading_minus_inf_block_and_strided_targets(device):
    """A row whose first block of logits is all −inf (the running max must not make exp(−inf − −inf) = NaN), and
    targets that arrive as a strided view (the kernel reads them by row)."""
    z = torch.randn(2, 80, device=device)
    z[0, :40] = float("-inf")
    t = torch.tensor([[50, 0, 3, 0]], device=device)[:, ::2].reshape(-1)                 # stride 2
    ref_terms, ref_grad = reference(z, t, 1.0)
    loss = ce_rows(z, t, torch.ones(1, device=device), grad=True)
    assert torch.isfinite(loss).all() and rel_err(loss, ref_terms) < 1e-6
    assert rel_err(z, ref_grad) < 1e-6


@pytest.mark.parametrize("V, W", [(61, 64), (77, 80), (7, 96)])
def test_padding_columns_are_left_out(V, W, device):
    """z wider than the vocabulary (the caller's padded head): columns V..W−1 hold large garbage, which must not
    enter the softmax, and their gradient must come out 0."""
    g = torch.Generator().manual_seed(W)
    z = (3 * torch.randn(6, W, generator=g)).to(device, torch.bfloat16)
    z[:, V:] = 1e4
    t = torch.randint(0, V, (6,), generator=g).to(device)
    t[3] = -100
    ref_terms, ref_grad = reference(z[:, :V], t, 1 / 5)
    loss = ce_rows(z, t, torch.tensor([1 / 5], device=device), grad=True, vocab=V)
    assert rel_err(loss, ref_terms) < 1e-6
    assert rel_err(z[:, :V].float(), ref_grad) < 8e-3
    assert (z[:, V:] == 0).all()


def test_vocab_wider_than_z_is_refused(device):
    with pytest.raises(ValueError, match="vocab must be in 1..8"):
        ce_rows(torch.zeros(2, 8, device=device), torch.zeros(2, dtype=torch.long, device=device),
                torch.ones(1, device=device), grad=False, vocab=9)
