"""The decode step as one CUDA graph (model.decode.GraphedStep): for every recurrent family the replayed step gives
the eager step's logits and cache, left-padded batches included, in fp32 and under bf16 autocast; model.generate
uses it by default on a GPU and emits the eager run's tokens. On a CPU: the refusals, and generate stays eager."""
from __future__ import annotations

import pytest
import torch

from model import build_model
from model.decode import GraphedStep, graphable
from tests.helpers import rel_err
from tests.model.test_decode import tiny_cfg

RECURRENT = ["gla", "gated_deltanet", "mamba2"]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


def prompts(model, B: int, T: int, seed: int) -> tuple[torch.Tensor, list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.vocab_size, (B, T), generator=g).cuda(), [T, 1, T - 3][:B]


@needs_gpu
@pytest.mark.parametrize("backend", ["fused", "naive"])
@pytest.mark.parametrize("amp", [False, True])
@pytest.mark.parametrize("name", RECURRENT)
def test_graphed_step_equals_the_eager_step(name, backend, amp):
    torch.manual_seed(0)
    model = build_model(tiny_cfg(name, backend)).cuda().eval()
    idx, lengths = prompts(model, 3, 11, seed=torch.seed() % 2**31)
    tokens = torch.randint(0, model.cfg.vocab_size, (8, 3), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=amp):
        _, eager = model.prefill(idx, lengths, capacity=32)
        _, graphed = model.prefill(idx, lengths, capacity=32)
        run = GraphedStep(model, graphed, tokens[0])
        for layer, kept in zip(graphed.layers, eager.layers):    # the capture left the cache where it was
            assert all(torch.equal(layer[n], kept[n]) for n in kept)
        for t in tokens:
            want = model.step(t, eager)
            got = run(t).clone()
            # the same kernels on the same inputs; autocast's casts are replayed rather than cached, bit-equal too
            assert rel_err(got, want) <= 1e-6, (name, backend, amp)
    assert torch.equal(graphed.pos, eager.pos) and graphed.slot == eager.slot
    for layer, kept in zip(graphed.layers, eager.layers):
        for n in kept:
            assert rel_err(layer[n].float(), kept[n].float()) <= 1e-6, n


@needs_gpu
@pytest.mark.parametrize("name", RECURRENT)
def test_generate_uses_the_graph_on_a_gpu_and_emits_the_eager_tokens(name, monkeypatch):
    import model.decode as decode

    torch.manual_seed(0)
    model = build_model(tiny_cfg(name, "fused")).cuda().eval()
    idx, lengths = prompts(model, 2, 9, seed=1)
    captured = []
    real = decode.GraphedStep
    monkeypatch.setattr(decode, "GraphedStep", lambda *a: captured.append(1) or real(*a))
    graphed = model.generate(idx, 12, lengths=lengths)
    assert captured == [1]
    assert torch.equal(graphed, model.generate(idx, 12, lengths=lengths, cuda_graph=False))


def test_attention_caches_and_cpu_tensors_are_refused():
    gpt2 = build_model(tiny_cfg("gpt2", "naive")).eval()
    gla = build_model(tiny_cfg("gla", "naive")).eval()
    assert not graphable(gpt2) and graphable(gla)
    idx = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        _, cache = gpt2.prefill(idx)
        with pytest.raises(ValueError, match="slot-indexed"):
            GraphedStep(gpt2, cache, idx[:, -1])
        _, cache = gla.prefill(idx)
        with pytest.raises(ValueError, match="CUDA GPU"):
            GraphedStep(gla, cache, idx[:, -1])
    assert gla.generate(idx, 4).shape == (1, 4)        # a CPU model decodes eagerly by default
