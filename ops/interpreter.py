"""Triton's CPU interpreter (TRITON_INTERPRET=1: the CPU tests, the sm80 compile check) on Triton ≤ 3.6 with
numpy ≥ 2.5.

Triton 3.6's interpreter turns a scalar into an index with int() of its 1-element array, which numpy 2.5 refuses
("only 0-dimensional arrays can be converted to Python scalars"), so every kernel whose loop is bounded by a program
id fails under torch 2.11 (which pins Triton 3.6) with a current numpy. Triton 3.7 squeezes the array first; on
older versions `backport_scalar_index` makes the same one-line change, and on 3.7 and later it does nothing.
"""
from __future__ import annotations

import importlib.util
import os
import re


def backport_scalar_index() -> None:
    """Under TRITON_INTERPRET=1 on Triton < 3.7, index with int() of the squeezed array, as Triton 3.7 does.
    Idempotent; a no-op without the interpreter or on a Triton that has the fix."""
    if os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None:
        return      # no interpreter in use, or no Triton at all (macOS): the Triton backends say so when asked for
    import triton

    if tuple(map(int, re.match(r"(\d+)\.(\d+)", triton.__version__).groups())) >= (3, 7):
        return
    import triton.runtime.interpreter as interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)    # sets __index__ whenever a kernel runs
    if patch is None or getattr(patch, "squeezes_index", False):
        return

    def patch_squeezed(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_squeezed.squeezes_index = True
    interpreter._patch_lang_tensor = patch_squeezed
