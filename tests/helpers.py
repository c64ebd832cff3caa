"""Comparison helpers shared by the tests."""
from __future__ import annotations

from collections.abc import Callable

import torch


def reset_accelerate() -> None:
    """Forget accelerate's process-wide state, so that the next in-process train.main builds its own."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


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
    """‖a − b‖ / ‖b‖ in float64; a NaN anywhere makes it NaN, which fails every bound."""
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


def assert_proj_model_equals_naive_fp32(cfg, seq_len: int) -> None:
    """cfg's model with only `proj` fused (the mixer on `chunk`'s stages) against its naive model, fp32, one sequence
    of seq_len tokens: the loss and logits within 1e-5, every parameter's gradient within 1e-4, and the same
    parameters with gradients. The residual enters inside the mixer there, so the block's wiring is checked too."""
    import dataclasses

    from eval.equivalence import run_backend
    from model import build_model

    torch.manual_seed(0)
    idx = torch.randint(0, cfg.vocab_size, (1, seq_len + 1))
    state = build_model(cfg).state_dict()
    ref = run_backend(cfg, state, idx, bf16=False)
    got = run_backend(dataclasses.replace(cfg, backend="fused", fuse="proj"), state, idx, bf16=False)
    assert abs(got["loss"] - ref["loss"]) < 1e-5 and rel_err(got["logits"], ref["logits"]) < 1e-5
    bad = {n: e for n, g in got["grads"].items() if not (e := rel_err(g, ref["grads"][n])) < 1e-4}
    assert not bad and got["grads"].keys() == ref["grads"].keys(), bad


def left_to_the_gpu(*indices: int) -> bool:
    """Whether a case of a rotated grid runs on a GPU only: under the interpreter (no CUDA GPU) the cases whose
    indices (profile, shape, backend, ...) sum to an odd number, so that each backend runs half the profiles on each
    shape and the other half on the next one."""
    return not torch.cuda.is_available() and sum(indices) % 2 == 1


def backends_under_test(op: str) -> list[str]:
    """Every registered backend of `op` to check against its oracle: all but `naive` (the oracle) and `fla`
    (tested beside the others where it is installed), one name per distinct function (gated_delta's `fused` is
    chunk's function). A backend added to ops.BACKENDS is tested from then on, with no list to edit here."""
    import importlib

    from ops import list_backends

    seen, out = set(), []
    for b in list_backends(op):
        fn = getattr(importlib.import_module(f"ops.{op}.{b}"), op)
        if b not in ("naive", "fla") and fn not in seen:
            seen.add(fn)
            out.append(b)
    return out


def has_triton_cuda_backend() -> bool:
    """Whether Triton's CUDA backend (and its bundled ptxas) is installed: ahead-of-time compiles for sm80/sm90
    need it, a GPU they do not."""
    try:
        from triton.backends import backends
    except ImportError:
        return False
    return "nvidia" in backends


def ssd_dg(x, dt, A, Bm, Cm, h0, dy, dh) -> torch.Tensor:
    """[B, T, H]: SSD's ∂g (g = dt·A) from the GLA recurrence in fp64 with q = C, k = B, v = dt·x (groups expanded
    to heads), for output gradients dy and final-state gradient dh."""
    from ops.gla.naive import gla_recurrent

    H, G = x.shape[2], Bm.shape[2]
    g = (dt * A)[..., None].requires_grad_()
    Bh, Ch = (m.repeat_interleave(H // G, dim=2) for m in (Bm, Cm))
    y, s = gla_recurrent(Ch, Bh, x * dt[..., None], g, 1.0, h0, True)
    (dg,) = torch.autograd.grad((y * dy).sum() + (s * dh).sum(), g)
    return dg[..., 0]


def dA_terms(x, dt, A, Bm, Cm, h0, dy, dh) -> torch.Tensor:
    """Σ_{b,t} |dt ∂g| per head [H]: the terms ∂A sums (ssd_dg)."""
    return (dt * ssd_dg(x, dt, A, Bm, Cm, h0, dy, dh)).abs().sum(dim=(0, 1))


def chunkwise_dg_terms(x, dt, A, Bm, Cm, h0, dy, dh, chunk_size: int = 64) -> torch.Tensor:
    """[B, T, H]: the scale of fp32's error in SSD's ∂g_t as the chunkwise backward forms it, ∂g_t = Σ_{s ≥ t} ∂b_s
    over t's chunk (b the chunk-local cumsum of g, ∂b_s = ∂g_s − ∂g_{s+1}, ∂g_L at a chunk's last row L; ∂g as
    ssd_dg): the larger of |∂g_t| and (Σ_{s ≥ t} ∂b_s²)^½, the rounding of the summands added in quadrature. The
    suffix adds ∂b of the steps after t, which cancel where no pair of theirs spans step t: after strong steps, a
    weak one's ∂b dwarfs the strong steps' ∂g, and ∂g keeps its rounding."""
    from ops.chunkwise.cumsum import chunk_cumsum_ref

    dg = ssd_dg(x, dt, A, Bm, Cm, h0, dy, dh)
    t = torch.arange(dg.shape[1], device=dg.device)
    last = (t % chunk_size == chunk_size - 1) | (t == dg.shape[1] - 1)
    db = dg - torch.nn.functional.pad(dg[:, 1:], (0, 0, 0, 1)).masked_fill(last[:, None], 0.0)
    suffix = chunk_cumsum_ref(db.square()[..., None], chunk_size, reverse=True)[..., 0].sqrt()
    return torch.maximum(dg.abs(), suffix)
