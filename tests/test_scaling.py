"""scripts/scaling.py on made-up run folders (the training itself needs GPUs): the commands of a pair, the report
of one pair (per-GPU rate, its ratio, the loss gap) and the table of several (a pair whose multi-GPU run is missing
is a row that says so)."""
from __future__ import annotations

import json

import pytest

from scripts.scaling import main


def fake_run(path, world, rate, losses, peak=None):
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"world_size": world}))
    rows = [{"step": s + 1, "loss": loss, "tokens_per_s": rate if s >= 2 else rate / 10,
             **({"peak_mem_gb": peak} if peak else {})} for s, loss in enumerate(losses)]
    rows.insert(2, {"step": 2, "val_loss": 5.0})                       # validation rows carry no loss
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_report_of_one_pair(tmp_path):
    fake_run(tmp_path / "gpu1", 1, 1000.0, [5.0, 4.0, 3.0, 2.0, 1.0], 30.0)
    fake_run(tmp_path / "gpu2", 2, 1800.0, [5.0, 4.0, 3.01, 2.0, 1.0], 25.0)
    row = main(["--report", str(tmp_path), "--skip", "2"])
    assert row["efficiency"] == pytest.approx(0.9) and row["max_dloss"] == pytest.approx(0.01)
    md = (tmp_path / "scaling.md").read_text()
    assert "| gpu2 | 2 | 1,800 | 900 | 25.0 |" in md and "**0.900**" in md and "met" in md
    assert json.loads((tmp_path / "scaling.json").read_text())["per_gpu"] == pytest.approx(900.0)
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_steps_after_skip_is_an_error(tmp_path):
    fake_run(tmp_path / "gpu1", 1, 1000.0, [5.0])
    fake_run(tmp_path / "gpu2", 2, 1000.0, [5.0])
    with pytest.raises(SystemExit, match="no logged step after step 10"):
        main(["--report", str(tmp_path)])


def test_table_rows_and_plot(tmp_path):
    fake_run(tmp_path / "gla_340m-fused-ddp" / "gpu1", 1, 1000.0, [5.0, 4.0, 3.0, 2.0], 30.0)
    fake_run(tmp_path / "gla_340m-fused-ddp" / "gpu8", 8, 7200.0, [5.0, 4.02, 2.99, 2.0], 25.0)
    fake_run(tmp_path / "gla_340m-fused-fsdp" / "gpu1", 1, 1000.0, [5.0, 4.0, 3.0, 2.0], 30.0)
    rows = main(["--table", str(tmp_path), "--skip", "2", "--out", str(tmp_path / "t" / "scaling")])
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
    # a pair folder named otherwise takes its names from the scaling.json its own report wrote
    (tmp_path / "gla_340m-fused-ddp" / "scaling.json").write_text(json.dumps({"config": "c", "backend": "b",
                                                                              "launcher": "fsdp"}))
    row, = main(["--table", str(tmp_path / "gla_340m-fused-ddp"), "--skip", "2"])
    assert (row["config"], row["backend"], row["launcher"]) == ("c", "b", "fsdp")


def test_empty_folder_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no pair folder"):
        main(["--table", str(tmp_path)])


def test_commands_of_a_pair(tmp_path, capsys):
    """The same global batch: one GPU at N·A accumulation, N under accelerate at A; under FSDP the one-GPU run is
    FSDP too; the overrides reach both runs, the data flags the preparation too."""
    args = ["--config", "configs/gla_340m.yaml", "--backend", "fused", "--nproc", "4", "--grad-accum", "2",
            "--steps", "30", "--out", str(tmp_path), "--data.cache_dir=/tmp/c", "--optim.warmup_steps=500", "--dry-run"]
    (prep, p_argv, _), (one, one_argv, one_env), (many, many_argv, many_env) = main(args)
    assert (prep, one, many) == ("prepare", "gpu1", "gpu4")
    assert p_argv[1:] == ["-m", "data.prepare", "--config", "configs/gla_340m.yaml", "--data.cache_dir=/tmp/c"]
    assert one_env == {"CUDA_VISIBLE_DEVICES": "0"} and one_argv[1] == "train.py"          # DDP on one GPU: plain
    assert "--train.grad_accum=8" in one_argv and "--train.grad_accum=2" in many_argv
    launch = many_argv[many_argv.index("accelerate.commands.launch"):many_argv.index("train.py")]
    assert launch[2].endswith("configs/accelerate/ddp.yaml") and launch[3:] == ["--num_processes", "4"]
    for argv in (one_argv, many_argv):
        assert {"--train.max_steps=30", "--optim.warmup_steps=500", "--data.cache_dir=/tmp/c",
                f"--train.out_dir={tmp_path.resolve()}"} <= set(argv)
        assert argv.index("--optim.warmup_steps=500") > argv.index("--optim.warmup_steps=10")    # the override wins
    _, (_, one_argv, _), (_, many_argv, _) = main(args + ["--fsdp"])
    assert "accelerate.commands.launch" in one_argv and one_argv[-1] == "--train.grad_accum=8"
    assert any(a.endswith("fsdp.yaml") for a in one_argv) and any(a.endswith("fsdp.yaml") for a in many_argv)
    assert "gpu4: " in capsys.readouterr().out


def test_bad_arguments(capsys):
    for argv, message in ((["--config", "configs/gla_340m.yaml", "--nproc", "1"], "--nproc must be at least 2"),
                          (["--backend", "fused"], "--config is required"),
                          (["--config", "c.yaml", "stray"], "unrecognised arguments stray")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err
