"""scripts/check_sm80.py: the launches a model makes are captured under the interpreter and compiled for sm80 (and
sm90, which the GPU runs compile anyway: the script's default, left out here for CI's time) on a CPU; a launch over
the A100's shared memory is reported as not fitting."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton
import triton.language as tl

from scripts.check_sm80 import LIMITS, main, to_markdown
from tests.helpers import has_triton_cuda_backend

needs_cuda_backend = pytest.mark.skipif(not has_triton_cuda_backend(),
                                        reason="Triton's CUDA backend (and its ptxas) is not installed")


@pytest.mark.slow
@needs_cuda_backend
def test_smoke_model_launches_compile_for_the_a100(tmp_path):
    rows = main(["--configs", "smoke", "--backends", "fused", "--sm80-only", "--out", str(tmp_path)])
    kernels = {r["kernel"] for r in rows}
    assert {"chunk_fwd_h_kernel", "gemm_res_kernel", "chunk_cumsum_kernel"} <= kernels, kernels
    assert {"swiglu_fwd_kernel", "swiglu_bwd_kernel"} <= kernels, kernels
    for r in rows:
        assert "error" not in r, r
        assert r["users"] == ["smoke/fused"]
        # an elementwise kernel with no layout conversion uses no shared memory
        assert 0 <= r["sm80"]["shared"] <= LIMITS[80] and r["sm80"]["registers"] > 0 and "sm90" not in r, r
    assert any(r["sm80"]["shared"] > 0 for r in rows)
    state = next(r for r in rows if r["kernel"] == "chunk_fwd_h_kernel")
    assert state["sm80"]["tiles"]["K"] == 16 and state["sm80"]["tiles"]["V"] == 64     # the smoke layer's head dims
    md = (tmp_path / "sm80-compile.md").read_text()
    assert f"**{len(rows)} distinct launches; 0 exceed the A100's shared memory; 0 did not compile; 0 " in md
    assert json.loads((tmp_path / "sm80-compile.json").read_text())["rows"][0]["sm80"]["shared"] > 0


def test_a_launch_over_the_a100_limit_is_flagged():
    fits = {"shared": 1024, "registers": 40, "spill_bytes": 0, "tiles": {"BT": 64}, "num_warps": 4, "num_stages": 2}
    big = {**fits, "shared": LIMITS[80] + 1}
    rows = [{"module": "ops.x", "kernel": "small", "users": ["a/fused"], "sm80": fits, "sm90": fits},
            {"module": "ops.x", "kernel": "big", "users": ["b/chunk"], "sm80": big, "sm90": big},
            {"module": "ops.x", "kernel": "broken", "users": ["c/fused"], "error": "CompilationError: x"}]
    md = to_markdown(rows, ["gpt2_ramla_124m on chunk: no chunk backend"], {"date": "d", "triton": "t", "torch": "p"},
                     "cmd")
    assert "**3 distinct launches; 1 exceed the A100's shared memory; 1 did not compile; 1 config/backend " in md
    assert f"| `x.big` | BT=64 | 4, 2 | {LIMITS[80] + 1:,} | 40, 0 |" in md and "| **no** | b/chunk |" in md
    assert "| yes | a/fused |" in md and "compile error: CompilationError: x" in md
    assert "- not captured: gpt2_ramla_124m on chunk: no chunk backend" in md


def test_unknown_backend_is_refused_before_any_work(capsys):
    with pytest.raises(SystemExit):
        main(["--configs", "smoke", "--backends", "fuse"])
    assert "unknown backend(s) fuse" in capsys.readouterr().err


@pytest.mark.slow
@needs_cuda_backend
def test_gated_deltanet_launches_fit_the_a100(tmp_path):
    """The A100 guard for the launch with the least margin: Gated DeltaNet's state backward (delta_h_bwd_kernel,
    BK 128, 3 stages) needs 164,872 of the A100's 166,912 B under the H100 machine's Triton 3.6, and 148,488 B
    under 3.9. A change that grows it fails here, not on a user's A100. The capture records this kernel's launch and
    runs no kernel (a launch depends on shapes alone), and only it is compiled, for sm80 alone."""
    rows = main(["--configs", "gdn_125m", "--backends", "fused", "--kernels", "delta_h_bwd_kernel", "--sm80-only",
                 "--out", str(tmp_path)])
    assert rows and not [r for r in rows if "error" in r]
    assert {r["kernel"] for r in rows} == {"delta_h_bwd_kernel"} and not any("sm90" in r for r in rows)
    assert not [(r["kernel"], r["sm80"]["shared"]) for r in rows if r["sm80"]["shared"] > LIMITS[80]]
    with pytest.raises(SystemExit):
        main(["--configs", "smoke", "--backends", "fused", "--kernels", "no_such_kernel", "--out", str(tmp_path)])


@triton.jit
def _weights_by_row(x, w, y, C, BT: tl.constexpr, BC: tl.constexpr):
    """y = x · w[cols]: a [1, BC] weight row loaded by its own layout, against the [BT, BC] bf16 tile's (what the
    short conv's kernels did): Triton converts one to the other's through shared memory."""
    rows, cols = tl.arange(0, BT)[:, None], tl.arange(0, BC)[None, :]
    t = tl.load(x + rows * C + cols).to(tl.float32) * tl.load(w + cols * 4)
    tl.store(y + rows * C + cols, t.to(tl.bfloat16))


@triton.jit
def _elementwise(x, y, C, BT: tl.constexpr, BC: tl.constexpr):
    rows, cols = tl.arange(0, BT)[:, None], tl.arange(0, BC)[None, :]
    tl.store(y + rows * C + cols, tl.load(x + rows * C + cols) * 2)


@needs_cuda_backend
def test_layout_conversions_and_barriers_are_counted(tmp_path):
    """The sm90 columns can fail: a kernel that moves a tile between layouts has conversions and barriers, a plain
    elementwise one has neither. Compiled as main() does, in a process without the interpreter."""
    ptr = ["ptr", "bfloat16", True]
    tiles = {"BT": ["int", 16], "BC": ["int", 128], "C": ["int", 1024]}
    launches = [{"module": __name__, "kernel": "_weights_by_row",
                 "args": {"x": ptr, "w": ["ptr", "float32", True], "y": ptr, **tiles}, "users": []},
                {"module": __name__, "kernel": "_elementwise", "args": {"x": ptr, "y": ptr, **tiles}, "users": []}]
    (tmp_path / "launches.json").write_text(json.dumps(launches))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "scripts/check_sm80.py", "--compile", str(tmp_path / "launches.json")],
                       capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[1], check=True)
    mixed, plain = (row["sm90"] for row in json.loads(r.stdout.strip().splitlines()[-1])["rows"])
    assert mixed["conversions"] >= 1 and mixed["barriers"] >= 1, mixed
    assert plain["conversions"] == 0 and plain["barriers"] == 0, plain
    md = to_markdown([{"module": "ops.x", "kernel": "k", "users": ["a/fused"], "sm80": mixed, "sm90": mixed}], [],
                     {"date": "d", "triton": "t", "torch": "p"}, "cmd")
    assert f"| {mixed['conversions']}, {mixed['barriers']} |" in md
