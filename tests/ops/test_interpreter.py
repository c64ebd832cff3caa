"""ops/interpreter.py: the backport that lets Triton 3.6's interpreter run under numpy ≥ 2.5.

CI has a Triton with the fix (3.7+), so the backport is exercised here against a stand-in for 3.6's patch function.
Under the real Triton 3.6.0 with numpy 2.5.2 (the H100 image) it is what lets check_sm80's capture and the CPU
interpreter tests run at all.
"""
from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest

from ops.interpreter import backport_scalar_index

triton = pytest.importorskip("triton")
interpreter = pytest.importorskip("triton.runtime.interpreter")


class Scope:
    def set_attr(self, obj, name, value):
        setattr(obj, name, value)


class Handle:
    data = np.array([7])           # the interpreter's scalar: a 1-element array


def triton36_patch(tensor, scope):
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))


def scalar_index(monkeypatch, version: str, interpret: str = "1") -> int:
    """range() over a stand-in scalar after backport_scalar_index, with numpy 2.5's refusal as an error."""
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    monkeypatch.setattr(triton, "__version__", version)
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", triton36_patch)
    backport_scalar_index()
    backport_scalar_index()        # idempotent: a second call wraps nothing twice

    class Tensor:
        handle = Handle()

    interpreter._patch_lang_tensor(Tensor, Scope())
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)   # numpy < 2.5 warns where 2.5 raises
        return len(range(Tensor()))


def test_backport_squeezes_the_scalar_on_triton_3_6(monkeypatch):
    assert scalar_index(monkeypatch, "3.6.0") == 7
    assert getattr(interpreter._patch_lang_tensor, "squeezes_index", False)
    assert interpreter._patch_lang_tensor.__closure__[0].cell_contents is triton36_patch   # wrapped once


@pytest.mark.parametrize("version, interpret", [("3.7.0", "1"), ("3.9.0", "1"), ("3.6.0", "0")])
def test_backport_leaves_fixed_tritons_and_gpu_runs_alone(monkeypatch, version, interpret):
    with pytest.raises((TypeError, DeprecationWarning)):   # 3.6's int() of the array, left as it is
        scalar_index(monkeypatch, version, interpret)
    assert interpreter._patch_lang_tensor is triton36_patch


def test_backport_without_triton_does_nothing(monkeypatch):
    """conftest sets TRITON_INTERPRET=1 on any machine without a GPU, also where Triton is not installed (macOS)."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises((TypeError, DeprecationWarning)):
        scalar_index(monkeypatch, "3.6.0")
    assert interpreter._patch_lang_tensor is triton36_patch
