"""ops/triton_utils.py's host helpers: cdiv and next_power_of_2 give triton's values as plain Python, and a fused
operator's launch path no longer goes through triton's constexpr-function wrapper; sum_partials sums a gradient's
per-program partials."""
from __future__ import annotations

import pytest
import torch
import triton

from ops.triton_utils import SUM_ROWS, cdiv, next_power_of_2, sum_partials, tile


def test_host_helpers_match_triton():
    for a in range(1, 700):
        assert next_power_of_2(a) == triton.next_power_of_2(a), a
        for b in (1, 2, 3, 16, 64, 100, 128):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
    assert [tile(d) for d in (1, 16, 17, 64, 65, 256)] == [16, 16, 32, 64, 64, 64]


def test_launch_paths_call_no_constexpr_function(monkeypatch):
    """The GLA operators' host code (kernels stubbed out) makes no call to a triton constexpr function such as
    triton.cdiv: each costs microseconds of host time, and the launch path makes tens of them."""
    import torch
    from triton.runtime import interpreter, jit

    from ops.gla.fused import gla_fused_bwd, gla_fused_fwd

    calls = []
    monkeypatch.setattr(jit.ConstexprFunction, "__call__", lambda self, *a, **k: calls.append(self.fn.__name__))
    for cls in (jit.KernelInterface, interpreter.InterpretedFunction):
        monkeypatch.setattr(cls, "__getitem__", lambda self, grid: (lambda *a, **k: None))
    B, T, H, K, V = 2, 256, 2, 64, 64
    q, k = torch.empty(B, T, H, K), torch.empty(B, T, H, K)
    v, g = torch.empty(B, T, H, V), torch.empty(B, T, H, K)
    o, _, b, h = gla_fused_fwd.fn(q, k, v, g, K ** -0.5, None, False, 64, True, True, 20.0, None, 0)
    gla_fused_bwd.fn(q, k, v, g, b, h, torch.empty_like(o), None, K ** -0.5, False, 64, True, 20.0, torch.float32,
                     None, 0, None)
    assert calls == []


@pytest.mark.parametrize("shape", [(1, 5), (3, 7, 4), (72, 33), (SUM_ROWS + 37, 3), (2, 1, 9, 1)],
                         ids=["one-row", "3d", "odd", "row-loop", "4d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sum_partials_sums_the_rows(shape, dtype, device):
    """Σ over dim 0 against fp64 at odd shapes (a ragged column tile; more rows than one tile takes, so the row
    loop runs), in the requested dtype, equal on a second call (a launch-independent order). Rows of mixed sign and
    size: a sum that dropped or repeated a row, or a tile's edge, is off by far more than fp32 rounding."""
    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * torch.logspace(-3, 3, shape[0])[(...,) + (None,) * (len(shape) - 1)])
    x = x.to(device)
    out = sum_partials(x, dtype)
    ref = x.double().sum(0)
    assert out.shape == ref.shape and out.dtype == dtype, f"seed {seed}"
    bound = (2e-7 * shape[0] if dtype == torch.float32 else 8e-3) * x.double().abs().sum(0) + 1e-30
    assert bool(((out.double() - ref).abs() <= bound).all()), f"seed {seed}: {(out.double() - ref).abs().max()}"
    assert torch.equal(out, sum_partials(x, dtype)), f"seed {seed}"
