"""`--train.cuda_graphs` (utils/cuda_graph.py): the settings it refuses, and on a GPU, micro-batches replayed from the
graph equal to the same micro-batches run normally (loss and every accumulated gradient) for every family and
backend, and a graphed train.py run equal to the plain one."""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

import train
from config import Config, ConfigError
from model import build_model
from model.config import ModelConfig
from tests.helpers import rel_err, reset_accelerate
from tests.test_compile import CELLS, TINY
from tests.test_multiprocess import REPO
from tests.test_train import losses, tiny
from utils.cuda_graph import WARMUP, GraphedMicroBatch, resolve_cuda_graphs

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


def graphs(value: str = "true", backend: str = "fused", **data_kw) -> Config:
    cfg = Config()
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, cuda_graphs=value),
                               model=dataclasses.replace(cfg.model, backend=backend),
                               data=dataclasses.replace(cfg.data, **data_kw))


CANNOT = [(graphs(), "cpu", 1, "no", "needs a CUDA GPU"),
          (graphs(), "cuda", 2, "bf16", "does not capture FSDP2"),
          (graphs(varlen=True), "cuda", 1, "bf16", "data.varlen"),
          (graphs(), "cuda", 1, "fp16", "fp16")]


@pytest.mark.parametrize("cfg,device,world,precision,message", CANNOT)
def test_where_a_graph_cannot_work_true_is_refused_and_auto_is_off(cfg, device, world, precision, message):
    fsdp = "FSDP2" in message
    with pytest.raises(ConfigError, match=f"train.cuda_graphs .*{message}.*; pass --train.cuda_graphs=false"):
        resolve_cuda_graphs(cfg, device, world, precision, fsdp)
    on, why = resolve_cuda_graphs(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, cuda_graphs="auto")),
                                  device, world, precision, fsdp)
    assert not on and why.startswith("auto: off") and message in why, why


def test_auto_captures_on_gpus_except_fla():
    assert resolve_cuda_graphs(graphs("auto"), "cuda", 1, "bf16") == (True, "auto: on for CUDA GPUs")
    assert resolve_cuda_graphs(graphs("auto"), "cuda", 4, "bf16") == (True, "auto: on for CUDA GPUs, DDP's all-reduce "
                                                                            "captured too")
    assert resolve_cuda_graphs(graphs("auto", "naive"), "cuda", 1, "no")[0]
    on, why = resolve_cuda_graphs(graphs("auto", "fla"), "cuda", 1, "bf16")
    assert not on and "fla" in why
    assert resolve_cuda_graphs(graphs("true", "fla"), "cuda", 1, "bf16")[0]       # asked for: tried
    assert resolve_cuda_graphs(graphs(False), "cuda", 1, "bf16") == (False, "train.cuda_graphs=false")   # YAML's bool
    assert resolve_cuda_graphs(graphs(True), "cuda", 1, "bf16")[0]
    with pytest.raises(ConfigError, match="must be one of auto, true, false, got 'yes'"):
        resolve_cuda_graphs(graphs("yes"), "cuda", 1, "bf16")


def test_train_refuses_graphs_on_a_cpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("on a GPU the setting is valid")
    with pytest.raises(ConfigError, match="train.cuda_graphs needs a CUDA GPU; pass --train.cuda_graphs=false"):
        train.main(tiny(tmp_path, "g", "--train.cuda_graphs=true"))


@gpu
@pytest.mark.parametrize("write", [True, False], ids=["first-writes", "all-add"])
@pytest.mark.parametrize("family,backend", [pytest.param(*c, id="-".join(c)) for c in CELLS])
def test_replayed_micro_batches_equal_normal_ones(family, backend, write):
    """Three optimizer steps' worth of micro-batches (3, 2 and 3, fresh tokens each): per kind of micro-batch the
    first WARMUP run normally, the next is captured, the rest replay. Losses and the gradients summed over each step
    match the same micro-batches run without the graph (fp32: the same kernels, so within 1e-5). `write`: each
    step's first micro-batch replaces the gradients (no zeroing; a stale gradient would show in steps 2 and 3), else
    every micro-batch adds into gradients zeroed in place."""
    torch.manual_seed(0)
    cfg = ModelConfig(**{"family": family, "vocab_size": 61, "n_layers": 2, "mlp_hidden": 64, "chunk_size": 16,
                         **TINY[family], "backend": backend})
    model = build_model(cfg).cuda()
    params = list(model.parameters())
    batches = [[(torch.randint(0, 61, (2, 40)), torch.randint(0, 61, (2, 40))) for _ in range(n)] for n in (3, 2, 3)]

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
        if not write:
            model.zero_grad(set_to_none=False)
        got_losses = [graphed(x, y, first=write and i == 0) for i, (x, y) in enumerate(step)]
        for got, ref in zip(got_losses, want_losses):
            assert abs(got.item() - ref.item()) <= 1e-5 * abs(ref.item())
        bad = {i: e for i, (p, g) in enumerate(zip(params, want_grads)) if not (e := rel_err(p.grad, g)) <= 1e-5}
        assert not bad, bad
    # all alike: 8 calls, WARMUP of them eager. Firsts: 3 calls, captured at the third. The rest wait for the firsts'
    # graph (the tensors they add into): steps 1 and 2 eager, both of step 3 replayed
    assert graphed.replays == (8 - WARMUP if not write else 3 - WARMUP + 2)


@gpu
@pytest.mark.parametrize("accum", [1, 3])
def test_replays_bind_grad_as_the_captured_call_left_it(accum):
    """A stand-in for DDP's reducer: a step's last micro-batch moves every gradient, halved, into a buffer of its
    own and rebinds `.grad` to it. Replays run no Python, so the graph must rebind: after each step `.grad` is the
    buffer holding this step's halved sum (the optimizer's view), and the next step's micro-batches add into what
    its first one wrote, not into the buffer. Four steps, against the same calls without graphs (fp32, 1e-5)."""
    torch.manual_seed(0)
    cfg = ModelConfig(family="gla", vocab_size=61, n_layers=1, mlp_hidden=64, chunk_size=16, **TINY["gla"],
                      backend="naive")
    model = build_model(cfg).cuda()
    params = list(model.parameters())
    buckets = [torch.zeros_like(p) for p in params]

    def run(x, y, sync):
        _, loss = model(x, y, return_logits=False)
        loss.backward()
        if sync:
            for p, b in zip(params, buckets):
                torch.mul(p.grad, 0.5, out=b)
                p.grad = b
        return loss.detach()

    steps = [[(torch.randint(0, 61, (2, 40)), torch.randint(0, 61, (2, 40))) for _ in range(accum)] for _ in range(4)]
    want = []
    for step in steps:
        model.zero_grad(set_to_none=True)
        for i, (x, y) in enumerate(step):
            run(x.cuda(), y.cuda(), i == accum - 1)
        want.append([p.grad.clone() for p in params])
    graphed = GraphedMicroBatch(lambda x, y: run(x, y, graphed.sync), params, warmup=1)
    for n, (step, ref) in enumerate(zip(steps, want)):
        for i, (x, y) in enumerate(step):
            graphed.sync = i == accum - 1
            graphed(x, y, key=graphed.sync, first=i == 0)
        assert all(p.grad is b for p, b in zip(params, buckets)), n
        bad = {i: e for i, (p, g) in enumerate(zip(params, ref)) if not (e := rel_err(p.grad, g)) <= 1e-5}
        assert not bad, (n, bad)
    assert graphed.replays == 3 * accum           # steps 2-4: each kind captured at its second call


@gpu
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_a_graphed_run_equals_the_plain_run_and_resumes(tmp_path, checkpointing):
    """train.py on `fused` with accumulation 2, compiled block by block, without the graph and with it (`auto`):
    the same losses step for step and the same validation losses (evaluated between replays; bf16 autocast, the
    same kernels), every micro-batch after the warm-up replayed. Then the graphed run "crashes" after its step-6
    checkpoint and resumes, capturing a new graph: steps 7-12 as before."""
    common = ["--backend", "fused", "--train.grad_accum=2", "--train.compile=true", "--train.keep_ckpts=3",
              f"--train.activation_checkpointing={checkpointing}"]
    train.main(tiny(tmp_path, "plain", *common, "--train.cuda_graphs=false"))
    reset_accelerate()
    torch._dynamo.reset()
    out = train.main(tiny(tmp_path, "graphed", *common))
    assert out["graph_replays"] == 12 * 2 - 2 * WARMUP          # steps' first micro-batches and second ones
    (plain, plain_val), (graphed, graphed_val) = (losses(tmp_path / "runs" / n) for n in ("plain", "graphed"))
    assert plain.keys() == graphed.keys() and plain_val.keys() == graphed_val.keys() == {6, 12}
    bad = {s: (plain[s], graphed[s]) for s in plain if not abs(plain[s] - graphed[s]) <= 1e-4 * abs(plain[s])}
    bad |= {s: (plain_val[s], graphed_val[s]) for s in plain_val
            if not abs(plain_val[s] - graphed_val[s]) <= 1e-4 * abs(plain_val[s])}
    assert not bad, bad

    crashed = tmp_path / "runs" / "crashed"
    shutil.copytree(tmp_path / "runs" / "graphed", crashed)
    shutil.rmtree(crashed / "checkpoints" / "step_00000012")
    (crashed / "checkpoints" / "latest").write_text("step_00000006")
    reset_accelerate()
    torch._dynamo.reset()
    out = train.main(tiny(tmp_path, "crashed", *common) + ["--resume"])
    assert out["graph_replays"] == 6 * 2 - 2 * WARMUP
    resumed, resumed_val = losses(crashed)
    assert sorted(resumed) == list(range(1, 13))
    bad = {s: (graphed[s], resumed[s]) for s in graphed if not abs(graphed[s] - resumed[s]) <= 1e-4 * abs(graphed[s])}
    assert not bad and abs(resumed_val[12] - graphed_val[12]) <= 1e-4 * graphed_val[12], (bad, resumed_val)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DDP's captured all-reduce needs two CUDA GPUs")
@pytest.mark.parametrize("accum", [1, 2])
def test_two_gpus_under_ddp_with_graphs_equal_them_without(tmp_path, accum):
    """accelerate launch on two GPUs (DDP), with and without graphs: the same losses and gradient norms step for
    step (bf16 autocast; DDP's all-reduce inside the graph of the micro-batch that syncs, none in the no_sync one's;
    each step's first micro-batch writes the gradients, which the reducer moves into its buckets), and micro-batches
    replayed after DDP_WARMUP of each kind. The norm is of the all-reduced gradients the optimizer reads: a replay
    that left `.grad` on a rank's own sum (twice the mean) or on the last step's would show there first. At
    accumulation 1 one micro-batch both writes and syncs; at 2 the second adds into the first's before syncing."""
    import subprocess
    import sys

    from tests.test_multiprocess import free_port
    from utils.cuda_graph import DDP_WARMUP

    steps = DDP_WARMUP + 4
    common = tiny(tmp_path, "x", "--backend", "fused", f"--train.grad_accum={accum}", f"--train.max_steps={steps}",
                  "--train.eval_interval=0", "--train.ckpt_interval=0")
    out = {}
    for graphs_setting in ("false", "true"):
        argv = [a for a in common if not a.startswith("--train.name=")] + [f"--train.name={graphs_setting}",
                                                                             f"--train.cuda_graphs={graphs_setting}"]
        p = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                            "configs/accelerate/ddp.yaml", "--num_processes", "2", "--main_process_port",
                            str(free_port()), "train.py", *argv], capture_output=True, text=True, timeout=600, cwd=REPO)
        assert p.returncode == 0, p.stderr[-3000:]
        out[graphs_setting] = p.stdout
    assert "DDP's all-reduce captured too" in out["true"]
    replayed = (steps - DDP_WARMUP) if accum == 1 else 2 * (steps - DDP_WARMUP)
    assert f"CUDA graphs: {replayed} micro-batches replayed" in out["true"]
    plain, graphed = (rows(tmp_path / "runs" / n) for n in ("false", "true"))
    assert plain.keys() == graphed.keys() == set(range(1, steps + 1))
    bad = {s: (plain[s], graphed[s]) for s in plain
           if not all(abs(a - b) <= 1e-4 * abs(a) for a, b in zip(plain[s], graphed[s]))}
    assert not bad, bad


def rows(run_dir) -> dict[int, tuple[float, float]]:
    """step → (loss, gradient norm) from a run's metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, lines) if "loss" in r}
