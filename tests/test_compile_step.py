"""train.py's compiled step (utils/compile.py): when `auto` compiles and why, the settings refused before any work,
and a compiled run equal to the eager one, step for step."""
from __future__ import annotations

import dataclasses
import gc
import json

import pytest
import torch

import train
from config import Config, ConfigError
from tests.test_train import losses, tiny
from utils.compile import resolve_compile

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def settings(backend: str = "fused", family: str = "gla", **train_kw) -> Config:
    cfg = Config()
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, backend=backend, family=family),
                               train=dataclasses.replace(cfg.train, **train_kw))


def test_auto_compiles_on_a_gpu_for_the_kernel_backends_only():
    assert resolve_compile(settings("fused"), "cuda", False) == (True, "auto: on for a CUDA GPU; backend inductor, "
                                                                        "scope blocks")
    # CUDA graphs are captured around the compiled blocks (utils/cuda_graph.py), not by Inductor
    assert resolve_compile(settings("chunk", cuda_graphs=True), "cuda", False)[1].endswith("scope blocks")
    assert resolve_compile(settings("chunk", compile_scope="model"), "cuda", False)[1].endswith("scope model")
    assert resolve_compile(settings("fused"), "cuda", True) == (True, "auto: on for a CUDA GPU (FSDP2: block by "
                                                                       "block); backend inductor, scope blocks")
    for backend, device, fsdp, why in (("fused", "cpu", False, "off on a CPU"), ("naive", "cuda", False, "dominate"),
                                       ("fla", "cuda", False, "not torch.library operators"),
                                       ("fla", "cuda", True, "not torch.library operators")):
        on, reason = resolve_compile(settings(backend), device, fsdp)
        assert not on and why in reason, reason
    assert resolve_compile(settings("naive", compile="true"), "cpu", False)[0]
    assert resolve_compile(settings("naive", family="gpt2"), "cuda", False)[0]     # SDPA, no chunk loops
    assert not resolve_compile(settings("fused", compile="false"), "cuda", False)[0]
    packed = settings("fused")
    packed.data.varlen = True
    on, reason = resolve_compile(packed, "cuda", False)
    assert not on and "data.varlen" in reason, reason
    packed.train.compile = "true"
    with pytest.raises(ConfigError, match="does not go with data.varlen"):
        resolve_compile(packed, "cuda", False)


@pytest.mark.parametrize("kw,device,fsdp,message", [
    (dict(compile="yes"), "cuda", False, "must be one of auto, true, false"),
    (dict(compile_scope="model"), "cuda", True, "under FSDP2 is compiled block by block")])
def test_settings_that_cannot_work_are_refused(kw, device, fsdp, message):
    with pytest.raises(ConfigError, match=message):
        resolve_compile(settings(**kw), device, fsdp)


def test_a_compiled_run_equals_the_eager_run(tmp_path, capsys):
    """Six steps compiled whole through AOTAutograd without code generation, against the same run eager: the same
    losses in fp32. (`naive`: tests/test_compile.py compiles every kernel backend's step; here it is train.py's
    wiring that is checked, and the interpreter would make it minutes.)"""
    common = ["--backend", "naive", "--train.max_steps=6", "--train.eval_interval=0", "--train.ckpt_interval=0"]
    train.main(tiny(tmp_path, "eager", *common))
    from tests.helpers import reset_accelerate
    reset_accelerate()
    train.main(tiny(tmp_path, "compiled", *common, "--train.compile=true",
                    "--train.compile_backend=aot_eager_decomp_partition"))
    assert "compiled step: on (train.compile=true; backend aot_eager_decomp_partition, scope blocks)" in \
        capsys.readouterr().out
    eager, compiled = losses(tmp_path / "runs" / "eager")[0], losses(tmp_path / "runs" / "compiled")[0]
    assert sorted(eager) == sorted(compiled) == list(range(1, 7))
    assert all(abs(compiled[s] - eager[s]) <= 1e-5 * abs(eager[s]) for s in eager), (eager, compiled)
    info = json.loads((tmp_path / "runs" / "compiled" / "run.json").read_text())
    assert info["config"]["train"]["compile"] == "true"


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_a_ddp_wrapped_model_compiles_and_equals_eager(scope):
    """DDP's own forward (bucket rebuilding) cannot be traced whole: the compiled step of a DDP module runs it
    eagerly and compiles the module inside (whole, or block by block: DDP's gradient hooks fire as each block's
    backward graph yields its gradients); loss and gradients equal the eager DDP step's (one gloo process)."""
    import torch.distributed as dist

    from model import build_model
    from model.config import ModelConfig
    from utils.compile import compiled_step

    def eager_then_compiled() -> list[tuple[float, list[torch.Tensor]]]:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(build_model(ModelConfig(
            family="gpt2", vocab_size=61, n_layers=2, d_model=32, n_heads=2, max_seq_len=64, mlp_hidden=64,
            backend="naive")))
        x, y = torch.randint(0, 61, (2, 24)), torch.randint(0, 61, (2, 24))
        results = []
        for step in ("eager", "compiled"):                     # eager first: blocks compile in place
            fn = model if step == "eager" else compiled_step(model, settings(
                "naive", compile="true", compile_scope=scope, compile_backend="aot_eager_decomp_partition"))
            model.zero_grad(set_to_none=True)
            loss = fn(x, y, return_logits=False)[1]
            loss.backward()
            results.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
        return results

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)     # no port: xdist runs both scopes
    try:
        (l0, g0), (l1, g1) = eager_then_compiled()
    finally:
        # the DDP module and its reducer go before their process group: gloo's destructor can hang in a thread join
        # when the reducer outlives destroy_process_group. The compiled graphs hold the module too.
        torch._dynamo.reset()
        gc.collect()
        dist.destroy_process_group()
    assert abs(l1 - l0) <= 1e-5 * abs(l0)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(g0, g1))


@pytest.mark.parametrize("ckpt", ["none", "full"])
def test_block_scope_compiles_one_block_for_all_and_equals_eager(ckpt):
    """compile_scope=blocks: Dynamo traces the first block's forward once and every other block reuses it (a counting
    backend sees one graph for three blocks); loss and every gradient equal the eager model's, with the blocks under
    a checkpoint wrapper too; FSDP2 may then compile (resolve_compile)."""
    from torch._dynamo.backends.registry import lookup_backend

    from model import build_model
    from model.config import ModelConfig
    from utils.activation_checkpointing import checkpoint_activations
    from utils.compile import compile_blocks

    torch.manual_seed(0)
    cfg = ModelConfig(family="gla", vocab_size=61, n_layers=3, d_model=32, n_heads=2, head_k_dim=8, head_v_dim=16,
                      mlp_hidden=64, chunk_size=16, backend="naive")
    eager = build_model(cfg)
    compiled = build_model(cfg)
    compiled.load_state_dict(eager.state_dict())
    checkpoint_activations(compiled, ckpt)
    graphs, aot = [], lookup_backend("aot_eager_decomp_partition")
    try:
        assert compile_blocks(compiled, lambda gm, ex: graphs.append(gm) or aot(gm, ex)) == 3
        x, y = torch.randint(0, 61, (2, 40)), torch.randint(0, 61, (2, 40))
        results = []
        for model in (eager, compiled):
            loss = model(x, y, return_logits=False)[1]
            loss.backward()
            results.append((loss.item(), {n.replace("_checkpoint_wrapped_module.", ""): p.grad
                                          for n, p in model.named_parameters()}))
        (l0, g0), (l1, g1) = results
        assert len(graphs) == 1
        assert abs(l1 - l0) <= 1e-5 * abs(l0)
        assert all(torch.allclose(g1[n], g, rtol=1e-5, atol=1e-7) for n, g in g0.items())
        with pytest.raises(ValueError, match="already compiled"):
            compile_blocks(compiled)
    finally:
        torch._dynamo.reset()
    assert resolve_compile(settings("fused", compile="true", compile_scope="blocks"), "cuda", True)[0]


def test_block_scope_compiles_under_fsdp2_and_equals_eager():
    """compile_scope=blocks after FSDP2 has sharded the model (train.py compiles the prepared model): each compiled
    block forward runs between FSDP2's unshard and reshard hooks, and loss and gradients equal the sharded eager
    model's (one gloo process on a CPU mesh)."""
    import copy

    from torch._dynamo.backends.registry import lookup_backend

    from tests.test_activation_checkpointing import fsdp2_shard, loss_and_grads, one_process_group, tiny_model
    from utils.compile import compile_blocks

    base = tiny_model("gla")
    aot = lookup_backend("aot_eager_decomp_partition")
    graphs = []
    try:
        with one_process_group():
            ref_loss, ref = loss_and_grads(fsdp2_shard(copy.deepcopy(base)))
            sharded = fsdp2_shard(copy.deepcopy(base))
            compile_blocks(sharded, lambda gm, ex: graphs.append(gm) or aot(gm, ex))
            got_loss, got = loss_and_grads(sharded)
    finally:
        torch._dynamo.reset()
    assert graphs and abs(got_loss - ref_loss) <= 1e-5 * abs(ref_loss)
    assert all(torch.allclose(g.full_tensor(), ref[n].full_tensor(), rtol=1e-5, atol=1e-7) for n, g in got.items())
