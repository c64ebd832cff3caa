"""scripts/compare_scaling.py on two made-up run folders: per-GPU rate, its ratio, the loss gap."""
from __future__ import annotations

import json

import pytest

from scripts.compare_scaling import main


def fake_run(path, world, rate, losses):
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"world_size": world}))
    rows = [{"step": s + 1, "loss": loss, "tokens_per_s": rate if s >= 2 else rate / 10} for s, loss in enumerate(losses)]
    rows.insert(2, {"step": 2, "val_loss": 5.0})                       # validation rows carry no loss
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_ratio_and_loss_gap(tmp_path):
    fake_run(tmp_path / "one", 1, 1000.0, [5.0, 4.0, 3.0, 2.0, 1.0])
    fake_run(tmp_path / "two", 2, 1800.0, [5.0, 4.0, 3.01, 2.0, 1.0])
    out = main([str(tmp_path / "one"), str(tmp_path / "two"), "--skip", "2", "--out", str(tmp_path / "s.md")])
    assert out["ratio"] == pytest.approx(0.9) and out["max_dloss"] == pytest.approx(0.01)
    md = (tmp_path / "s.md").read_text()
    assert "| two | 2 | 1,800 | 900 |" in md and "0.900" in md and "met" in md


def test_no_steps_after_skip_is_an_error(tmp_path):
    fake_run(tmp_path / "one", 1, 1000.0, [5.0])
    fake_run(tmp_path / "two", 2, 1000.0, [5.0])
    with pytest.raises(SystemExit, match="no logged step after step 10"):
        main([str(tmp_path / "one"), str(tmp_path / "two")])
