"""scripts/bench_throughput.py: a row per (config, backend) measured in its own process, the report, and
peer models of the same size as ours."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from config import load_config
from model import build_model
from scripts.bench_throughput import main, peer_model


def test_rows_eager_and_compiled_and_the_report(tmp_path):
    """An eager and a compiled row (AOTAutograd without code generation on a CPU), each in its own process; the
    FLOPs per token come from the model, MFU needs a GPU's peaks."""
    rows = main(["--configs", "configs/smoke.yaml", "--backends", "naive", "--no-peer", "--batch", "2",
                 "--seq-len", "32", "--warmup", "0", "--steps", "1", "--modes", "eager,compiled",
                 "--compile-backend", "aot_eager_decomp_partition", "--out", str(tmp_path)])
    assert [(r["status"], r["mode"]) for r in rows] == [("ok", "eager"), ("ok", "compiled")], rows
    assert all(r["tokens_per_s"] > 0 and r["first_step_s"] > 0 and r["flops_per_token"] > 0 for r in rows)
    md = (tmp_path / "throughput.md").read_text()
    assert "| smoke | naive | eager | 0.2M |" in md and "| smoke | naive | compiled | 0.2M |" in md
    assert "| — | — |" in md and "n/a" in md           # no MFU without a GPU's peaks
    assert (tmp_path / "throughput.png").stat().st_size > 0


def test_block_scope_and_checkpointing_rows_are_labelled_and_bad_modes_refused(tmp_path):
    """One row compiled block by block with activation checkpointing: both settings in its label."""
    rows = main(["--configs", "configs/smoke.yaml", "--backends", "naive", "--no-peer", "--batch", "2",
                 "--seq-len", "32", "--warmup", "0", "--steps", "1", "--modes", "compiled", "--compile-scope", "blocks",
                 "--compile-backend", "aot_eager_decomp_partition", "--checkpointing", "full", "--out", str(tmp_path)])
    assert [(r["status"], r["mode"], r["checkpointing"]) for r in rows] == [("ok", "compiled (blocks)", "full")], rows
    assert "| smoke | naive | compiled (blocks), ckpt full | 0.2M |" in (tmp_path / "throughput.md").read_text()
    with pytest.raises(SystemExit):
        main(["--configs", "configs/smoke.yaml", "--checkpointing", "some", "--out", str(tmp_path)])


def test_unavailable_backend_is_a_row_with_the_reason(tmp_path):
    import importlib.util

    import torch
    if importlib.util.find_spec("fla") is not None and torch.cuda.is_available():
        pytest.skip("fla can run here")
    rows = main(["--configs", "configs/smoke.yaml", "--backends", "fla", "--no-peer", "--batch", "1",
                 "--seq-len", "16", "--steps", "1", "--out", str(tmp_path)])
    assert rows[0]["status"] == "n/a" and "'fla'" in rows[0]["why"]


def test_rows_past_the_deadline_are_skipped_and_the_table_says_so(tmp_path):
    """--deadline: a row not started with 30 s left is a 'skipped' row, and the table is written anyway."""
    rows = main(["--configs", "configs/smoke.yaml", "--backends", "naive", "--no-peer", "--deadline", "1",
                 "--out", str(tmp_path)])
    assert [r["status"] for r in rows] == ["skipped"] and "--deadline 1 s" in rows[0]["why"]
    assert "| smoke | naive |" in (tmp_path / "throughput.md").read_text()


@pytest.mark.parametrize("name", ["gpt2_124m", "gla_340m", "gdn_340m", "mamba2_370m"])
def test_peer_has_our_parameter_count(name):
    cfg = load_config(f"configs/{name}.yaml").model
    if cfg.family != "gpt2" and importlib.util.find_spec("fla") is None:
        pytest.skip("the peer is flash-linear-attention's model class; fla is not installed")
    with torch.device("meta"):
        ours, peer = build_model(cfg), peer_model(cfg)
    assert sum(p.numel() for p in peer.parameters()) == sum(p.numel() for p in ours.parameters())


def test_a_failed_row_says_what_failed():
    """torch.compile's failures end with hints; the row names the cause (ours where there is one)."""
    from scripts.bench_throughput import error_line

    dynamo = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
              "ops.BackendError: op 'attention', backend 'fused': the WMMA kernel is forward-only\n\n"
              "The above exception was the direct cause of the following exception:\n"
              "torch._dynamo.exc.Unsupported: call_function in skip_files\n\n"
              "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace\n")
    assert error_line(dynamo).startswith("ops.BackendError: op 'attention'")
    assert error_line("Traceback\nRuntimeError: boom\nhint\n") == "RuntimeError: boom"
    assert error_line("just a line\n") == "just a line" and error_line("") == "(no output)"


def test_a_forward_only_backend_is_refused_before_the_trace(monkeypatch):
    """GPT-2's `fused` attention has no backward: the row fails with our BackendError before torch.compile traces
    (inside the trace it would reach the table as Dynamo's wrapper of it). Its device check is lifted on a CPU."""
    import ops.attention.fused as wmma
    from ops import BackendError
    from scripts.bench_throughput import worker

    monkeypatch.setattr(wmma, "check_available", lambda op, backend: None)
    with pytest.raises(BackendError, match="op 'attention', backend 'fused': its kernel is forward-only"):
        worker(str(Path(__file__).resolve().parents[1] / "configs" / "gpt2_124m.yaml"), "fused", 1, 16, 0, 1,
               mode="compiled")
