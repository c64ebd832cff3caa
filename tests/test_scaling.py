"""scripts/scaling.py without GPUs: the commands and accumulations of a study, the schedule (tiny sleeping processes
stand in for training), the report of one folder (per-GPU efficiency against the launcher's target, the loss gaps,
the floor's reading) and the table of several."""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import scripts.scaling as scaling
from scripts.scaling import REPO, Run, execute, gpu_ids, main, order

GLA, GDN = "configs/gla_340m.yaml", "configs/gdn_340m.yaml"


def fake_run(path, world, rate, losses, peak=None):
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"world_size": world}))
    rows = [{"step": s + 1, "loss": loss, "tokens_per_s": rate if s >= 2 else rate / 10,
             **({"peak_mem_gb": peak} if peak else {})} for s, loss in enumerate(losses)]
    rows.insert(2, {"step": 2, "val_loss": 5.0})                       # validation rows carry no loss
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def is_png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_one_pair(tmp_path):
    """Efficiency 0.900: met under FSDP's target (0.90), missed under DDP's (0.95)."""
    for launcher, verdict in (("fsdp", "met"), ("ddp", "missed")):
        folder = tmp_path / f"gla_340m-fused-{launcher}"
        fake_run(folder / "gpu1", 1, 1000.0, [5.0, 4.0, 3.0, 2.0, 1.0], 30.0)
        fake_run(folder / "gpu2", 2, 1800.0, [5.0, 4.0, 3.01, 2.0, 1.0], 25.0)
        s = main(["--report", str(folder), "--skip", "2"])
        pair, = s["pairs"]
        assert pair["efficiency"] == pytest.approx(0.9) and pair["max_dloss"] == pytest.approx(0.01)
        assert s["target"] == {"fsdp": 0.90, "ddp": 0.95}[launcher] and s["reading"] is None
        md = (folder / "scaling.md").read_text()
        assert "| gpu2 | 2 | 5 | 1,800 | 900 | **0.900** | 25.0 | 0.0100 / 0.0000 | ok |" in md
        assert f"2 GPUs 0.900 {verdict}" in md and "floor" not in md
        assert json.loads((folder / "scaling.json").read_text())["pairs"][0]["per_gpu"] == pytest.approx(900.0)
        assert is_png(folder / "scaling.png")


def test_report_with_several_counts_and_the_floor(tmp_path):
    """gpu1, gpu2, gpu4 and gpu1-floor: an efficiency per N, the gaps against gpu1, and the largest N read against
    the floor (within up to 1.5 × its largest |Δ|). A planned run that failed is a row saying why."""
    folder = tmp_path / "gla_340m-fused-ddp"
    base = [5.0, 4.0, 3.0, 2.0, 1.0, 0.5]
    fake_run(folder / "gpu1", 1, 1000.0, base, 30.0)
    fake_run(folder / "gpu2", 2, 1950.0, [5.0, 4.0, 3.005, 2.0], 26.0)            # --rate-steps: shorter
    fake_run(folder / "gpu4", 4, 3600.0, [5.0, 4.0, 3.0, 2.012, 1.0, 0.5], 20.0)
    fake_run(folder / "gpu1-floor", 1, 950.0, [5.0, 4.01, 3.0, 2.0, 1.0, 0.5], 18.0)
    s = main(["--report", str(folder), "--skip", "2"])
    two, four = s["pairs"]
    assert (two["gpus"], four["gpus"]) == (2, 4)
    assert two["efficiency"] == pytest.approx(0.975) and four["efficiency"] == pytest.approx(0.9)
    assert (two["steps"], four["steps"]) == (4, 6) and four["max_dloss"] == pytest.approx(0.012)
    assert s["floor"]["max_dloss"] == pytest.approx(0.01) and four["floor_max_dloss"] == pytest.approx(0.01)
    assert s["reading"] == "4-GPU gap within the floor's" and two["reading"] is None
    md = (folder / "scaling.md").read_text()
    assert [line.split(" |")[0] for line in md.splitlines() if line.startswith("| gpu")] == \
        ["| gpu1", "| gpu2", "| gpu4", "| gpu1-floor"]
    assert "2 GPUs 0.975 met, 4 GPUs 0.900 missed" in md and "Reading: **4-GPU gap within the floor's**" in md
    assert "≤ 1.5 × the floor's" in md
    assert "| gpu1-floor | 1 | 6 | 950 | 950 |  | 18.0 | 0.0100 / 0.0000 | ok |" in md
    assert is_png(folder / "scaling.png")

    rows = main(["--table", str(tmp_path), "--skip", "2", "--out", str(tmp_path / "t")])
    assert [(r["gpus"], r["status"]) for r in rows] == [(2, "ok"), (4, "ok")]
    md = (tmp_path / "t.md").read_text()
    assert "| 4 | 1,000 | 3,600 | 900 | **0.900** | 30.0 / 20.0 | 6 | 0.0120 / 0.0000 | 0.0100 / 0.0000 | " \
           "ok; 4-GPU gap within the floor's |" in md

    # a larger gap is above the floor's; a planned run that failed is named with its reason
    shutil.rmtree(folder / "gpu4")
    fake_run(folder / "gpu4", 4, 3600.0, [5.0, 4.0, 3.0, 2.02, 1.0, 0.5])
    (folder / "gpu8").mkdir()                                         # not of this study: not planned
    (folder / "scaling.json").write_text(json.dumps({"planned": ["gpu1", "gpu2", "gpu4", "gpu6", "gpu1-floor"],
                                                     "failed": {"gpu6": "exit 1, see gpu6.log"}}))
    s = main(["--report", str(folder), "--skip", "2"])
    assert s["reading"] is None and s["pairs"][-1]["status"] == "gpu6: exit 1, see gpu6.log"
    assert s["pairs"][1]["max_dloss"] == pytest.approx(0.02)
    assert "| gpu6 | | | | | | | | exit 1, see gpu6.log |" in (folder / "scaling.md").read_text()
    s["pairs"].pop()
    (folder / "scaling.json").write_text(json.dumps({"planned": ["gpu1", "gpu2", "gpu4", "gpu1-floor"]}))
    assert main(["--report", str(folder), "--skip", "2"])["reading"] == "4-GPU gap above the floor's"


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
    assert "| gla_340m | fused | ddp | 8 | 1,000 | 7,200 | 900 | **0.900** | 30.0 / 25.0 | 4 | 0.0200 / 0.0050 |  | " \
           "ok |" in md
    assert "missing the multi-GPU run" in md
    assert is_png(tmp_path / "t" / "scaling.png")
    assert json.loads((tmp_path / "t" / "scaling.json").read_text())[0]["pair"] == "gla_340m-fused-ddp"
    # a pair folder named otherwise takes its names from the scaling.json its own report wrote
    (tmp_path / "gla_340m-fused-ddp" / "scaling.json").write_text(json.dumps({"config": "c", "backend": "b",
                                                                              "launcher": "fsdp"}))
    row, = main(["--table", str(tmp_path / "gla_340m-fused-ddp"), "--skip", "2"])
    assert (row["config"], row["backend"], row["launcher"]) == ("c", "b", "fsdp")


def test_empty_folder_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no pair folder"):
        main(["--table", str(tmp_path)])


def argv_of(planned, folder, name):
    return next(r for r in planned if r.folder.name == folder and r.name == name).argv


def test_commands_of_a_pair(tmp_path, capsys, monkeypatch):
    """The same global batch: one GPU at N·A accumulation, N under accelerate at A; under FSDP the one-GPU run is
    FSDP too; the overrides reach both runs, the data flags the preparation too."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    args = ["--config", GLA, "--backend", "fused", "--nproc", "4", "--grad-accum", "2", "--gpus", "4",
            "--steps", "30", "--out", str(tmp_path), "--data.cache_dir=/tmp/c", "--optim.warmup_steps=500", "--dry-run"]
    [(folder, p_argv)], (many, one) = main(args)
    assert folder == tmp_path.resolve() and (one.name, many.name) == ("gpu1", "gpu4")
    assert p_argv[1:] == ["-m", "data.prepare", "--config", GLA, "--data.cache_dir=/tmp/c"]
    assert one.ids == ["0"] and many.ids == ["0", "1", "2", "3"] and one.argv[1] == "train.py"   # DDP on one: plain
    assert "--train.grad_accum=8" in one.argv and "--train.grad_accum=2" in many.argv
    launch = many.argv[many.argv.index("accelerate.commands.launch"):many.argv.index("train.py")]
    assert launch[2].endswith("configs/accelerate/ddp.yaml")
    assert launch[3:] == ["--num_processes", "4", "--main_process_port", "29500"] and many.port == 29500
    for argv in (one.argv, many.argv):
        assert {"--train.max_steps=30", "--optim.warmup_steps=500", "--data.cache_dir=/tmp/c",
                f"--train.out_dir={tmp_path.resolve()}"} <= set(argv)
        assert argv.index("--optim.warmup_steps=500") > argv.index("--optim.warmup_steps=10")    # the override wins
    _, (many, one) = main(args + ["--fsdp"])
    assert "accelerate.commands.launch" in one.argv and one.argv[-1] == "--train.grad_accum=8"
    assert any(a.endswith("fsdp.yaml") for a in one.argv) and any(a.endswith("fsdp.yaml") for a in many.argv)
    assert {one.port, many.port} == {29500, 29501}
    out = capsys.readouterr().out
    assert "gpu4 at ≈0: CUDA_VISIBLE_DEVICES=0,1,2,3 port 29500: " in out


def test_dry_run_of_a_study(tmp_path, capsys, monkeypatch):
    """Two configs, --nproc 2,4 at --grad-accum 2 with the floor on 4 GPUs: accumulation 8 on one GPU, 4 on two,
    2 on four, 16 at half the micro-batch for the floor; the compared runs train --steps, gpu2 --rate-steps. The
    4-GPU runs go first, alone; then both 2-GPU runs at once on disjoint GPUs; then the four one-GPU runs at once."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    args = ["--config", f"{GLA},{GDN}", "--nproc", "2,4", "--grad-accum", "2", "--floor", "--steps", "200",
            "--rate-steps", "60", "--out", str(tmp_path), "--dry-run"]
    preps, planned = main(args)
    folders = ["gla_340m-fused-ddp", "gdn_340m-fused-ddp"]
    assert [f for f, _ in preps] == [tmp_path.resolve() / f for f in folders]
    for folder in folders:
        for name, accum, steps in (("gpu1", 8, 200), ("gpu2", 4, 60), ("gpu4", 2, 200), ("gpu1-floor", 16, 200)):
            argv = argv_of(planned, folder, name)
            assert argv[-1 if name != "gpu1-floor" else -2] == f"--train.grad_accum={accum}"
            assert f"--train.max_steps={steps}" in argv and f"--train.name={name}" in argv
            assert f"--train.out_dir={tmp_path.resolve() / folder}" in argv
        assert argv_of(planned, folder, "gpu1-floor")[-1] == "--train.micro_batch_size=4"
    ports = [r.port for r in planned if r.port is not None]
    assert len(ports) == 4 and len(set(ports)) == 4                     # gpu2 and gpu4 of each config
    assert [(r.name, r.ids) for r in planned] == [
        ("gpu4", ["4", "5", "6", "7"]), ("gpu4", ["4", "5", "6", "7"]), ("gpu2", ["4", "5"]), ("gpu2", ["6", "7"]),
        ("gpu1", ["4"]), ("gpu1-floor", ["5"]), ("gpu1", ["6"]), ("gpu1-floor", ["7"])]
    assert planned[2].start == planned[3].start > planned[1].start > planned[0].start
    out = capsys.readouterr().out
    assert "CUDA_VISIBLE_DEVICES=6,7 port" in out and "8. gdn_340m-fused-ddp/gpu1-floor" in out
    # --serial: one at a time; --gpus 2 of the visible four is too few for the 4-GPU runs
    _, planned = main(args + ["--serial"])
    assert [r.start for r in planned] == sorted({r.start for r in planned})
    with pytest.raises(SystemExit, match="more than the 2 GPU"):
        main(args + ["--gpus", "2"])
    # an override of the micro-batch is the one halved
    _, planned = main(args + ["--train.micro_batch_size=6"])
    assert argv_of(planned, folders[0], "gpu1-floor")[-1] == "--train.micro_batch_size=3"


def test_odd_micro_batch_with_the_floor_is_an_error(tmp_path, capsys):
    odd = tmp_path / "odd.yaml"
    odd.write_text("train:\n  micro_batch_size: 5\n")
    for extra in ([f"--config={odd}"], ["--config", GLA, "--train.micro_batch_size=3"]):
        with pytest.raises(SystemExit):
            main([*extra, "--floor", "--gpus", "2", "--dry-run"])
        assert "--floor halves the micro-batch" in capsys.readouterr().err
    main(["--config", str(odd), "--gpus", "2", "--dry-run"])                     # without the floor: fine


def test_bad_arguments(capsys):
    for argv, message in ((["--config", GLA, "--nproc", "1"], "--nproc must be at least 2"),
                          (["--config", GLA, "--nproc", "2,x"], "--nproc takes GPU counts"),
                          (["--config", GLA, "--nproc", "3,4", "--grad-accum", "1"], "does not divide over 3 GPUs"),
                          (["--config", GLA, "--train.grad_accum=4"], "the study sets these"),
                          (["--config", f"{GLA},{GLA}"], "two configs would share a folder"),
                          (["--backend", "fused"], "--config is required"),
                          (["--config", "c.yaml", "stray"], "unrecognised arguments stray")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err


def test_visible_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5,6,7")
    assert gpu_ids(None, False) == ["3", "5", "6", "7"] and gpu_ids(2, False) == ["3", "5"]
    with pytest.raises(SystemExit, match="only 4 GPU"):
        gpu_ids(8, False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,-1,3")                # CUDA stops at the first invalid id
    assert gpu_ids(None, False) == ["2"]


# A stand-in for train.py: records when it ran and on which GPUs, then sleeps.
RECORD = ("import os, sys, time; t = time.time(); time.sleep(float(sys.argv[2])); "
          "open(sys.argv[1], 'a').write(f\"{t} {time.time()} {os.environ['CUDA_VISIBLE_DEVICES']}\\n\")")


def records(path):
    return [(float(a), float(b), set(ids.split(","))) for a, b, ids in
            (line.split() for line in path.read_text().splitlines())]


@pytest.mark.parametrize("serial", [False, True])
def test_schedule_packs_runs_on_disjoint_gpus(tmp_path, serial):
    """One 4-GPU, two 2-GPU and four 1-GPU runs on the parent's GPUs 3,5,6,7: concurrent runs never share a GPU,
    each gets as many as it asked for, and the two 2-GPU runs overlap in time (with --serial, nothing overlaps)."""
    log = tmp_path / "record.txt"
    sizes = [1, 2, 4, 1, 2, 1, 1]
    sleep = "0.1" if serial else "0.4"
    runs = [Run(tmp_path / "study", f"gpu{n}-{k}", [sys.executable, "-c", RECORD, str(log), sleep], n, 1.0)
            for k, n in enumerate(sizes)]
    results = execute(order(runs), ["3", "5", "6", "7"], serial, 0, {}, poll=0.02)
    assert all(rc == 0 for rc in results.values()) and len(results) == len(runs)
    rec = records(log)
    assert sorted(len(ids) for _, _, ids in rec) == sorted(sizes)
    assert all(ids <= {"3", "5", "6", "7"} for _, _, ids in rec)
    overlapping = [(a, b) for i, a in enumerate(rec) for b in rec[i + 1:] if a[0] < b[1] and b[0] < a[1]]
    assert all(not (a[2] & b[2]) for a, b in overlapping)
    if serial:
        assert not overlapping
    else:
        assert any(len(a[2]) == len(b[2]) == 2 for a, b in overlapping)
    assert all((tmp_path / "study" / f"{r.name}.log").is_file() for r in runs)


def test_a_run_past_its_timeout_is_killed(tmp_path):
    log = tmp_path / "record.txt"
    slow = Run(tmp_path, "gpu2", [sys.executable, "-c", RECORD, str(log), "60"], 2, 1.0)
    fast = Run(tmp_path, "gpu1", [sys.executable, "-c", RECORD, str(log), "0"], 1, 1.0)
    t = time.monotonic()
    results = execute([slow, fast], ["0", "1", "2"], False, 0.5, {}, poll=0.02)
    assert results[slow] == "timeout after 0.5 s" and results[fast] == 0 and time.monotonic() - t < 20
    assert len(records(log)) == 1



def test_a_terminated_study_leaves_no_run_behind(tmp_path):
    """SIGTERM (`timeout`, a job manager) to scaling.py kills its runs too: they run in their own sessions, so
    nothing else would, and they would hold the GPUs on."""
    pid_file = tmp_path / "pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    driver = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from pathlib import Path; "
              f"from scripts.scaling import Run, execute; "
              f"execute([Run(Path({str(tmp_path)!r}), 'gpu1', [sys.executable, '-c', {child!r}], 1, 1.0)], ['0'], "
              f"False, 0, {{}}, poll=0.02)")
    proc = subprocess.Popen([sys.executable, "-c", driver])
    deadline = time.monotonic() + 30
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    run_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=40) != 0
    for _ in range(100):                    # reaped by the driver, or by init just after
        try:
            os.kill(run_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"run process {run_pid} outlived the terminated study")

FAKE_TRAIN = """import json, os, sys
a = dict(x[2:].split("=", 1) for x in sys.argv[1:] if x.startswith("--") and "=" in x)
world = int(sys.argv[sys.argv.index("--num_processes") + 1]) if "--num_processes" in sys.argv else 1
run = os.path.join(a["train.out_dir"], a["train.name"])
os.makedirs(os.path.join(run, "checkpoints"))
train = {"max_steps": int(a["train.max_steps"]), "grad_accum": int(a["train.grad_accum"])}
json.dump({"world_size": world, "config": {"train": train}}, open(os.path.join(run, "run.json"), "w"))
rate = 1000 * world * (0.97 if world > 1 else 1) * (0.9 if "train.micro_batch_size" in a else 1)
with open(os.path.join(run, "metrics.jsonl"), "w") as f:
    for s in range(1, int(a["train.max_steps"]) + 1):
        loss = 5 - s / 10 + 0.001 * (world > 1 or "train.micro_batch_size" in a)   # the same gap for N and the floor
        f.write(json.dumps({"step": s, "loss": loss, "tokens_per_s": rate}) + "\\n")
"""


@pytest.fixture
def fake_training(tmp_path, monkeypatch):
    """Studies whose runs are FAKE_TRAIN instead of train.py, on four made-up GPUs."""
    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE_TRAIN)
    real = scaling.commands

    def commands(*a, **k):
        prep, runs = real(*a, **k)
        for r in runs:
            r.argv = [sys.executable, str(fake), *r.argv[r.argv.index("train.py") + 1:],
                      *(["--num_processes", str(r.gpus)] if r.gpus > 1 else [])]
        return [sys.executable, "-c", "pass"], runs

    monkeypatch.setattr(scaling, "commands", commands)
    monkeypatch.setattr(scaling, "execute", functools.partial(execute, poll=0.02))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")


def test_a_study_end_to_end(tmp_path, fake_training):
    """main trains two configs (train.py replaced by a script writing made-up metrics), prepares each config's data
    first, deletes the checkpoints, reports each folder and gathers them into <out>/scaling."""
    out = tmp_path / "ddp"
    reports = main(["--config", f"{GLA},{GDN}", "--nproc", "2,4", "--floor", "--steps", "20", "--rate-steps", "15",
                    "--skip", "2", "--out", str(out)])
    assert [s["pair"] for s in reports] == ["gla_340m-fused-ddp", "gdn_340m-fused-ddp"]
    for s in reports:
        assert [p["efficiency"] for p in s["pairs"]] == [pytest.approx(0.97)] * 2
        assert [p["steps"] for p in s["pairs"]] == [15, 20] and s["reading"] == "4-GPU gap within the floor's"
        assert s["planned"] == ["gpu1", "gpu2", "gpu4", "gpu1-floor"] and s["failed"] == {}
        folder = out / s["pair"]
        assert (folder / "prepare.log").is_file() and is_png(folder / "scaling.png")
        assert not any(folder.glob("gpu*/checkpoints"))
    rows = json.loads((out / "scaling.json").read_text())
    assert [(r["config"], r["gpus"]) for r in rows] == [("gla_340m", 2), ("gla_340m", 4), ("gdn_340m", 2),
                                                        ("gdn_340m", 4)]
    assert (out / "scaling.md").is_file() and is_png(out / "scaling.png")


def test_resume_keeps_only_the_runs_finished_as_planned(tmp_path, fake_training, capsys):
    """--resume trains again a run cut short, one of another accumulation and one never started; a finished run of
    the planned GPU count, accumulation and length is kept as it was."""
    out = tmp_path / "gla"
    argv = ["--config", GLA, "--nproc", "4", "--grad-accum", "1", "--steps", "6", "--skip", "2", "--out", str(out)]
    main(argv)
    gpu4 = out / "gpu4" / "metrics.jsonl"
    gpu4.write_text(gpu4.read_text().replace('"tokens_per_s": 3880', '"tokens_per_s": 3000'))     # marks it
    gpu1 = out / "gpu1" / "metrics.jsonl"
    gpu1.write_text("".join(gpu1.read_text().splitlines(keepends=True)[:3]))                    # cut at step 3
    capsys.readouterr()
    s, = main([*argv, "--resume"])
    assert "kept gla/gpu4" in capsys.readouterr().out
    assert [p["efficiency"] for p in s["pairs"]] == [pytest.approx(0.75)] and s["failed"] == {}
    assert len(gpu1.read_text().splitlines()) == 6
    main([*argv[:-4], "--grad-accum", "2", "--out", str(out), "--resume"])          # another accumulation: retrained
    assert '"tokens_per_s": 3000' not in gpu4.read_text()
