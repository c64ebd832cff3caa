"""The backend registry: one signature per op, errors that name op, backend and remedy."""
from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from ops import (BACKENDS, BackendError, fused_label, get_op, list_backends, list_ops, parse_backend, parse_fuse,
                 split_backends)


def test_every_op_has_an_oracle():
    assert "gla" in list_ops()
    for op in list_ops():
        assert "naive" in list_backends(op)


@pytest.mark.parametrize("op", list_ops())
def test_backends_share_one_signature(op):
    sigs = {b: inspect.signature(getattr(importlib.import_module(f"ops.{op}.{b}"), op))
            for b in list_backends(op)}
    ref = sigs["naive"]
    for backend, sig in sigs.items():
        assert [(p.name, p.kind, p.default) for p in sig.parameters.values()] == \
            [(p.name, p.kind, p.default) for p in ref.parameters.values()], backend


def implements(path: Path, op: str) -> bool:
    """Whether a module defines (or binds) a top-level name `op`, read without importing it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == op:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == op for t in targets):
                return True
    return False


@pytest.mark.parametrize("op", list_ops())
def test_every_module_that_implements_an_op_is_a_registered_backend(op):
    """A new ops/<op>/<name>.py with its function but no entry in ops.BACKENDS was invisible: no signature check,
    no numeric test, and `--backend <name>` an "unknown backend" error."""
    folder = Path(importlib.import_module("ops").__file__).parent / op
    unregistered = [p.name for p in sorted(folder.glob("*.py")) if implements(p, op) and p.stem not in BACKENDS]
    assert not unregistered, f"ops/{op}/: {unregistered} implement {op!r} but are not in ops.BACKENDS"


def test_an_unregistered_backend_file_is_named(tmp_path, monkeypatch):
    import ops

    (tmp_path / "gla").mkdir()
    for name in ("naive.py", "einsum.py"):
        (tmp_path / "gla" / name).write_text("def gla(q):\n    return q\n")
    monkeypatch.setattr(ops, "_ROOT", tmp_path)
    with pytest.raises(BackendError, match="ops/gla/einsum.py exists: register.*ops.BACKENDS"):
        get_op("gla", "einsum")


def test_a_backend_module_without_the_op_function_is_named(monkeypatch):
    import ops.gla.chunk as chunk

    monkeypatch.delattr(chunk, "gla")
    monkeypatch.setattr(chunk, "check_available", lambda op, backend: None)
    with pytest.raises(BackendError, match="ops/gla/chunk.py defines no function 'gla'"):
        get_op("gla", "chunk")


def test_unknown_op_lists_ops():
    with pytest.raises(BackendError, match="unknown op 'nope'.*gla"):
        get_op("nope", "naive")


def test_unknown_backend_lists_backends():
    with pytest.raises(BackendError, match="unknown backend 'fast'.*naive, chunk, fused, fla"):
        get_op("gla", "fast")


def test_missing_backend_names_op_backend_and_remedy():
    missing = [(op, b) for op in list_ops() for b in BACKENDS if b not in list_backends(op)]
    assert missing, "every op has every backend: replace this test's example"
    op, backend = missing[0]
    with pytest.raises(BackendError, match=f"op '{op}' has no '{backend}' backend.*--backend"):
        get_op(op, backend)


def test_fuse_components_select_the_fused_op():
    from ops.gla import chunk, fused

    assert get_op("gla", "fused") is fused.gla
    assert get_op("gla", "fused", parse_fuse("state,chunk")) is fused.gla
    assert get_op("gla", "fused", parse_fuse("chunk")) not in (fused.gla, chunk.gla)
    assert get_op("gla", "fused", frozenset()) is chunk.gla            # nothing fused: the ablation baseline
    assert fused_label("gla", "fused", None) == "fused[chunk,state]"
    assert fused_label("gla", "fused", parse_fuse("chunk")) == "fused[chunk]"
    assert fused_label("gla", "fused", frozenset()) == "fused[]"
    assert fused_label("gla", "chunk", None) == "chunk"


def test_fuse_errors_name_the_component_and_the_remedy():
    with pytest.raises(BackendError, match="unknown fused component.*warp.*components: proj, state, chunk"):
        parse_fuse("chunk,warp")
    with pytest.raises(BackendError, match="op 'ssd'.*no fused chunk component.*drop it from --fuse"):
        get_op("ssd", "fused", parse_fuse("state,chunk"))
    with pytest.raises(BackendError, match="op 'gla'.*backend is 'chunk'.*--backend fused"):
        get_op("gla", "chunk", parse_fuse("chunk"))


def test_model_refuses_an_unbuilt_proj_component():
    from model import build_model
    from model.config import ModelConfig

    cfg = ModelConfig(family="gpt2", backend="fused", fuse="proj", d_model=32, n_layers=1, n_heads=2, vocab_size=64)
    with pytest.raises(BackendError, match="'proj' component.*not implemented.*drop it from --fuse"):
        build_model(cfg)


def test_fla_backend_unavailable_is_an_error(monkeypatch):
    import importlib.util

    import torch
    if importlib.util.find_spec("fla") is not None and torch.cuda.is_available():
        pytest.skip("fla can run here")
    with pytest.raises(BackendError, match="op 'gla'.*'fla'"):
        get_op("gla", "fla")


TRITON_ON_CPU = [(op, b) for op in list_ops() for b in ("chunk", "fused") if b in list_backends(op)]


@pytest.mark.parametrize("op, backend", TRITON_ON_CPU)
def test_a_gpu_backend_on_cpu_names_the_op_and_backend_asked_for(op, backend, monkeypatch):
    """`--backend fused` used to be reported as "the 'chunk' backend" (one shared check that named no caller)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(BackendError, match=f"^op '{op}', backend '{backend}': .*CUDA GPU.*--backend naive") as e:
        get_op(op, backend)
    if op != "attention":   # the CUDA extension, not Triton: the interpreter cannot stand in for it
        assert "TRITON_INTERPRET=1" in str(e.value) and "'chunk' backend" not in str(e.value)


def test_fla_missing_says_what_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fla" else real(name, *a))
    with pytest.raises(BackendError) as e:
        get_op("gla", "fla")
    msg = str(e.value)
    assert 'pip install "flash-linear-attention>=0.6.0"' in msg and 'pip install -e ".[fla]"' in msg
    assert "install its wheels with pip" in msg and "shared/wheels" not in msg


def test_fuse_on_an_op_without_components_says_so():
    with pytest.raises(BackendError, match=r"op 'gated_delta'.*no fused state component.*"
                                           r"\(ops/gated_delta/fused.py has no fused components to choose\)"):
        get_op("gated_delta", "fused", parse_fuse("state"))
    with pytest.raises(BackendError, match=r"\(ops/ssd/fused.py has: state\)"):
        get_op("ssd", "fused", parse_fuse("chunk"))


def test_backend_specs_name_fused_components():
    assert split_backends("naive, fused[chunk,state],fla") == ["naive", "fused[chunk,state]", "fla"]
    assert parse_backend("chunk") == ("chunk", "")
    assert parse_backend("fused[state]") == ("fused", "state")
    assert parse_backend("fused[chunk+state]") == ("fused", "chunk,state")
    with pytest.raises(BackendError, match="only 'fused'"):
        parse_backend("chunk[state]")
    with pytest.raises(BackendError, match="fused\\[state\\]"):
        parse_backend("fused(state)")
