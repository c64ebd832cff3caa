"""ops/triton_utils.py's host helpers: cdiv and next_power_of_2 give triton's values as plain Python, and a fused
operator's launch path no longer goes through triton's constexpr-function wrapper."""
from __future__ import annotations

import triton

from ops.triton_utils import cdiv, next_power_of_2, tile


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
