"""scripts/bench_ops.py and its library bench/ on the CPU (fp32, the Triton interpreter, the `tiny` shapes): every
op family checked against its oracle, then timed and reported; a backend whose output or gradients are wrong is
reported FAIL and not timed; the timing helper (utils/timing.py) it times through."""
from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from bench import runner
from bench.attention import GATE_BOUND
from bench.cases import CHAINS, OPS, QUICK, Case, Options, Run, registry
from bench.chains import normed_input
from bench.mixers import movement_floor
from bench.runner import run_case
from scripts.bench_ops import main
from utils import timing

FLA = importlib.util.find_spec("fla") is not None and torch.cuda.is_available()
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke path (tiny shapes, fp32)")


def run(tmp_path, *args) -> tuple[list[dict], str, dict]:
    rows = main([*args, "--out", str(tmp_path), "--name", "t"])
    return rows, (tmp_path / "t.md").read_text(), json.loads((tmp_path / "t.json").read_text())


def by_variant(rows, op):
    return {r["variant"]: r for r in rows if r["op"] == op}


def assert_timed(row):
    assert row["status"] == "ok" and row["check"].startswith("ok"), row
    assert row["fwd_ms"] > 0 and math.isfinite(row["fwd_tflops"]) and row["fwd_gbs"] > 0, row
    assert all(e <= row["bounds"][n] for n, e in row["errors"].items()), row


@pytest.mark.parametrize("ops, backends, variants", [
    ("gla,ssd,gated_delta", "naive,fused", {"naive", "fused"}),
    ("proj_in,gdn_proj_in,mamba2_proj_in,proj_out", "fused", {"naive", "fused"}),
], ids=["mixers", "chains"])
def test_families_checked_timed_and_reported(tmp_path, ops, backends, variants):
    """Each op's backends against its fp32 oracle (output and every input gradient), then fwd and fwd+bwd times,
    throughput, the speedup against the peer and the report files. The chains' unfused naive runs whatever
    --backends says: it is their peer and sets their bound."""
    rows, md, record = run(tmp_path, "--ops", ops, "--backends", backends)
    for op in ops.split(","):
        got = by_variant(rows, op)
        assert set(got) == variants, got.keys()
        for r in got.values():
            if r["variant"] == "naive" and op in CHAINS:
                assert r["check"].startswith("sets the bound") and r["status"] == "ok", r
                continue
            assert_timed(r)
            assert r["fwdbwd_ms"] > 0 and {f"d{n}" for n in ("q", "x", "u", "o")} & set(r["errors"]), r
        assert f"## {op}" in md
    if "proj_out" in ops:
        chain = by_variant(rows, "proj_out")["fused"]
        assert chain["peer"] == "naive" and chain["speedup_fwdbwd"] > 0
        assert all(abs(b - 1e-3) < 1e-6 for b in chain["bounds"].values())      # 2 × naive's error (0 in fp32) + 1e-3
        assert "| naive ÷ this fwd+bwd |" in md
    else:
        assert all(r["bounds"]["o"] == 5e-3 for r in rows) and "| fla ÷ this fwd |" not in md    # no fla row here
    assert f"Command: `python scripts/bench_ops.py --ops {ops} --backends {backends} --out" in md
    assert all(r["device"] == "cpu" and "torch" in r and "commit" in r for r in record["rows"])   # long format
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_state_pass_split_step_decays_and_unavailable_peer(tmp_path):
    rows, md, _ = run(tmp_path, "--ops", "state", "--backends", "naive,chunk,fused,fla", "--segments", "2")
    got = by_variant(rows, "state")
    for name in ("naive", "chunk", "chunk, bfloat16 step decays", "chunk, float32 step decays", "fused S=2"):
        assert_timed(got[name])
        assert got[name]["bwd_ms"] > 0 and set(got[name]["errors"]) == {"h", "dh"}, got[name]
    assert "programs on 132 SMs" in got["fused S=2"]["note"]
    if not FLA:
        why = ("flash-linear-attention is not installed" if importlib.util.find_spec("fla") is None
               else "flash-linear-attention's kernels need a CUDA GPU")
        assert got["fla"]["status"] == "n/a" and why in got["fla"]["why"], got["fla"]
        assert "| fla | n/a: op 'state', backend 'fla': flash-linear-attention" in md
    assert "| bwd ms |" in md


def test_ramla_and_attention(tmp_path):
    """RA+MLA: the op, its kernels alone (checked against the oracle on the latent queries), GPT-2's SDPA (the
    peer, unchecked) and the plain-MLA run that sets the bound (not timed); attention: forward only, the WMMA
    kernel unavailable without a GPU, an SDPA kernel this machine lacks an error row, not a crash."""
    rows, md, _ = run(tmp_path, "--ops", "ramla,attention")
    ramla = by_variant(rows, "ramla")
    for name in ("naive", "fused", "fused core", "fused core, no band"):
        assert_timed(ramla[name])
    assert set(ramla["fused core"]["errors"]) == {"o", "dq_lat", "dk_lat", "dv_lat", "dalpha"}
    assert ramla["fused"]["bounds"]["dalpha"] == GATE_BOUND
    assert ramla["plain MLA on SDPA (sets the bound)"]["status"] == "bound"
    assert ramla["sdpa"]["check"] == "not checked" and ramla["fused"]["peer"] == "sdpa"
    attention = by_variant(rows, "attention")
    assert attention["fused"]["status"] == "n/a" and "CUDA GPU" in attention["fused"]["why"]
    assert_timed(attention["naive"])
    assert "fwdbwd_ms" not in attention["naive"] and "speedup_fwd" not in attention["launch floor"]
    assert "| sdpa ÷ this fwd+bwd |" in md and "## attention" in md


def test_chunk_sizes_and_profile(tmp_path):
    rows, md, _ = run(tmp_path, "--ops", "gla", "--backends", "fused", "--chunk-sizes", "32,64", "--profile")
    got = by_variant(rows, "gla")
    assert set(got) == {"fused C=32", "fused C=64"}
    for r in got.values():
        assert_timed(r)
        assert r["kernel_ms"] > 0
    assert got["fused C=64"]["floor_fwd_ms"] > 0 and "floor_fwd_ms" not in got["fused C=32"]   # the model's C = 64
    assert "| model floor fwd ms | model floor fwd+bwd ms |" in md
    assert "## Kernel tables" in md and "### gla tiny fused C=32" in md


def test_wrong_output_or_gradient_is_fail_and_not_timed(tmp_path, monkeypatch):
    """A backend whose output is 1 % off, and one whose output is right but whose gradients are 5 % off, are FAIL
    rows naming what is off, with no times."""
    from ops.gla import chunk, fused

    real_fused, real_chunk = fused.gla, chunk.gla

    def wrong_output(*args, **kwargs):
        o, s = real_fused(*args, **kwargs)
        return o * 1.01, s

    def wrong_gradients(*args, **kwargs):
        o, s = real_chunk(*args, **kwargs)
        return o + 0.05 * (o - o.detach()), s            # the same values, gradients scaled by 1.05
    monkeypatch.setattr(fused, "gla", wrong_output)
    monkeypatch.setattr(chunk, "gla", wrong_gradients)
    rows, md, _ = run(tmp_path, "--ops", "gla", "--backends", "chunk,fused")
    got = by_variant(rows, "gla")
    for name in ("fused", "chunk"):
        assert got[name]["status"] == "FAIL" and "fwd_ms" not in got[name], got[name]
    assert got["fused"]["check"].startswith("FAIL: o 1.0e-02 > 5.0e-03")
    assert got["chunk"]["errors"]["o"] < 1e-5 and "dq 5.0e-02 > 5.0e-03" in got["chunk"]["check"]
    assert "| tiny (B1 T100 H2 K16 V16) | fused | FAIL: o 1.0e-02 > 5.0e-03" in md


def test_oracle_out_of_memory_checks_at_batch_one(monkeypatch):
    """An oracle too large for the device (RA+MLA's T×T scores at T = 8192) is checked at B = 1 instead, with the
    same kernels, and the rows say so; the timing is at the case's own batch."""
    calls = []
    real = runner.check_runs

    def check(runs, oracles):
        calls.append(next(r for r in runs.values() if isinstance(r, Run)).leaves[0].shape[0])
        if len(calls) == 1:
            raise torch.OutOfMemoryError("the oracle's scores")
        return real(runs, oracles)
    monkeypatch.setattr(runner, "check_runs", check)
    case = Case("gla", "b2", dict(B=2, T=20, H=1, K=16, V=16))
    rows = run_case(case, Options(["naive"], [], [], torch.float32), torch.device("cpu"))
    assert calls == [2, 1]
    assert rows[0]["check"].startswith("checked at B1 (the oracle ran out of memory at B2); ok"), rows[0]
    assert rows[0]["status"] == "ok"


def test_arguments_and_registry(capsys):
    out = main(["--list"])
    listed = capsys.readouterr().out
    assert out == [] and all(f"\n{op:<15} tiny " in "\n" + listed for op in OPS)
    assert "ramla           T2048" in listed and "proj_out        mamba2_370m" in listed
    for argv, message in ((["--ops", "gla,mamba"], "unknown op(s) mamba"), (["--backends", "fuse"], "unknown backend(s) fuse"),
                          (["--ops", "gla", "--shapes", "mve,nope"], "unknown shape(s) nope"),
                          (["--chunk-sizes", "32,x"], "--chunk-sizes '32,x'")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err
    assert {c.shape for c in registry([1024]) if c.op == "ramla"} == {"T1024", "tiny"}
    assert set(QUICK) | {"ramla"} == set(OPS)


def test_movement_floor_for_our_own_kernels_only():
    """The data-movement model's floors at the MVE shape: fused below chunk, forward and fwd+bwd; none for fla."""
    mve = dict(B=16, T=2048, H=12, K=64, V=64)
    chunk, fused = movement_floor("gla", mve, "chunk"), movement_floor("gla", mve, "fused")
    assert 0.3 < chunk[0] < 0.4 and 0.1 < fused[0] < chunk[0] / 2 and fused[1] < chunk[1] / 2    # the scan: 0.15 ms
    assert movement_floor("gla", mve, "fla") is None and movement_floor("gated_delta", mve, "chunk") is None


def test_normed_input_makes_the_unfused_chain_cast_x_at_each_linear():
    """The chains' x reaches the unfused chain as the model hands it over. Its five F.linear each cast fp32 x to
    bf16 under autocast, unless x is an fp32 leaf that requires grad: autocast then caches the cast (its heuristic
    for weights) and the chain casts x once. Counted on the CPU's autocast, which caches by the same rule."""
    from torch.profiler import ProfilerActivity, profile

    from ops.proj_in import naive

    def casts_of_x(fn, x, ws) -> int:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, \
                torch.autocast("cpu", dtype=torch.bfloat16):
            fn(x, *ws)
        return sum(1 for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes
                   and list(e.input_shapes[0]) == list(x.shape))

    kw = naive.make_inputs(dict(B=1, T=8, d=32, H=2, K=8, V=8, L=4))
    x, ws = kw["x"], [kw[n] for n in ("w_q", "w_k", "w_v", "w_r", "w_down", "w_up", "b_up")]
    chain = lambda *a: naive.proj_in(*a, 2, 16.0)                                          # noqa: E731
    assert casts_of_x(chain, x, ws) == 1                       # a leaf: autocast's cache, once for all five
    assert casts_of_x(normed_input(chain), x, ws) == 5         # as in the model: one cast per F.linear
    normed_input(chain)(x, *ws)[0].sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape      # the view passes x's gradient through


def test_timing_helpers_on_the_cpu():
    """The CPU path of the one timer: medians of perf_counter, .grad reset between calls, whole-step wall time,
    the profiler's summed time and table; peak memory exists only on a GPU."""
    w = torch.randn(64, 64, requires_grad=True)
    seen = []

    def step():
        seen.append(w.grad is None)
        (w @ w).sum().backward()
    assert timing.bench_ms(step, warmup=1, rep=5, grad_to_none=[w]) > 0 and all(seen)
    assert timing.step_seconds(lambda: w @ w, steps=3, warmup=1) > 0
    prof = timing.profile_steps(lambda: w @ w, steps=2, warmup=1)
    assert timing.device_ms(prof, 2) > 0 and "aten::mm" in timing.kernel_table(prof)
    assert timing.graph_ms(lambda: w @ w) is None and timing.peak_mb(lambda: w @ w) is None
    timing.reset_grads(torch.nn.Linear(2, 2).requires_grad_())
