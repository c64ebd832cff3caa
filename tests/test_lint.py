"""Every Python file in the repository passes pyflakes: no unused imports or variables, no undefined names, no
f-strings without fields. A dead load in a Triton kernel (an unused b_qj once) is what this finds."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("pyflakes", reason="pyflakes is in requirements.txt; the GPU machine's image lacks it")
from pyflakes.api import checkPath  # noqa: E402
from pyflakes.reporter import Reporter  # noqa: E402

PACKAGES = ("bench", "data", "eval", "model", "ops", "scripts", "tests", "utils")   # the repository's own code only:
# a virtualenv or a run folder inside the checkout (venv/, runs/) is not scanned; bench/results holds no code


def sources() -> list[Path]:
    return sorted(REPO.glob("*.py")) + sorted(p for d in PACKAGES for p in (REPO / d).rglob("*.py"))


def test_every_code_folder_is_linted():
    """A new top-level folder of Python code joins PACKAGES (virtualenvs and output folders aside)."""
    other = [d.name for d in REPO.iterdir() if d.is_dir() and d.name not in PACKAGES and not d.name.startswith(".")
             and d.name not in ("runs", "build", "dist", "data_cache") and not (d / "pyvenv.cfg").exists()
             and (any(d.glob("*.py")) or any(d.glob("*/*.py")))]
    assert not other, f"add {other} to PACKAGES in tests/test_lint.py"


def test_pyflakes_clean():
    files = sources()
    assert len(files) > 100, f"found only {len(files)} Python files under {REPO}"
    warnings, errors = io.StringIO(), io.StringIO()
    count = sum(checkPath(str(p), Reporter(warnings, errors)) for p in files)
    assert count == 0, "pyflakes:\n" + warnings.getvalue() + errors.getvalue()
