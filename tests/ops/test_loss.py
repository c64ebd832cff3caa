"""ops/loss/linear_cross_entropy.py's chunked head + cross-entropy against PyTorch's F.linear + F.cross_entropy: the
loss and the gradients of x and the head weight, over several ragged chunks, with ignored targets, without grad, and
through the model (CausalLM with return_logits=False, as train.py calls it)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from ops.loss.linear_cross_entropy import IGNORE_INDEX, linear_cross_entropy
from tests.helpers import rel_err

pytestmark = pytest.mark.usefixtures("exact_fp32_matmuls")


def reference(x, w, t):
    return F.cross_entropy(F.linear(x, w).float().flatten(0, 1), t.flatten())


@pytest.mark.parametrize("chunk", [7, 16, 1000])                      # ragged, exact, one chunk
@pytest.mark.parametrize("ignore", [False, True])
@pytest.mark.parametrize("vocab", [101, 128])                          # padded to 128 inside, and not padded
def test_matches_pytorch_fp32(chunk, ignore, vocab):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 24, 32, generator=g, requires_grad=True)
    w = (torch.randn(vocab, 32, generator=g) / 4).requires_grad_()
    t = torch.randint(0, vocab, (2, 24), generator=g)
    if ignore:
        t[0, :5] = IGNORE_INDEX
        t[1, -3:] = IGNORE_INDEX
    ref = reference(x, w, t)
    ref_g = torch.autograd.grad(3.0 * ref, (x, w))                     # a non-unit incoming gradient
    got = linear_cross_entropy(x, w, t, chunk=chunk)
    got_g = torch.autograd.grad(3.0 * got, (x, w))
    assert abs(got.item() - ref.item()) < 1e-6 * abs(ref.item())
    for a, b in zip(got_g, ref_g):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert rel_err(a, b) < 1e-6


def test_without_grad_computes_the_loss_only(monkeypatch):
    """Under torch.no_grad() (evaluation), with parameters that require grad as a model's do, no chunk step forms a
    gradient (so no dx, dW or their GEMMs either)."""
    import ops.loss.linear_cross_entropy as loss_mod

    flags = []
    real = loss_mod._ce_rows_torch
    monkeypatch.setattr(loss_mod, "_ce_rows_torch", lambda *a: flags.append(a[-1]) or real(*a))
    x, w = torch.randn(1, 9, 8), torch.randn(13, 8, requires_grad=True)
    t = torch.randint(0, 13, (1, 9))
    with torch.no_grad():
        got = linear_cross_entropy(x, w, t, chunk=4)
    assert flags == [False] * 3
    assert abs(got.item() - reference(x, w, t).item()) < 1e-6 * reference(x, w, t).item()


def test_fp16_keeps_the_whole_logits():
    """fp16: the loss-scaled chain (see linear_cross_entropy), equal to PyTorch's own."""
    x = torch.randn(2, 5, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    t = torch.randint(0, 11, (2, 5))
    with torch.autocast("cpu", dtype=torch.float16):
        got, ref = linear_cross_entropy(x, w, t, chunk=3), reference(x, w, t)
    assert got.item() == ref.item()


def test_bf16_autocast_matches_pytorchs_rounding():
    """Under bf16 autocast (CPU here) the chunked loss rounds where PyTorch's chain does: the loss within bf16 noise,
    the gradients within a few bf16 ulps of the chain's."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 64, 48, generator=g, requires_grad=True)
    w = (torch.randn(300, 48, generator=g) / 7).requires_grad_()
    t = torch.randint(0, 300, (4, 64), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = reference(x, w, t)
        got = linear_cross_entropy(x, w, t, chunk=50)
    ref_g, got_g = torch.autograd.grad(ref, (x, w)), torch.autograd.grad(got, (x, w))
    assert abs(got.item() - ref.item()) < 1e-4 * ref.item()
    assert all(a.dtype == torch.float32 and rel_err(a, b) < 2e-2 for a, b in zip(got_g, ref_g))


@pytest.mark.parametrize("tie", [True, False])
def test_model_loss_without_logits_equals_with(tie):
    """CausalLM(idx, targets, return_logits=False): no logits, the same loss and every parameter's gradient."""
    from model import build_model
    from model.config import ModelConfig

    cfg = ModelConfig(family="gla", vocab_size=61, n_layers=1, d_model=32, n_heads=2, head_k_dim=8, head_v_dim=8,
                      gate_low_rank=4, mlp_hidden=32)
    cfg = dataclasses.replace(cfg, tie_embeddings=tie)
    torch.manual_seed(0)
    model = build_model(cfg)
    idx = torch.randint(0, 61, (2, 17))
    logits, ref = model(idx[:, :-1], idx[:, 1:])
    ref_g = torch.autograd.grad(ref, list(model.parameters()))
    none, got = model(idx[:, :-1], idx[:, 1:], return_logits=False)
    got_g = torch.autograd.grad(got, list(model.parameters()))
    assert none is None and logits is not None
    assert abs(got.item() - ref.item()) < 1e-6 * ref.item()
    bad = {n: rel_err(a, b) for (n, _), a, b in zip(model.named_parameters(), got_g, ref_g) if rel_err(a, b) >= 1e-5}
    assert not bad, bad


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton chunk step runs on a CUDA GPU")
def test_bf16_gpu_at_gpt2_vocab():
    """On the GPU (the Triton chunk step) at the GPT-2 vocabulary, bf16 autocast, two ragged chunks: the loss within
    1e-4 and both gradients within twice PyTorch's own bf16 error against fp32, plus 1e-3."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(3, 1500, 256, device="cuda", generator=g, requires_grad=True)
    w = (torch.randn(50257, 256, device="cuda", generator=g) / 16).requires_grad_()
    t = torch.randint(0, 50257, (3, 1500), device="cuda", generator=g)
    ref = reference(x, w, t)
    ref_g = torch.autograd.grad(ref, (x, w))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        pt = reference(x, w, t)
        got = linear_cross_entropy(x, w, t, chunk=4000)
    pt_g, got_g = torch.autograd.grad(pt, (x, w)), torch.autograd.grad(got, (x, w))
    assert abs(got.item() - ref.item()) < 1e-4 * ref.item()
    for a, b, r in zip(got_g, pt_g, ref_g):
        assert rel_err(a, r) <= 2 * rel_err(b, r) + 1e-3, (rel_err(a, r), rel_err(b, r))
