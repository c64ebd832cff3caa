"""`--train.cuda_graphs` (utils/cuda_graph.py): the settings it refuses, and on a GPU, micro-batches replayed from the
graph equal to the same micro-batches run normally (loss and every accumulated gradient) for every family and
backend, and a graphed train.py run equal to the plain one."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import train
from config import Config, ConfigError
from model import build_model
from model.config import ModelConfig
from tests.helpers import rel_err
from tests.test_compile import CELLS, TINY
from tests.test_train import losses, tiny
from utils.cuda_graph import WARMUP, GraphedMicroBatch, check_cuda_graphs

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


def graphs_on(**data_kw) -> Config:
    cfg = Config()
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, cuda_graphs=True),
                               data=dataclasses.replace(cfg.data, **data_kw))


@pytest.mark.parametrize("cfg,device,world,precision,message", [
    (graphs_on(), "cpu", 1, "no", "needs a CUDA GPU"),
    (graphs_on(), "cuda", 2, "bf16", "runs on one process"),
    (graphs_on(varlen=True), "cuda", 1, "bf16", "data.varlen"),
    (graphs_on(), "cuda", 1, "fp16", "fp16")])
def test_settings_that_cannot_be_captured_are_refused(cfg, device, world, precision, message):
    with pytest.raises(ConfigError, match=message):
        check_cuda_graphs(cfg, device, world, precision)
    check_cuda_graphs(graphs_on(), "cuda", 1, "bf16")
    check_cuda_graphs(Config(), device, world, precision)       # off: nothing to check


def test_train_refuses_graphs_on_a_cpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("on a GPU the setting is valid")
    with pytest.raises(ConfigError, match="train.cuda_graphs needs a CUDA GPU"):
        train.main(tiny(tmp_path, "g", "--train.cuda_graphs=true"))


@gpu
@pytest.mark.parametrize("family,backend", [pytest.param(*c, id="-".join(c)) for c in CELLS])
def test_replayed_micro_batches_equal_normal_ones(family, backend):
    """Two optimizer steps' worth of micro-batches (3 and 2, fresh tokens each): the first WARMUP run normally, the
    next is captured, the rest replay. Losses and the gradients accumulated over each step match the same
    micro-batches run without the graph (fp32: the same kernels, so within 1e-5)."""
    torch.manual_seed(0)
    cfg = ModelConfig(**{"family": family, "vocab_size": 61, "n_layers": 2, "mlp_hidden": 64, "chunk_size": 16,
                         **TINY[family], "backend": backend})
    model = build_model(cfg).cuda()
    params = list(model.parameters())
    batches = [[(torch.randint(0, 61, (2, 40)), torch.randint(0, 61, (2, 40))) for _ in range(n)] for n in (3, 2)]

    def run(x, y):
        _, loss = model(x, y, return_logits=False)
        loss.backward()
        return loss.detach()

    want = []
    for step in batches:
        model.zero_grad(set_to_none=True)
        step_losses = [run(x.cuda(), y.cuda()) for x, y in step]
        want.append((step_losses, [p.grad.clone() for p in params]))
    graphed = GraphedMicroBatch(run, params)
    for (want_losses, want_grads), step in zip(want, batches):
        model.zero_grad(set_to_none=False)
        got_losses = [graphed(x, y) for x, y in step]
        for got, ref in zip(got_losses, want_losses):
            assert abs(got.item() - ref.item()) <= 1e-5 * abs(ref.item())
        bad = {i: e for i, (p, g) in enumerate(zip(params, want_grads)) if not (e := rel_err(p.grad, g)) <= 1e-5}
        assert not bad, bad
    assert graphed.replays == 5 - WARMUP


@gpu
def test_a_graphed_run_equals_the_plain_run(tmp_path):
    """train.py on `fused` with accumulation 2, compiled block by block, with and without the graph: the same
    losses step for step (bf16 autocast, the same kernels), and every micro-batch after the warm-up replayed."""
    common = ["--backend", "fused", "--train.grad_accum=2", "--train.compile=true", "--train.eval_interval=0",
              "--train.ckpt_interval=0"]
    train.main(tiny(tmp_path, "plain", *common))
    from tests.helpers import reset_accelerate
    reset_accelerate()
    torch._dynamo.reset()
    out = train.main(tiny(tmp_path, "graphed", *common, "--train.cuda_graphs=true"))
    assert out["graph_replays"] == 12 * 2 - WARMUP
    plain, graphed = (losses(tmp_path / "runs" / n)[0] for n in ("plain", "graphed"))
    assert plain.keys() == graphed.keys()
    bad = {s: (plain[s], graphed[s]) for s in plain if not abs(plain[s] - graphed[s]) <= 1e-4 * abs(plain[s])}
    assert not bad, bad
