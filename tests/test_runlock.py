"""One training process per run folder (utils/runlock.py): a second run on a held folder refuses and touches
nothing, evaluation reads a held folder, a lock left by a killed process is taken over, only rank 0 locks."""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate import Accelerator

import train
from tests.test_faults import args, ckpt, copy_run, exit_line, snapshot
from utils.errors import UserError
from utils.runlock import LOCK_FILE, RunLock, RunLocked


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


HOLD = """import fcntl, os, sys
os.makedirs(sys.argv[1], exist_ok=True)
fd = os.open(os.path.join(sys.argv[1], ".lock"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, str(os.getpid()).encode())
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def held_by_other_process():
    """hold(run_dir): another process holds run_dir's lock (as a live run would) until the test ends."""
    procs = []

    def hold(run_dir: Path) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "held"
        return p

    yield hold
    for p in procs:
        p.stdin.close()
        p.wait(timeout=10)


def test_a_second_run_on_a_held_run_folder_refuses_and_touches_nothing(base_run, tmp_path, held_by_other_process):
    run = copy_run(base_run, tmp_path, "shared")
    before = snapshot(run)
    holder = held_by_other_process(run)
    line = exit_line(lambda: train.main(args(tmp_path, "shared", "--train.max_steps=5") + ["--resume"]))
    assert line.startswith(f"error: {run} is in use by another training run (PID {holder.pid}")
    assert "another --train.name" in line and "wait" in line
    # a fresh run (no --resume) under the same name is refused the same way, before its check for checkpoints
    with pytest.raises(RunLocked, match=f"PID {holder.pid}"):
        train.main(args(tmp_path, "shared"))
    after = snapshot(run)
    assert after.pop(LOCK_FILE) == str(holder.pid).encode()        # the holder's lock file, as it wrote it
    assert after == before                                          # config, metrics, checkpoints untouched


def test_evaluation_reads_a_held_run_folder(base_run, tmp_path, held_by_other_process):
    from eval.perplexity import load_model

    run = copy_run(base_run, tmp_path, "busy")
    held_by_other_process(run)
    model, cfg, path = load_model(run)
    assert path == ckpt(run, 4) and cfg.train.max_steps == 4


def test_a_lock_left_by_a_dead_process_is_taken_over(base_run, tmp_path, capsys):
    run = copy_run(base_run, tmp_path, "stale")
    (run / LOCK_FILE).write_text(json.dumps({"pid": 999999, "host": "h", "since": "then"}))   # kill -9'd holder
    out = train.main(args(tmp_path, "stale", "--train.max_steps=5") + ["--resume"])
    assert out["steps"] == 5
    assert "took over the lock of a run that is no longer running (PID 999999" in capsys.readouterr().out
    assert (run / LOCK_FILE).read_text() == ""                     # released cleanly: nothing to take over next


def test_lock_is_exclusive_and_released(tmp_path):
    run = tmp_path / "r"
    with RunLock(run, log=lambda m: None):
        assert json.loads((run / LOCK_FILE).read_text())["pid"] == os.getpid()
        with pytest.raises(RunLocked, match=f"PID {os.getpid()}"):   # another open file: flock refuses it too
            RunLock(run, log=lambda m: None).acquire()
        (run / "config.yaml").write_text("x")
    fd = os.open(run / LOCK_FILE, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)                  # free again
    os.close(fd)
    with RunLock(tmp_path / "empty", log=lambda m: None):
        pass
    assert not (tmp_path / "empty").exists()                        # created, nothing written: removed again


def test_only_rank_0_takes_the_lock_and_the_others_hear_why(tmp_path, monkeypatch, held_by_other_process):
    """Under a multi-process launch the other ranks neither touch the lock (they would wait on rank 0's) nor go on
    alone when rank 0 could not take it: rank 0's outcome is broadcast (here stood in for)."""
    from contextlib import ExitStack

    from accelerate.state import PartialState

    from utils.runlock import take_run_folder

    run = tmp_path / "r"
    held_by_other_process(run)
    acc = Accelerator(cpu=True)
    monkeypatch.setattr(PartialState, "is_main_process", property(lambda self: False))
    with ExitStack() as stack:
        take_run_folder(run, acc, stack, print)                      # rank 0 (elsewhere) took it: go on
        monkeypatch.setattr("accelerate.utils.broadcast_object_list", lambda objs, from_process=0: ["rank 0 says no"])
        with pytest.raises(UserError, match="rank 0 says no"):
            take_run_folder(run, acc, stack, print)
