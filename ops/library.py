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
"""
from __future__ import annotations

from collections.abc import Callable

import torch

NAMESPACE = "chunkfuse"


def kernel_op(name: str, fake: Callable, mutates_args: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator: the function becomes the operator `chunkfuse::<name>` with `fake` as its fake implementation.
    The function needs full type hints (they become the operator's schema)."""
    def wrap(fn: Callable) -> Callable:
        op = torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=mutates_args)(fn)
        op.register_fake(fake)
        return op
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
