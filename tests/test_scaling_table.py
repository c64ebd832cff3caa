"""scripts/scaling_table.py on made-up pair folders: one row per (config, backend, launcher) with the rates, the
efficiency, peak memory and the loss gap; a pair whose multi-GPU run is missing is a row that says so."""
from __future__ import annotations

import json

import pytest

from scripts.scaling_table import main


def fake_run(path, world, rate, losses, peak):
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"world_size": world}))
    rows = [{"step": s + 1, "loss": loss, "tokens_per_s": rate if s >= 2 else rate / 10, "peak_mem_gb": peak}
            for s, loss in enumerate(losses)]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_table_rows_and_plot(tmp_path):
    fake_run(tmp_path / "gla_340m-fused-ddp" / "gpu1", 1, 1000.0, [5.0, 4.0, 3.0, 2.0], 30.0)
    fake_run(tmp_path / "gla_340m-fused-ddp" / "gpu8", 8, 7200.0, [5.0, 4.02, 2.99, 2.0], 25.0)
    fake_run(tmp_path / "gla_340m-fused-fsdp" / "gpu1", 1, 1000.0, [5.0, 4.0, 3.0, 2.0], 30.0)
    rows = main([str(tmp_path), "--skip", "2", "--out", str(tmp_path / "t" / "scaling")])
    ddp, fsdp = rows
    assert (ddp["config"], ddp["backend"], ddp["launcher"], ddp["gpus"]) == ("gla_340m", "fused", "ddp", 8)
    assert ddp["efficiency"] == pytest.approx(0.9) and ddp["per_gpu"] == pytest.approx(900.0)
    assert ddp["max_dloss"] == pytest.approx(0.02) and ddp["median_dloss"] == pytest.approx(0.005)
    assert (ddp["peak_gb_1"], ddp["peak_gb_n"]) == (30.0, 25.0)
    assert fsdp["status"] == "missing the multi-GPU run"
    md = (tmp_path / "t" / "scaling.md").read_text()
    assert "| gla_340m | fused | ddp | 8 | 1,000 | 7,200 | 900 | **0.900** | 30.0 / 25.0 | 4 | 0.0200 / 0.0050 | ok |" in md
    assert "missing the multi-GPU run" in md
    assert (tmp_path / "t" / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "t" / "scaling.json").read_text())[0]["pair"] == "gla_340m-fused-ddp"


def test_empty_root_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no CONFIG-BACKEND-LAUNCHER folder"):
        main([str(tmp_path)])
