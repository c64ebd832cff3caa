"""The backend registry: every op is `ops/<op>/<backend>.py` exposing a function named `<op>`.

    gla = get_op("gla", "naive", chunk_size=64)     # resolve once, outside forward
    o, final_state = gla(q, k, v, gk, chunk_size=64)

All backends of an op share one signature (tests/ops/test_registry.py checks it). A backend that is
missing or cannot run here raises BackendError naming the op, the backend and the remedy; there
is never a silent fallback to another backend.

A backend function may declare, with `@backend_fn`, the chunk sizes it runs (the chunkwise ops: get_op refuses
any other at start-up) and a `plan(device, **dims) -> str` that says which kernels it launches at the model's
shapes (train.py logs it). The `fused` backend is built from components that `--fuse` switches one by one for
ablations: `get_op(op, "fused", fuse={"chunk"})`. A fused op module lists the components it has in COMPONENTS
and builds the op for a subset with build(fuse); asking for one it lacks is an error.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import Callable

from utils.errors import UserError
from ops.interpreter import backport_scalar_index

# Registered by name, not discovered: an op folder also holds kernel modules (kernels.py, far.py, ...).
# tests/ops/test_registry.py fails on a module that implements an op but is missing here.
BACKENDS = ("naive", "chunk", "fused", "fla")
# `proj` is the layer-level projection-chain ops that a mixer resolves beside its own op (model.common.resolve_proj),
# so a mixer op is never asked for it; `state` and `chunk` live in the mixer ops.
FUSE_COMPONENTS = ("proj", "state", "chunk")
_ROOT = Path(__file__).parent
backport_scalar_index()    # before any kernel runs under TRITON_INTERPRET=1 on Triton 3.6


class BackendError(UserError, RuntimeError):
    pass


def backend_fn(*, chunk_sizes: tuple[int, ...] | None = None, plan: Callable[..., str] | None = None,
               trains: bool = True) -> Callable[[Callable], Callable]:
    """Mark a backend's op function with what the registry and the run log read from it: `chunk_sizes`, the chunk
    sizes it runs (chunkwise ops), `plan(device, **dims) -> str`, the kernels it launches at those dims, and
    `trains`, False for a forward-only kernel (evaluation and generation), which train.py refuses at start-up."""
    def mark(fn: Callable) -> Callable:
        fn.chunk_sizes, fn.plan, fn.trains = chunk_sizes, plan, trains
        return fn
    return mark


def check_chunk_size(op: str, backend: str, chunk_size: int, sizes: tuple[int, ...]) -> None:
    """The BackendError for a chunk size the backend does not run, naming the sizes it does."""
    if chunk_size not in sizes:
        raise BackendError(f"op {op!r}, backend {backend!r}: chunk size {chunk_size} is not supported; it runs chunk "
                           f"sizes {', '.join(map(str, sizes))}. Set --model.chunk_size to one of them, or choose "
                           "another --backend")


def list_ops() -> list[str]:
    return sorted(p.name for p in _ROOT.iterdir() if (p / "naive.py").is_file())


def list_backends(op: str) -> list[str]:
    return [b for b in BACKENDS if (_ROOT / op / f"{b}.py").is_file()]


def parse_fuse(spec: str | None) -> frozenset[str] | None:
    """`--fuse proj,chunk` → {"proj", "chunk"}; None or "" → None (every component a fused op has)."""
    if not spec:
        return None
    names = frozenset(s.strip() for s in spec.split(",") if s.strip())
    unknown = sorted(names - set(FUSE_COMPONENTS))
    if unknown:
        raise BackendError(f"unknown fused component(s) {', '.join(unknown)} in --fuse; components: "
                           f"{', '.join(FUSE_COMPONENTS)}")
    return names


def get_op(op: str, backend: str, fuse: frozenset[str] | None = None, chunk_size: int | None = None) -> Callable:
    """The function implementing `op` on `backend`, after checking it can run on this machine.
    fuse (backend `fused` only): the components to fuse, None for all that the op has.
    chunk_size: checked against the function's chunk_sizes (chunkwise ops; ignored by the others)."""
    fn = _resolve(op, backend, fuse)
    sizes = getattr(fn, "chunk_sizes", None)
    if chunk_size is not None and sizes is not None:
        check_chunk_size(op, fused_label(op, backend, fuse), chunk_size, sizes)
    return fn


def _resolve(op: str, backend: str, fuse: frozenset[str] | None) -> Callable:
    if op not in list_ops():
        raise BackendError(f"unknown op {op!r}; ops: {', '.join(list_ops())}")
    if backend not in BACKENDS:
        hint = (f"; ops/{op}/{backend}.py exists: register the backend by adding {backend!r} to ops.BACKENDS"
                if (_ROOT / op / f"{backend}.py").is_file() else "")
        raise BackendError(f"unknown backend {backend!r} for op {op!r}; backends: {', '.join(BACKENDS)}{hint}")
    have = list_backends(op)
    if backend not in have:
        raise BackendError(f"op {op!r} has no {backend!r} backend (ops/{op}/{backend}.py does not "
                           f"exist yet); implemented: {', '.join(have)}. Choose one of those with --backend.")
    module = importlib.import_module(f"ops.{op}.{backend}")
    check = getattr(module, "check_available", None)
    if check is not None:
        check(op, backend)        # one check can serve many modules (check_triton_device, require_fla)
    if not callable(getattr(module, op, None)):
        raise BackendError(f"ops/{op}/{backend}.py defines no function {op!r}: a backend module implements its op "
                           f"in a function named after the op, with the signature of ops/{op}/naive.py")
    if fuse is None:
        return getattr(module, op)
    if backend != "fused":
        raise BackendError(f"op {op!r}: --fuse chooses components of the 'fused' backend, but the backend is "
                           f"{backend!r}; add --backend fused or drop --fuse")
    lacking = sorted((fuse - {"proj"}) - set(module.COMPONENTS))
    if lacking:
        has = (f"has: {', '.join(module.COMPONENTS)}" if module.COMPONENTS else "has no fused components to choose")
        raise BackendError(f"op {op!r}, backend 'fused': no fused {', '.join(lacking)} component yet "
                           f"(ops/{op}/fused.py {has}); drop it from --fuse")
    return module.build(fuse)


def fused_label(op: str, backend: str, fuse: frozenset[str] | None) -> str:
    """The backend as the run log records it: `fused[chunk]` names the components actually fused."""
    if backend != "fused":
        return backend
    have = importlib.import_module(f"ops.{op}.fused").COMPONENTS
    return f"fused[{','.join(c for c in have if fuse is None or c in fuse)}]"


def kernel_plan(fn: Callable, device, **dims) -> str | None:
    """What `fn` (an op function get_op returned) launches at `dims` on `device`, or None where it says nothing."""
    plan = getattr(fn, "plan", None)
    return plan(device, **dims) if plan is not None else None


def split_backends(spec: str) -> list[str]:
    """`naive,fused[chunk,state]` → ["naive", "fused[chunk,state]"]: commas inside brackets stay."""
    return [b.strip() for b in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", spec) if b.strip()]


def parse_backend(spec: str) -> tuple[str, str]:
    """A backend as scripts name it: `fused[state]` → ("fused", "state") (the --fuse components, the
    form fused_label writes); a plain name → (name, "")."""
    m = re.fullmatch(r"(\w+)(?:\[([\w,+]*)\])?", spec.strip())
    if m is None:
        raise BackendError(f"backend {spec!r}: expected a name like 'chunk' or 'fused[state]'")
    name, fuse = m.group(1), (m.group(2) or "").replace("+", ",")
    if fuse and name != "fused":
        raise BackendError(f"backend {spec!r}: only 'fused' takes components in brackets")
    return name, fuse


def require_fla(op: str, backend: str = "fla") -> None:
    """The `fla` backend's availability check (`check_available`), shared by every op that has one."""
    import torch

    if importlib.util.find_spec("fla") is None:
        raise BackendError(f"op {op!r}, backend {backend!r}: flash-linear-attention is not installed. Install it with "
                           "pip install \"flash-linear-attention>=0.6.0\" (or pip install -e \".[fla]\" in this "
                           "checkout; on a machine without internet, install its wheels with pip), or choose another "
                           "--backend")
    if not torch.cuda.is_available():
        raise BackendError(f"op {op!r}, backend {backend!r}: flash-linear-attention's kernels need a CUDA GPU; "
                           "on this machine use --backend naive")
