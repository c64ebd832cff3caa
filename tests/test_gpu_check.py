"""scripts/gpu_check.sh's plumbing (its steps need a GPU): the documented flags, a refused unknown one, and a run
whose failing step leaves its log, a table row and exit status 1."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
SCRIPT = str(REPO / "scripts" / "gpu_check.sh")


def test_help_documents_every_flag():
    out = subprocess.run(["bash", SCRIPT, "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--out", "--tests", "-k", "--workers", "--no-tests", "--fla", "--site", "--bench", "--throughput",
                 "--tp-backends", "--timeout", "--triton-cache"):
        assert f"\n  {flag} " in out, flag
    assert 'pytest -q -ra -m "not slow"' in out and "--no-index --no-deps --target" in out


def test_unknown_flag_is_refused():
    r = subprocess.run(["bash", SCRIPT, "--bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown argument --bogus" in r.stderr


def test_failing_step_is_a_row_and_the_exit_status(tmp_path):
    """The bench step with an unknown op fails: its log is kept, the table says FAILED, the script exits 1. The steps
    run this interpreter (PYTHON), whether or not its environment is on PATH."""
    r = subprocess.run(["bash", SCRIPT, "--out", str(tmp_path), "--no-tests", "--bench", "--ops nope",
                        "--triton-cache", str(tmp_path / "cache")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 1, r.stdout + r.stderr
    table = r.stdout[r.stdout.index("step        status"):]
    assert "bench       FAILED (exit 2)" in table and str(tmp_path / "bench.log") in table
    assert "unknown op(s) nope" in (tmp_path / "bench.log").read_text()
    assert (tmp_path / "env.log").is_file()
