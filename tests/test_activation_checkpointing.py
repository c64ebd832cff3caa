"""--train.activation_checkpointing (utils/activation_checkpointing.py): every mode computes the same gradients as
none, selective really drops the MLP's saved activations, the wrapped model still compiles fullgraph, and a
train.py run with checkpointing continues a run without it step for step (the checkpoint keys do not change)."""
from __future__ import annotations

import copy
import dataclasses
import socket
from contextlib import contextmanager

import pytest
import torch
from safetensors import safe_open

import train
from config import Config, ConfigError
from model import build_model
from model.common import Block
from model.config import ModelConfig
from tests.helpers import rel_err, saved_bytes
from tests.test_faults import args, ckpt, copy_run
from tests.test_train import losses
from utils.activation_checkpointing import checkpoint_activations
from utils.compile import compiled_step

B, T, VOCAB = 2, 40, 37
FAMILIES = {"gla": dict(head_k_dim=8, head_v_dim=8), "mamba2": dict(ssm_head_dim=8, ssm_state=8)}


def tiny_model(family: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = dict(family=family, backend="naive", vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, mlp_hidden=64)
    return build_model(ModelConfig(**{**cfg, **FAMILIES[family], **kw}))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (B, T), generator=g), torch.randint(0, VOCAB, (B, T), generator=g)


def loss_and_grads(model: torch.nn.Module, step=None) -> tuple[float, dict[str, torch.Tensor]]:
    """The training loss and every parameter's gradient, keyed by the unwrapped parameter name."""
    x, y = batch()
    loss = (model if step is None else step)(x, y, return_logits=False)[1]
    loss.backward()
    return loss.item(), {n.replace("._checkpoint_wrapped_module", ""): p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_mode_computes_the_gradients_of_none(family):
    base = tiny_model(family)
    ref_loss, ref = loss_and_grads(copy.deepcopy(base))
    for mode in ("full", "selective"):
        model = copy.deepcopy(base)
        assert "2 wrapped" in checkpoint_activations(model, mode)
        assert list(model.state_dict()) == list(base.state_dict())          # checkpoints keep their keys
        got_loss, got = loss_and_grads(model)
        assert got.keys() == ref.keys() and got_loss == ref_loss
        for name, g in got.items():
            assert rel_err(g, ref[name]) <= 1e-6, (mode, name, rel_err(g, ref[name]))


def test_selective_drops_the_mlp_activations_and_full_keeps_only_block_inputs():
    """Saved activation bytes in the forward: selective frees at least each layer's SwiGLU intermediates (the
    [B, T, 2·hidden] gate/up output, silu(gate) and the product the down projection reads: 4·hidden fp32 values a
    token), while keeping the mixer's; full keeps less still."""
    x, y = batch()
    kept = {}
    for mode in ("none", "selective", "full"):
        model = tiny_model("gla")
        checkpoint_activations(model, mode)
        kept[mode] = saved_bytes(lambda: model(x, y, return_logits=False))
    hidden, layers = 64, 2
    assert kept["none"] - kept["selective"] >= layers * B * T * 4 * hidden * 4, kept
    assert kept["full"] < kept["selective"], kept


def test_settings_that_cannot_work_are_refused(monkeypatch):
    with pytest.raises(ConfigError, match="has none"):
        checkpoint_activations(tiny_model("mamba2", mlp_hidden=0), "selective")
    with pytest.raises(ConfigError, match="must be one of none, full, selective"):
        checkpoint_activations(tiny_model("gla"), "some")
    monkeypatch.setenv("FSDP_ACTIVATION_CHECKPOINTING", "true")
    with pytest.raises(ConfigError, match="fsdp_activation_checkpointing"):
        checkpoint_activations(tiny_model("gla"), "full")
    checkpoint_activations(tiny_model("gla"), "none")          # accelerate's own checkpointing alone is fine


def test_a_checkpointed_model_compiles_fullgraph():
    """train.py's compiled step (fullgraph) over a model whose blocks are wrapped: the checkpoint is traced as a
    higher-order op, not a graph break; loss and gradients equal eager's."""
    cfg = Config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, compile="true",
                                                             compile_backend="aot_eager_decomp_partition"))
    base = tiny_model("gla", n_layers=1)
    ref_loss, ref = loss_and_grads(copy.deepcopy(base))
    model = copy.deepcopy(base)
    checkpoint_activations(model, "full")
    try:
        got_loss, got = loss_and_grads(model, compiled_step(model, cfg))
    finally:
        torch._dynamo.reset()
    assert abs(got_loss - ref_loss) <= 1e-6 * abs(ref_loss)
    assert all(rel_err(g, ref[n]) <= 1e-5 for n, g in got.items())


@contextmanager
def one_process_group():
    """A gloo process group of one process (this one), for DDP and FSDP2 on the CPU, on a free port (pytest -n runs
    several at once)."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def fsdp2_shard(model: torch.nn.Module) -> torch.nn.Module:
    """fully_shard as accelerate's FSDP2 preparation applies it (configs/accelerate/fsdp.yaml): each Block, looking
    through a CheckpointWrapper, bottom-up, then the root. On a CPU device mesh of the one gloo process
    (one_process_group): fully_shard's default mesh is CUDA's wherever CUDA is available, which would move the
    parameters of this CPU model to the GPU."""
    from accelerate.utils.other import get_module_children_bottom_up
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1,))
    for m in get_module_children_bottom_up(model)[:-1]:
        if isinstance(getattr(m, "_checkpoint_wrapped_module", m), Block):
            fully_shard(m, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def test_under_ddp_and_fsdp2_the_gradients_are_those_of_none():
    """Checkpointing is applied before the model is wrapped (train.py: before accelerator.prepare); under DDP and
    under FSDP2 (one gloo process) the loss and gradients equal the plain model's without checkpointing."""
    base = tiny_model("gla")
    ref_loss, ref = loss_and_grads(copy.deepcopy(base))
    with one_process_group():
        for mode in ("full", "selective"):
            ddp = copy.deepcopy(base)
            checkpoint_activations(ddp, mode)
            got_loss, got = loss_and_grads(ddp, torch.nn.parallel.DistributedDataParallel(ddp))
            assert got_loss == ref_loss and all(rel_err(g, ref[n]) <= 1e-6 for n, g in got.items()), mode
            sharded = copy.deepcopy(base)
            checkpoint_activations(sharded, mode)
            got_loss, got = loss_and_grads(fsdp2_shard(sharded))
            assert got_loss == ref_loss, mode
            assert all(rel_err(g.full_tensor(), ref[n]) <= 1e-6 for n, g in got.items()), mode


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_a_run_resumed_with_checkpointing_continues_the_run_without(base_run, tmp_path, capsys):
    """base_run trained 4 steps without checkpointing; from its step-2 checkpoint, steps 3 and 4 with selective
    checkpointing log the same losses, and the new checkpoint has the same weight names."""
    run = copy_run(base_run, tmp_path, "ac")
    train.main(args(tmp_path, "ac", "--train.activation_checkpointing=selective") + ["--resume", str(ckpt(run, 2))])
    assert "activation checkpointing: selective: each block's MLP recomputed" in capsys.readouterr().out
    (before, _), (after, _) = losses(base_run / "runs" / "base"), losses(run)
    assert sorted(after) == [1, 2, 3, 4] and after == before
    with safe_open(ckpt(base_run / "runs" / "base", 4) / "model.safetensors", "pt") as old, \
            safe_open(ckpt(run, 4) / "model.safetensors", "pt") as new:
        assert sorted(old.keys()) == sorted(new.keys())
