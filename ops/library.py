"""Kernel entry points as PyTorch operators, so that `torch.compile(model, fullgraph=True)` traces through them.

Every Triton or CUDA entry point is a `torch.library.custom_op` in the `chunkfuse` namespace. Dynamo and
AOTAutograd never look inside one: they trace its fake implementation (shapes, dtypes, strides only), and its
gradient is the formula registered with `register_autograd`. The body runs eagerly whether or not the model is
compiled, so tile planning, device queries and kernel launches stay plain Python. (A `triton_op` would let Inductor
see the kernels, but its fake pass runs the kernel body, which cannot run on CPU tracing, and Inductor types Python
float kernel arguments as fp64; the kernels here are fused by hand, so there is little left for Inductor to fuse.)

What custom_op requires of every op here:
- outputs are fresh, contiguous tensors: never an input or a view of one, never two views of one buffer (slice a
  single output outside the op instead);
- no None among the outputs: an output not asked for is a 0-element tensor (`absent`), turned back into None by the
  caller, which knows whether it asked (`maybe`);
- what the backward needs is returned as an extra output and marked non-differentiable in setup_context, since an
  op has no ctx of its own;
- grad mode is off inside the body and autocast does not reach its inputs: decide both outside and pass the result;
- the gradients reaching the backward may be expanded or strided (the gradient of a sum has stride 0), so the
  backward makes them contiguous before any kernel sees them (`contiguous`).

Inductor's and AOTAutograd's on-disk caches key a compiled graph on the graph, not on the fake implementations of
the operators it calls. After an update that changes what an operator returns (the order or strides of its
outputs), a graph cached by the old code fails its stride checks at the first step. Importing this module therefore
adds `chunkfuse-<hash of ops/'s sources>` to torch.compile's cache key tag (`source_tag`; a tag the user set is
kept), so each version of the operators has its own cache entries.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from pathlib import Path

import torch

NAMESPACE = "chunkfuse"


def source_tag(root: Path = Path(__file__).parent) -> str:
    """16 hex digits of the SHA-256 of every .py file under root (paths and contents, in sorted order)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


CACHE_TAG = f"chunkfuse-{source_tag()}"
if CACHE_TAG not in torch.compiler.config.cache_key_tag.split("|"):
    torch.compiler.config.cache_key_tag = "|".join(t for t in (torch.compiler.config.cache_key_tag, CACHE_TAG) if t)


class KernelOp:
    """An operator that, eagerly, skips the dispatcher. A custom_op call costs about 25 µs more host time than the
    same body behind a `torch.autograd.Function` (the dispatcher, schema and pytree work), which is most of an eager
    step's launch budget at 340M. So where nothing traces (no torch.compile, plain tensors only), the body and the
    registered setup_context/backward run through one generic autograd.Function; under Dynamo, AOTAutograd, FSDP's
    DTensors or any other tensor subclass, the call is the operator itself. Both paths run the same three functions.
    """

    def __init__(self, op: Callable, fn: Callable) -> None:
        self.op, self.fn, self.setup_context, self.backward = op, fn, None, None
        self.signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)

    def register_autograd(self, backward: Callable, setup_context: Callable) -> None:
        self.op.register_autograd(backward, setup_context=setup_context)
        self.setup_context, self.backward = setup_context, backward

    def __call__(self, *args, **kwargs):
        if kwargs:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            args = bound.args
        if torch.compiler.is_compiling() or any(_traced(a) for a in args):
            return self.op(*args)
        if self.backward is not None:
            return _Eager.apply(*args, self)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return self.op(*args)       # no formula: the operator raises autograd's error if a gradient is asked
        with torch.no_grad():
            return self.fn(*args)


def _traced(a: object) -> bool:
    return isinstance(a, torch.Tensor) and type(a) is not torch.Tensor and type(a) is not torch.nn.Parameter


class _Eager(torch.autograd.Function):
    """A KernelOp's body and gradient formula without the dispatcher. Inputs: the op's arguments, then the KernelOp
    (last, so that ctx.needs_input_grad[i] is still the op's i-th argument). The intermediates an op returns for its
    backward are marked non-differentiable; autograd would hand the backward a zero-filled gradient for each (a fill
    kernel the size of the tensor), so grads are not materialised: those arrive as None, and only a differentiable
    output that received no gradient gets zeros, as autograd would give it."""

    @staticmethod
    def forward(*args):
        return args[-1].fn(*args[:-1])

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.kernel_op = inputs[-1]
        ctx.kernel_op.setup_context(ctx, inputs[:-1], output)
        ctx.set_materialize_grads(False)
        outs = output if isinstance(output, tuple) else (output,)
        frozen = {id(t) for t in getattr(ctx, "non_differentiable", None) or ()}   # mark_non_differentiable's record
        ctx.zero_like = [None if id(o) in frozen or not o.is_floating_point() else (o.shape, o.dtype, o.device)
                         for o in outs]

    @staticmethod
    def backward(ctx, *grads):
        grads = tuple(torch.zeros(meta[0], dtype=meta[1], device=meta[2]) if g is None and meta is not None else g
                      for g, meta in zip(grads, ctx.zero_like))
        return (*ctx.kernel_op.backward(ctx, *grads), None)


def kernel_op(name: str, fake: Callable, mutates_args: tuple[str, ...] = ()) -> Callable[[Callable], KernelOp]:
    """Decorator: the function becomes the operator `chunkfuse::<name>` with `fake` as its fake implementation,
    called through a KernelOp. The function needs full type hints (they become the operator's schema)."""
    def wrap(fn: Callable) -> KernelOp:
        op = torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=mutates_args)(fn)
        op.register_fake(fake)
        return KernelOp(op, fn)
    return wrap


def absent(like: torch.Tensor) -> torch.Tensor:
    """The stand-in for an output that was not asked for: 0 elements, on `like`'s device."""
    return like.new_empty(0)


def maybe(t: torch.Tensor, wanted: bool) -> torch.Tensor | None:
    """An op's optional output back as the caller's tensor or None."""
    return t if wanted else None


def contiguous(*grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """Incoming gradients as contiguous tensors (None stays None)."""
    return tuple(None if g is None else g.contiguous() for g in grads)
