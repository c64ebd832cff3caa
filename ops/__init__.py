"""The backend registry: every op is `ops/<op>/<backend>.py` exposing a function named `<op>`.

    gla = get_op("gla", "naive")     # resolve once, outside forward
    o, final_state = gla(q, k, v, gk)

All backends of an op share one signature (tests/ops/test_registry.py checks it). A backend that is
missing or cannot run here raises BackendError naming the op, the backend and the remedy; there
is never a silent fallback to another backend.
"""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Callable

BACKENDS = ("naive", "chunk", "fused", "fla")
_ROOT = Path(__file__).parent


class BackendError(RuntimeError):
    pass


def list_ops() -> list[str]:
    return sorted(p.name for p in _ROOT.iterdir() if (p / "naive.py").is_file())


def list_backends(op: str) -> list[str]:
    return [b for b in BACKENDS if (_ROOT / op / f"{b}.py").is_file()]


def get_op(op: str, backend: str) -> Callable:
    """The function implementing `op` on `backend`, after checking it can run on this machine."""
    if op not in list_ops():
        raise BackendError(f"unknown op {op!r}; ops: {', '.join(list_ops())}")
    if backend not in BACKENDS:
        raise BackendError(f"unknown backend {backend!r} for op {op!r}; backends: {', '.join(BACKENDS)}")
    have = list_backends(op)
    if backend not in have:
        raise BackendError(f"op {op!r} has no {backend!r} backend (ops/{op}/{backend}.py does not "
                           f"exist yet); implemented: {', '.join(have)}. Choose one of those with --backend.")
    module = importlib.import_module(f"ops.{op}.{backend}")
    check = getattr(module, "check_available", None)
    if check is not None:
        check()
    return getattr(module, op)


def require_fla(op: str) -> None:
    """The `fla` backend's availability check, shared by every op that has one."""
    import torch

    if importlib.util.find_spec("fla") is None:
        raise BackendError(f"op {op!r}, backend 'fla': flash-linear-attention is not installed; "
                           "pip install -e '.[fla]' (offline: the fla wheels in ../shared/wheels) or "
                           "choose another --backend")
    if not torch.cuda.is_available():
        raise BackendError(f"op {op!r}, backend 'fla': flash-linear-attention's kernels need a CUDA GPU; "
                           "on this machine use --backend naive")
