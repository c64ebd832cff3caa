"""Settings are honest and visible: `model.chunk_size` reaches every chunkwise op on every backend, a size or dtype a
backend cannot run is a BackendError naming what it can, and every fused op reports its kernel plan."""
from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from model import build_model
from model.config import ModelConfig
from ops import BackendError, get_op, list_backends

CHUNKWISE = ("gla", "ssd", "gated_delta")
TINY = dict(d_model=64, n_layers=1, n_heads=2, head_k_dim=16, head_v_dim=16, vocab_size=64, mlp_hidden=64,
            ssm_head_dim=16, ssm_state=16, expand=2, max_seq_len=64, latent_dim=16, ra_window=4)
FAMILIES = {"gla": dict(family="gla"), "gated_deltanet": dict(family="gated_deltanet"),
            "mamba2": dict(family="mamba2"), "gpt2_ramla": dict(family="gpt2", attention="ramla")}


def cfg_of(family: str, **kw) -> ModelConfig:
    return ModelConfig(**TINY, **FAMILIES[family], **kw)


@pytest.mark.parametrize("op", CHUNKWISE)
def test_every_backend_takes_chunk_size(op):
    """The op signature ends in chunk_size, on every backend (the registry test checks they agree)."""
    for backend in list_backends(op):
        import importlib

        fn = getattr(importlib.import_module(f"ops.{op}.{backend}"), op)
        assert "chunk_size" in inspect.signature(fn).parameters, (op, backend)
        assert fn.chunk_sizes and 64 in fn.chunk_sizes, (op, backend)


@pytest.mark.parametrize("op,backend,size,runs", [
    ("gated_delta", "chunk", 128, "16, 32, 64"), ("gated_delta", "fused", 128, "16, 32, 64"),
    ("gla", "chunk", 256, "16, 32, 64, 128"), ("ssd", "fused", 256, "16, 32, 64, 128"),
    ("gla", "naive", 48, "16, 32, 64, 128, 256")])
def test_unsupported_chunk_size_is_refused_at_resolution(op, backend, size, runs):
    with pytest.raises(BackendError, match=rf"op '{op}', backend '{backend}.*chunk size {size} is not supported; "
                                           rf"it runs chunk sizes {runs}\. Set --model.chunk_size"):
        get_op(op, backend, chunk_size=size)


def test_fused_gla_chunk_sizes_follow_its_components():
    """fused[chunk] runs 256 (sub-blocks); fused[state] alone is the chunkwise stages, which stop at 128."""
    assert get_op("gla", "fused", frozenset({"chunk"}), chunk_size=256).chunk_sizes[-1] == 256
    with pytest.raises(BackendError, match=r"backend 'fused\[state\]'.*chunk size 256"):
        get_op("gla", "fused", frozenset({"state"}), chunk_size=256)


def test_model_refuses_a_chunk_size_its_backend_cannot_run_when_built():
    """On the meta device, as train.py builds it before any data is prepared."""
    with torch.device("meta"), pytest.raises(BackendError, match="chunk sizes 16, 32, 64"):
        build_model(cfg_of("gated_deltanet", backend="chunk", chunk_size=128))


@pytest.mark.parametrize("family,op", [("gla", "gla"), ("gated_deltanet", "gated_delta"), ("mamba2", "ssd")])
@pytest.mark.parametrize("backend", ["naive", "chunk"])
def test_model_hands_its_chunk_size_to_the_op(family, op, backend, device, monkeypatch):
    """The mixer calls its op with chunk_size = model.chunk_size (a spy on the op records it)."""
    seen = []
    model = build_model(cfg_of(family, backend=backend, chunk_size=16)).to(device)
    mixer = model.blocks[0].mixer
    real = getattr(mixer, op)

    def spy(*args, **kwargs):
        seen.append(kwargs.get("chunk_size"))
        return real(*args, **kwargs)
    for block in model.blocks:
        monkeypatch.setattr(block.mixer, op, spy)
    model(torch.randint(0, 64, (1, 20), device=device))
    assert seen == [16]


@pytest.mark.parametrize("op,backend", [("gla", "chunk"), ("gla", "fused"), ("ssd", "chunk"), ("ssd", "fused"),
                                        ("gated_delta", "chunk")])
def test_float64_is_a_backend_error_naming_the_dtypes(op, backend):
    fn = get_op(op, backend)
    x = torch.zeros(1, 8, 1, 16, dtype=torch.float64)
    args = {"gla": (x, x, x, x), "ssd": (x, x[..., 0], torch.zeros(1), x, x),
            "gated_delta": (x, x, x, x[..., 0], x[..., 0])}[op]
    with pytest.raises(BackendError, match=rf"op '{op}', backend '{backend}'.*torch.float64 are not supported; "
                                           "it takes float32, bfloat16, float16"):
        fn(*args)


@pytest.mark.parametrize("family,ops", [("gla", ("gla", "proj_in", "proj_out")),
                                        ("gated_deltanet", ("gated_delta", "gdn_proj_in", "proj_out")),
                                        ("mamba2", ("ssd", "mamba2_proj_in", "proj_out")),
                                        ("gpt2_ramla", ("ramla",))])
def test_fused_ops_report_their_plan(family, ops):
    """Every op of a fused model says what it launches at the model's shapes (train.py logs these lines)."""
    model = build_model(cfg_of(family, backend="fused"))
    plans = model.kernel_plans(8, 2048, torch.bfloat16, torch.device("cpu"))
    assert [p.split(" ")[0] for p in plans] == list(ops)
    assert all("fused" in p.split(":")[0] for p in plans), plans


def test_gla_plan_follows_the_decisions():
    """At gla_125m's layer the forward is the one-launch scan; one long sequence splits the state pass and takes the
    stages; chunk 256 is four sub-blocks of 64."""
    fn, cpu = get_op("gla", "fused"), torch.device("cpu")
    dims = dict(H=12, K=64, V=64, dtype=torch.bfloat16)
    assert "one-launch scan" in fn.plan(cpu, B=8, T=2048, chunk_size=64, **dims)
    long = fn.plan(cpu, B=1, T=65536, chunk_size=64, **dims)
    assert "stages" in long and "ranges" in long
    assert "4 sub-blocks of 64" in fn.plan(cpu, B=8, T=2048, chunk_size=256, **dims)
    assert "sequential" in get_op("gla", "chunk").plan(cpu, B=1, T=65536, chunk_size=64, **dims)


def test_naive_models_report_no_plan():
    cfg = dataclasses.replace(cfg_of("gla"), backend="naive")
    assert build_model(cfg).kernel_plans(8, 2048, torch.float32, torch.device("cpu")) == []


@pytest.mark.parametrize("family", ["gla", "gated_deltanet"])
def test_output_norm_eps_is_its_own_setting(family):
    """model.o_norm_eps sets the per-head output norm's eps (which the fused proj_out receives); 0 → norm_eps."""
    assert build_model(cfg_of(family)).blocks[0].mixer.o_norm.eps == 1e-6
    mixer = build_model(cfg_of(family, o_norm_eps=1e-2, norm_eps=1e-5)).blocks[0].mixer
    assert mixer.o_norm.eps == 1e-2 and build_model(cfg_of(family, norm_eps=1e-5)).blocks[0].mixer.o_norm.eps == 1e-5
