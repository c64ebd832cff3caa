"""Packed documents through whole models on `naive`: a packed batch (cu_seqlens over the flattened [1, B·T] stream,
documents split at row edges) gives the logits, the loss and every parameter gradient of its documents run one by
one. Tolerance: relative RMS ≤ 1e-5 in fp32 (the same arithmetic, in another order)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from data.sampler import cu_seqlens
from model import build_model
from model.config import ModelConfig

EOT, T, TOL = 63, 24, 1e-5
FAMILIES = {"gla": {}, "gated_deltanet": {}, "mamba2": {}, "gpt2": {},
            "gpt2_ramla": dict(family="gpt2", attention="ramla", latent_dim=8, ra_window=3, ra_alpha=0.5)}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_packed_window_equals_documents_alone(name):
    kw = {"family": name, **FAMILIES[name]}
    torch.manual_seed(0)
    model = build_model(ModelConfig(d_model=32, n_layers=2, n_heads=2, vocab_size=64, chunk_size=16,
                                    max_seq_len=T, **kw)).double()
    # two rows: separators inside (documents of 1, 16 and more tokens), a document across the row edge
    x = torch.randint(0, EOT, (2, T))
    x[0, [6, 7, 23]] = EOT                       # row 0: [0, 6) [6, 7) [7, 23) [23, 24)
    x[1, 9] = EOT                                # row 1: [24, 33) [33, 48)
    y = torch.randint(0, EOT, (2, T))
    cu = cu_seqlens(x, EOT)
    assert cu.tolist() == [0, 6, 7, 23, 24, 33, 48]
    logits, loss32 = model(x, y, cu_seqlens=cu)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())                # fp64 (the model's is fp32)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)

    flat_x = x.reshape(1, -1)
    parts = [model(flat_x[:, a:b])[0] for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
    ref = torch.cat(parts, 1).view(2, T, -1)
    ref_loss = F.cross_entropy(ref.flatten(0, 1), y.flatten())
    ref_grads = torch.autograd.grad(ref_loss, list(model.parameters()), allow_unused=True)
    assert rel(logits, ref) <= TOL and abs(loss.item() - ref_loss.item()) <= TOL * ref_loss.item()
    for (pname, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        if r is None:
            assert g is None or not g.any(), pname
        else:
            assert rel(g, r) <= TOL, pname
    # the model's own fp32 losses, whole logits and the training path's chunked head: fp32 rounding (≤ 1e-6)
    _, chunked = model(x, y, return_logits=False, cu_seqlens=cu)
    for got in (loss32, chunked):
        assert abs(got.item() - ref_loss.item()) <= 1e-6 * ref_loss.item()

def test_without_separators_a_packed_batch_is_the_plain_batch():
    model = build_model(ModelConfig(family="gla", d_model=32, n_layers=1, n_heads=2, vocab_size=64,
                                    chunk_size=16)).double()
    x = torch.randint(0, EOT, (2, T))
    cu = cu_seqlens(x, EOT)                                                   # rows only
    assert cu.tolist() == [0, T, 2 * T]
    assert rel(model(x, cu_seqlens=cu)[0], model(x)[0]) <= TOL
