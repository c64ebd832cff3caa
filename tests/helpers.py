"""Comparison helpers shared by the tests."""
from __future__ import annotations

from collections.abc import Callable

import torch


def saved_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the distinct storages autograd saves for the backward while fn() runs, parameters not
    counted (an op's own activation memory)."""
    total, seen = 0, set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen and not isinstance(t, torch.nn.Parameter):
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64 (DESIGN §6); a NaN anywhere makes it NaN, which fails every bound."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def grads_close(got: list[torch.Tensor], ref: list[torch.Tensor], names: list[str], tol: float,
                floors: dict[str, float] | None = None, magnitudes: list[torch.Tensor] | None = None) -> None:
    """Each gradient within `tol` of its reference, relative to max(‖ref‖, 1e-3 · the largest
    reference gradient norm). The floor matters only for gradients that are vanishingly small next
    to the others: at log-decays of −100 the true ∂gk is ~1e-44 while ∂q is ~50, and a relative error
    against 1e-44 would measure rounding noise, not the kernel. `floors` adds an absolute error
    allowance per gradient where the computation's own rounding is known (see its caller).
    `magnitudes`, where given, replace the references as the scale of each error: the size of the
    terms the gradient sums (≥ |ref| entrywise), for sums that can cancel."""
    sizes = magnitudes if magnitudes is not None else ref
    scale = max(m.double().norm().item() for m in sizes)
    for name, g, r, m in zip(names, got, ref, sizes):
        err = (g.double() - r.double()).norm().item()
        bound = tol * max(m.double().norm().item(), 1e-3 * scale) + (floors or {}).get(name, 0.0)
        assert err <= bound, f"d{name}: ‖Δ‖ = {err:.3e} > {bound:.3e}"
