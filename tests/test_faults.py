"""Fault injection on train.py and the files it reads and writes (the run folder's lock: tests/test_runlock.py):
corrupt checkpoints on --resume, malformed configs, unwritable or full output and cache folders, missing data splits.
Each fault ends in one line that names the file and what to do (exit 1 on the command line), and loses nothing
on disk: the previous checkpoint stays usable, no partial `.tmp` folder stays behind, the other run's files are
untouched. The runs are tiny (tests/test_train.py's `tiny`) and in-process, a few steps each."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate import Accelerator

import train
from config import ConfigError, load_config
from data.sources import SPLITS
from tests.helpers import reset_accelerate
from tests.test_train import tiny
from utils.checkpoint import STATE_FILE, checkpoint_problem, clean_stale_tmp, latest_checkpoint
from utils.cli import run_cli
from utils.errors import UserError, WriteError
from utils.runinfo import JsonlWriter
from utils.runlock import LOCK_FILE

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def exit_line(fn) -> str:
    """run_cli(fn)'s exit: the one `error: ...` line it exits 1 with (sys.exit(str) prints it and exits 1)."""
    with pytest.raises(SystemExit) as e:
        run_cli(fn)
    assert isinstance(e.value.code, str) and "\n" not in e.value.code, e.value.code
    return e.value.code


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:08d}"


def make_base_run(tmp: Path) -> Path:
    """The `base_run` fixture's run (tests/conftest.py): 4 steps, checkpoints at 2 and 4."""
    train.main(args(tmp, "base"))
    reset_accelerate()
    return tmp


def copy_run(base: Path, tmp_path: Path, name: str) -> Path:
    """base_run's run as tmp_path/runs/<name>, sharing the data cache through a link (no re-generation)."""
    run = tmp_path / "runs" / name
    shutil.copytree(base / "runs" / "base", run)
    (run / LOCK_FILE).unlink(missing_ok=True)
    (tmp_path / "cache").symlink_to(base / "cache")
    return run


def args(tmp_path: Path, name: str, *extra: str) -> list[str]:
    """tiny's run without validation, 4 steps, a checkpoint every 2."""
    return tiny(tmp_path, name, "--train.eval_interval=0", "--train.eval_batches=0", "--train.max_steps=4",
                "--train.ckpt_interval=2", *extra)


# ---- a corrupt checkpoint on --resume ------------------------------------------------------------------

def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(path.stat().st_size))


@pytest.mark.parametrize("name, damage", [("model.safetensors", truncate), ("optimizer.bin", garbage),
                                          ("trainer_state.json", truncate)])
def test_resume_skips_a_corrupt_latest_checkpoint(base_run, tmp_path, capsys, name, damage):
    run = copy_run(base_run, tmp_path, "c")
    damage(ckpt(run, 4) / name)
    bad = snapshot(ckpt(run, 4))
    out = train.main(args(tmp_path, "c", "--train.max_steps=5") + ["--resume"])
    log = capsys.readouterr().out
    assert f"warning: --resume: skipping {ckpt(run, 4)}: {ckpt(run, 4) / name} is unreadable (truncated or corrupt" in log
    assert f"continuing from {ckpt(run, 2)} (step 2)" in log and f"resumed from {ckpt(run, 2)} at step 2" in log
    assert out["steps"] == 5 and latest_checkpoint(run) == ckpt(run, 5)
    aside = list(run.glob("checkpoints/superseded-*/step_00000004"))
    assert len(aside) == 1 and snapshot(aside[0]) == bad           # moved aside as it was, not deleted


def test_resume_with_no_usable_checkpoint_names_the_file_and_the_ways_on(base_run, tmp_path):
    run = copy_run(base_run, tmp_path, "n")
    truncate(ckpt(run, 4) / "model.safetensors")
    garbage(ckpt(run, 2) / "optimizer.bin")
    before = snapshot(run)
    line = exit_line(lambda: train.main(args(tmp_path, "n", "--train.max_steps=5") + ["--resume"]))
    assert f"{ckpt(run, 4) / 'model.safetensors'} is unreadable" in line
    assert f"{ckpt(run, 2) / 'optimizer.bin'} is unreadable" in line
    assert "another --train.name" in line and "--resume PATH" in line
    after = snapshot(run)
    assert after.pop(LOCK_FILE) == b"" and after == before         # nothing moved or rewritten; the lock released
    reset_accelerate()
    line = exit_line(lambda: train.main(args(tmp_path, "n", "--train.max_steps=5")
                                        + ["--resume", str(ckpt(run, 2))]))    # asked for it by name: no fallback
    assert line.startswith(f"error: --resume {ckpt(run, 2)}: {ckpt(run, 2) / 'optimizer.bin'} is unreadable")


def test_a_load_failure_the_checks_miss_is_one_error_naming_the_checkpoint(base_run, tmp_path, monkeypatch):
    """What passes the cheap checks but fails in accelerate's load_state (a corrupt tensor record deep in
    optimizer.bin) is still one line naming the checkpoint."""
    run = copy_run(base_run, tmp_path, "r")

    def corrupt_record(self, input_dir, **kw):
        raise RuntimeError("PytorchStreamReader failed reading file data/3: invalid header or archive is corrupted")

    monkeypatch.setattr(Accelerator, "load_state", corrupt_record)
    line = exit_line(lambda: train.main(args(tmp_path, "r", "--train.max_steps=5") + ["--resume"]))
    assert line.startswith(f"error: could not load checkpoint {ckpt(run, 4)}: RuntimeError: PytorchStreamReader")
    assert "--resume PATH" in line and "another --train.name" in line


def test_checkpoint_problem_accepts_a_good_checkpoint_and_names_missing_files(base_run, tmp_path):
    good = ckpt(base_run / "runs" / "base", 4)
    assert checkpoint_problem(good) is None
    c = tmp_path / "step_00000004"
    shutil.copytree(good, c)
    (c / "optimizer.bin").unlink()
    assert checkpoint_problem(c) == f"{c / 'optimizer.bin'} is missing"
    (c / STATE_FILE).write_text("[1, 2]")
    assert "records no step" in checkpoint_problem(c)


# ---- malformed config and data index -------------------------------------------------------------------

def test_bad_config_values_fail_before_the_run_folder_exists(tmp_path):
    for bad in ("--model.head_k_dim=0", "--optim.lr=inf", "--optim.beta1=nan", "--model.ssm_state=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0][2:]):
            train.main(tiny(tmp_path, "z", bad))
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_malformed_yaml_is_one_line_with_the_place(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  d_model: 32\n  n_layers: [1, 2\ntrain:\n  name: x\n")
    line = exit_line(lambda: train.main(["--config", str(bad)]))
    assert line.startswith(f"error: {bad}: not valid YAML at line 4, column 6")


def test_shard_index_without_shards_says_to_rebuild(base_run, tmp_path):
    from data.prepare import prepare_split

    cache = tmp_path / "cache"
    shutil.copytree(base_run / "cache", cache)
    meta_path = cache / "synthetic" / "train" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["shards"]
    meta_path.write_text(json.dumps(meta))
    # the same fingerprint as the run's, so the folder counts as current and is opened
    cfg = load_config("configs/smoke.yaml", tiny(tmp_path, "m")[2:]).data
    with pytest.raises(UserError, match=f"{meta_path} has no 'shards' list.*delete {meta_path.parent} to rebuild"):
        prepare_split(cfg, "train", log=lambda m: None)


# ---- unwritable or full output and cache --------------------------------------------------------------

def test_output_path_that_is_a_file(tmp_path):
    (tmp_path / "runs").write_text("not a folder")
    line = exit_line(lambda: train.main(tiny(tmp_path, "f")))
    assert line.startswith(f"error: cannot write the run folder {tmp_path / 'runs' / 'f'}: ") and "--train.out_dir" in line
    assert not (tmp_path / "cache").exists()                       # before any data was prepared


def test_cache_path_that_is_a_file(tmp_path):
    (tmp_path / "cache").write_text("not a folder")
    line = exit_line(lambda: train.main(tiny(tmp_path, "f")))
    assert "cannot write token shards in" in line and "--data.cache_dir" in line
    assert not (tmp_path / "runs" / "f").exists()                  # the run folder made for the lock is gone


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_unwritable_cache_leaves_no_staging_folder(tmp_path, monkeypatch, code):
    from data import shards

    def refuse(data, path):
        Path(path).write_bytes(b"part")
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(shards, "_write", refuse)
    with pytest.raises(WriteError, match="cannot write token shards in .*synthetic/train: "
                                         + {errno.EROFS: "the file system is read-only",
                                            errno.ENOSPC: "the disk is full"}[code]):
        train.main(tiny(tmp_path, "w"))
    assert os.listdir(tmp_path / "cache" / "synthetic") == []


def test_read_only_output_folder(tmp_path, monkeypatch):
    """Tests run as root, where chmod does not stop writes: the lock file's open is refused instead."""
    import utils.runlock

    real_open = os.open

    def refuse(path, *a, **k):
        if str(path).startswith(str(tmp_path / "runs")):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(utils.runlock.os, "open", refuse)
    line = exit_line(lambda: train.main(tiny(tmp_path, "ro")))
    assert line == (f"error: cannot write the run folder {tmp_path / 'runs' / 'ro'}: permission denied "
                    f"({tmp_path / 'runs' / 'ro' / LOCK_FILE}); choose a writable --train.out_dir (or another "
                    "--train.name)")


DISK_FULL = {"torch": RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1345216 vs 1345108"),
             "os": OSError(errno.ENOSPC, "No space left on device"),
             "readonly": OSError(errno.EROFS, "Read-only file system")}


@pytest.mark.parametrize("kind", list(DISK_FULL))
def test_disk_full_mid_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch, kind):
    real = Accelerator.save_state

    def save_state(self, output_dir, **kw):
        if output_dir.endswith("step_00000004.tmp"):
            (Path(output_dir) / "model.safetensors").write_bytes(b"partial")
            raise DISK_FULL[kind]
        return real(self, output_dir, **kw)

    monkeypatch.setattr(Accelerator, "save_state", save_state)
    line = exit_line(lambda: train.main(args(tmp_path, "full")))
    run = tmp_path / "runs" / "full"
    assert line.startswith(f"error: could not write checkpoint {ckpt(run, 4)}: ")
    assert f"the last good checkpoint is {ckpt(run, 2)}" in line and "--resume" in line
    assert {"torch": "unexpected pos", "os": "the disk is full", "readonly": "the file system is read-only"}[kind] in line
    assert not list(run.glob("checkpoints/*.tmp")) and latest_checkpoint(run) == ckpt(run, 2)
    assert checkpoint_problem(ckpt(run, 2)) is None
    if kind == "torch":
        monkeypatch.undo()
        reset_accelerate()
        assert train.main(args(tmp_path, "full") + ["--resume"])["steps"] == 4   # and the run continues from it


def test_a_bug_mid_checkpoint_keeps_its_traceback_and_removes_the_partial_folder(tmp_path, monkeypatch):
    from utils.checkpoint import save_checkpoint

    acc = Accelerator(cpu=True)
    monkeypatch.setattr(acc, "save_state", lambda output_dir, **kw: (_ for _ in ()).throw(KeyError("bug")))
    with pytest.raises(KeyError, match="bug"):
        save_checkpoint(acc, tmp_path, 1, {}, keep=2)
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_full_disk_while_logging_metrics(tmp_path):
    w = JsonlWriter(tmp_path / "metrics.jsonl")

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    w.f.close()
    w.f = Full()
    with pytest.raises(WriteError, match=r"cannot write .*metrics.jsonl: the disk is full; free space.*--resume"):
        w.write({"step": 1})
    w.close()                                                       # does not mask the report


def test_stale_tmp_checkpoints_are_removed_at_start(base_run, tmp_path, capsys):
    run = copy_run(base_run, tmp_path, "s")
    stale = run / "checkpoints" / "step_00000018.tmp"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")           # a process killed mid-save
    (run / "checkpoints" / "latest.tmp").write_text("step_000")
    train.main(args(tmp_path, "s", "--train.max_steps=5") + ["--resume"])
    assert f"removing {stale}: a checkpoint left incomplete" in capsys.readouterr().out
    assert not list(run.glob("checkpoints/*.tmp"))
    assert clean_stale_tmp(run, log=lambda m: None) == []


# ---- data preparation ----------------------------------------------------------------------------------

def test_a_missing_local_split_is_reported_before_any_tokenizing(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.txt").write_text("only a train split\n")
    fake = tmp_path / "never-read.tiktoken"                        # not even a tokenizer: it must not be reached
    with pytest.raises(FileNotFoundError, match=f"no 'valid' split in {raw}: .*--data.eval_source"):
        train.main(tiny(tmp_path, "l", f"--data.source=local:{raw}", f"--data.tokenizer_file={fake}"))
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists()


def test_a_fake_tokenizer_stops_the_run_before_any_tokenizing(tmp_path):
    from tests.data.test_tokenizer import fake_ranks_file

    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid"):
        (raw / f"{split}.txt").write_text(f"a {split} split\n")
    fake = fake_ranks_file(tmp_path / "fake.tiktoken")
    line = exit_line(lambda: train.main(tiny(tmp_path, "t", f"--data.source=local:{raw}",
                                             f"--data.tokenizer_file={fake}")))
    assert line.startswith(f"error: {fake} is not the GPT-2 BPE ranks file")
    assert not list((tmp_path / "cache").rglob("shard_*")) and not (tmp_path / "runs" / "t").exists()


def test_prepare_cli_is_one_line_and_checks_every_split_first(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.txt").write_text("a train split\n")
    r = subprocess.run([sys.executable, "-m", "data.prepare", "--config", "configs/smoke.yaml",
                        f"--data.source=local:{raw}", f"--data.cache_dir={tmp_path / 'cache'}"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [f"error: no 'valid' split in {raw}: looked for wiki.valid.raw, "
                                             "valid.txt, valid.raw, validation.txt, valid, validation; add one, or "
                                             "point --data.eval_source at a directory that has it"]
    assert not (tmp_path / "cache").exists()


def test_prepare_offline_is_one_line(tmp_path, monkeypatch):
    import datasets

    from data import prepare

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'Salesforce/wikitext' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setattr(prepare, "get_tokenizer", lambda path=None: None)     # GPT-2's ranks: not the point here
    monkeypatch.setattr(prepare, "tokenizer_fingerprint", lambda enc: "gpt2")
    line = exit_line(lambda: prepare.main(["--config", "configs/gla_125m.yaml", f"--data.cache_dir={tmp_path}",
                                           "--splits", ",".join(SPLITS)]))
    assert line.startswith("error: could not load 'Salesforce/wikitext'") and "--data.source=local:DIR" in line

