"""Packed documents through whole models: a packed batch (cu_seqlens over the flattened [1, B·T] stream, documents
split at row edges) gives the logits, the loss and every parameter gradient of its documents run one by one.
`naive` in fp64, relative RMS ≤ 1e-5 (the same arithmetic, in another order); `chunk` and `fused` (GLA, Gated
DeltaNet, Mamba-2; their projection chains with it on fused) in fp32 under the Triton interpreter against naive's
documents alone, within the fp32 model bounds of tests/model/test_equivalence.py (logits 1e-5, gradients 1e-4).
GPT-2's attention has no `chunk` backend, and its fused attention and RA+MLA kernels refuse cu_seqlens."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ops import BackendError

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


def packed_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, y [2, T] and their offsets: documents of 6, 1, 16 (one chunk), 1, 9 and 15 tokens, one across the rows."""
    x = torch.randint(0, EOT, (2, T))
    x[0, [6, 7, 23]] = EOT
    x[1, 9] = EOT
    return x, torch.randint(0, EOT, (2, T)), cu_seqlens(x, EOT)


# about test_equivalence.py's tiny widths (Mamba-2 at two heads), one layer: a few interpreter seconds a cell
TINY = {"gla": dict(d_model=32, n_heads=2, head_k_dim=8, head_v_dim=16, gate_low_rank=4),
        "gated_deltanet": dict(d_model=32, n_heads=2, head_k_dim=8, head_v_dim=16),
        "mamba2": dict(d_model=32, expand=1, ssm_head_dim=16, ssm_state=8)}


@pytest.mark.parametrize("backend", ["chunk", "fused"])
@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.usefixtures("exact_fp32_matmuls", "exact_fp32_convs")
def test_triton_packed_window_equals_naive_documents(name, backend, device):
    """fp32: the Triton model on the packed batch against the naive model (same weights) on each document, both on
    `device` (the GPU when present, else the CPU under the interpreter)."""
    kw = dict(family=name, n_layers=1, vocab_size=64, chunk_size=16, max_seq_len=T, **TINY[name])
    torch.manual_seed(0)
    ref_model = build_model(ModelConfig(**kw)).to(device)
    model = build_model(ModelConfig(**kw, backend=backend)).to(device)
    model.load_state_dict(ref_model.state_dict())
    x, y, cu = (t.to(device) for t in packed_batch())
    logits, _ = model(x, y, cu_seqlens=cu)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)

    flat_x = x.reshape(1, -1)
    ref = torch.cat([ref_model(flat_x[:, a:b])[0] for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())], 1)
    ref_loss = F.cross_entropy(ref.flatten(0, 1), y.flatten())
    ref_grads = torch.autograd.grad(ref_loss, list(ref_model.parameters()), allow_unused=True)
    assert rel(logits, ref.view(2, T, -1)) <= 1e-5 and abs(loss.item() - ref_loss.item()) <= 1e-5 * ref_loss.item()
    for (pname, _), g, r in zip(model.named_parameters(), grads, ref_grads):
        if r is None:
            assert g is None or not g.any(), pname
        else:
            assert rel(g, r) <= 1e-4, f"{pname}: {rel(g, r):.2e}"


def test_fused_ramla_refuses_packed_documents():
    """The one family × backend without a packed path says so, naming op, backend and remedy."""
    cfg = ModelConfig(family="gpt2", attention="ramla", d_model=32, n_heads=2, latent_dim=8, ra_window=3,
                      n_layers=1, vocab_size=64, max_seq_len=T, backend="fused")
    x, _, cu = packed_batch()
    with pytest.raises(BackendError, match="op 'ramla', backend 'fused'.*cu_seqlens"):
        build_model(cfg)(x, cu_seqlens=cu)
