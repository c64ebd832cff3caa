"""Every Python file in the repository passes pyflakes: no unused imports or variables, no undefined names, no
f-strings without fields. A dead load in a Triton kernel (fused_chunk.py's b_qj, 2026-11-25) is what this finds."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("pyflakes", reason="pyflakes is in requirements.txt; the GPU machine's image lacks it")
from pyflakes.api import checkPath  # noqa: E402
from pyflakes.reporter import Reporter  # noqa: E402

SKIP = {"runs", "build", "dist", "node_modules"}     # outputs, not sources; dot-folders (.venv, .carry) too


def sources() -> list[Path]:
    out = []
    for p in sorted(REPO.rglob("*.py")):
        parts = p.relative_to(REPO).parts[:-1]
        if not any(d.startswith(".") or d in SKIP or d.endswith(".egg-info") for d in parts):
            out.append(p)
    return out


def test_pyflakes_clean():
    files = sources()
    assert len(files) > 100, f"found only {len(files)} Python files under {REPO}"
    warnings, errors = io.StringIO(), io.StringIO()
    count = sum(checkPath(str(p), Reporter(warnings, errors)) for p in files)
    assert count == 0, "pyflakes:\n" + warnings.getvalue() + errors.getvalue()
