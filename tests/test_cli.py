"""utils.cli.run_cli, the scripts' `__main__` wrapper: a user's mistake is one `error:` line and exit 1, Ctrl-C one
line and exit 130, a bug keeps its traceback; and the package installs (pyproject names what to install)."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from config import ConfigError
from ops import BackendError
from utils.cli import run_cli
from utils.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def fails_with(exc: BaseException):
    def main():
        raise exc
    return main


@pytest.mark.parametrize("exc", [UserError("bad thing"), ConfigError("bad thing"), BackendError("bad thing"),
                                 FileNotFoundError("bad thing"), FileExistsError("bad thing")])
def test_user_errors_are_one_line_and_exit_1(exc):
    with pytest.raises(SystemExit) as e:
        run_cli(fails_with(exc))
    assert e.value.code == "error: bad thing"       # sys.exit(str) prints it to stderr and exits 1


def test_ctrl_c_exits_130_with_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(fails_with(KeyboardInterrupt()))
    assert e.value.code == 130 and capsys.readouterr().err == "interrupted\n"


def test_a_bug_keeps_its_traceback_and_success_exits_0():
    with pytest.raises(IndexError):
        run_cli(fails_with(IndexError("a bug")))
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: {"a": 1})
    assert e.value.code == 0


def test_pyproject_names_the_packages_to_install():
    """`pip install -e ".[fla]"` failed: setuptools refuses to guess the packages of a flat layout with bench/,
    configs/ and scripts/ beside the code. The names given must find every module (the op folders are namespace
    packages) and nothing else."""
    from setuptools import find_namespace_packages

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["build-system"]["build-backend"] == "setuptools.build_meta"
    st = meta["tool"]["setuptools"]
    assert set(st["py-modules"]) == {"config", "train"}
    found = find_namespace_packages(str(REPO), **st["packages"]["find"])
    tops = {p.split(".")[0] for p in found}
    assert tops == {"ops", "model", "data", "eval", "utils"}
    assert {"ops.gla", "ops.chunkwise", "ops.attention"} <= set(found) and not any("csrc" in p for p in found)
    code = {str(p.parent.relative_to(REPO)).replace("/", ".") for t in tops for p in (REPO / t).rglob("*.py")}
    assert code <= set(found), code - set(found)
