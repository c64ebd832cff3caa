"""scripts/profile_step.py: the timeline arithmetic on a made-up trace (busy, gaps, communication hidden behind
compute or exposed), the variant syntax, and a CPU run of the local step."""
from __future__ import annotations

import json

import pytest

from scripts.profile_step import main, parse_variant
from utils.profiling import analyse, subtract_length, union_length


def test_interval_arithmetic():
    assert union_length([(0, 2), (1, 3), (5, 6), (5.5, 5.8)]) == 4
    assert union_length([]) == 0
    assert subtract_length([(0, 10)], [(2, 4), (3, 5), (8, 12)]) == 5      # 0-2, 5-8


def test_the_exposed_all_reduce_is_the_part_no_kernel_hides():
    k = lambda name, ts, dur, cat="kernel": {"name": name, "ts": ts, "dur": dur, "cat": cat}
    trace = {"traceEvents": [k("gemm", 0, 400), k("ncclDevKernel_AllReduce_Sum_f32", 300, 300),
                             k("Memcpy DtoD", 650, 50, "gpu_memcpy"), k("adam", 800, 100),
                             {"name": "aten::mm", "ts": 0, "dur": 900, "cat": "cpu_op"}]}
    r = analyse(trace, wall_us=2000, steps=2)
    assert r["step_ms"] == pytest.approx(1.0)
    assert r["busy"] == pytest.approx(750 / 2000)                  # 0-600, 650-700 and 800-900
    assert r["compute_busy"] == pytest.approx(550 / 2000)          # without the all-reduce
    assert r["gap_ms"] == pytest.approx(0.625)
    assert r["comm_ms"] == pytest.approx(0.15) and r["exposed_comm_ms"] == pytest.approx(0.1)   # 400-600 of 300-600
    assert [t["name"] for t in r["top"]][:2] == ["gemm", "ncclDevKernel_AllReduce_Sum_f32"]


@pytest.mark.parametrize("text,message", [("zero", "must be local, ddp or fsdp"), ("ddp:bucket=x", "unknown option"),
                                          ("local:view", "unknown option"), ("ddp:noreshard", "unknown option"),
                                          ("fsdp:blocks", "unknown option"), ("ddp:compile:blocks", "exclude"),
                                          ("fsdp:graph", "unknown option"), ("ddp:compile:graph", "whole compiled"),
                                          ("ddp:ctas=0", "unknown option"), ("local:ctas=4", "unknown option"),
                                          ("local:bf16", "unknown option")])
def test_bad_variants(text, message):
    with pytest.raises(SystemExit, match=message):
        parse_variant(text)
    assert parse_variant("ddp:bucket=100:view:static:compile") == {
        "name": "ddp:bucket=100:view:static:compile", "kind": "ddp", "bucket": 100, "view": True, "static": True,
        "compile": True, "blocks": False, "reshard": True, "graph": False, "ctas": 0, "bf16": False}
    assert parse_variant("fsdp:noreshard:compile")["reshard"] is False
    assert parse_variant("local:blocks")["blocks"] is True
    assert parse_variant("ddp:blocks:graph")["graph"] is True
    assert parse_variant("ddp:graph:ctas=8")["ctas"] == 8
    assert parse_variant("ddp:blocks:graph:bf16")["bf16"] is True


def test_graph_variants_need_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit, match="need a CUDA GPU"):
        main(["--config", "configs/smoke.yaml", "--variants", "local:graph", "--out", str(tmp_path)])


def test_a_cpu_profile_of_the_local_step(tmp_path):
    r, = main(["--config", "configs/smoke.yaml", "--backend", "naive", "--warmup", "1", "--steps", "1",
               "--out", str(tmp_path)])
    assert r["step_ms"] > 0 and r["comm_ms"] == 0 and r["tokens_per_s_per_gpu"] > 0
    assert "| local |" in (tmp_path / "profile.md").read_text()
    assert json.loads((tmp_path / "profile.json").read_text())[0]["name"] == "local"
    with pytest.raises(SystemExit, match="need several processes"):
        main(["--config", "configs/smoke.yaml", "--variants", "ddp", "--out", str(tmp_path)])


def test_a_cpu_profile_of_the_fsdp_step(tmp_path):
    """FSDP2 in one process (the one-GPU baseline of a sharded study): both reshard settings train and time."""
    rs = main(["--config", "configs/smoke.yaml", "--backend", "naive", "--variants", "fsdp,fsdp:noreshard",
               "--warmup", "1", "--steps", "1", "--out", str(tmp_path)])
    assert [r["name"] for r in rs] == ["fsdp", "fsdp:noreshard"]
    assert all(r["step_ms"] > 0 and r["tokens_per_s_per_gpu"] > 0 for r in rs)


def test_the_step_profiler_window(tmp_path):
    """StepProfiler starts after step first−1 and reports after step first+count−1; a resumed run that starts at or
    after first−1 (its own first step compiles) skips the window; without a window it does nothing."""
    import torch

    from utils.profiling import StepProfiler

    assert StepProfiler("5:2", tmp_path, start=4).skipped
    assert StepProfiler("5:2", tmp_path, start=3).skipped is False
    assert StepProfiler("", tmp_path).after_step(1) is None and StepProfiler(None, tmp_path).after_step(1) is None
    prof = StepProfiler("3:2", tmp_path / "p")
    assert [prof.after_step(s) for s in (1, 2, 3)] == [None, None, None]
    torch.ones(64, 64) @ torch.ones(64, 64)
    summary = prof.after_step(4)
    assert summary["steps"] == [3, 4] and summary["step_ms"] > 0
    assert prof.after_step(5) is None and (tmp_path / "p" / "profile.md").exists()
