"""The backend registry: one signature per op, errors that name op, backend and remedy."""
from __future__ import annotations

import importlib
import inspect

import pytest

from ops import BACKENDS, BackendError, get_op, list_backends, list_ops


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
        assert list(sig.parameters) == list(ref.parameters), backend
        assert [p.default for p in sig.parameters.values()] == [p.default for p in ref.parameters.values()], backend


def test_unknown_op_lists_ops():
    with pytest.raises(BackendError, match="unknown op 'nope'.*gla"):
        get_op("nope", "naive")


def test_unknown_backend_lists_backends():
    with pytest.raises(BackendError, match="unknown backend 'fast'.*naive, chunk, fused, fla"):
        get_op("gla", "fast")


def test_missing_backend_names_op_backend_and_remedy():
    missing = [b for b in BACKENDS if b not in list_backends("gla")]
    assert missing, "every backend exists: replace this test's example"
    with pytest.raises(BackendError, match=f"op 'gla' has no '{missing[0]}' backend.*--backend"):
        get_op("gla", missing[0])


def test_fla_backend_unavailable_is_an_error(monkeypatch):
    import importlib.util

    import torch
    if importlib.util.find_spec("fla") is not None and torch.cuda.is_available():
        pytest.skip("fla can run here")
    with pytest.raises(BackendError, match="op 'gla'.*'fla'"):
        get_op("gla", "fla")
