"""Fault injection on eval/perplexity.py: its result is never lost (kept outside the checkpoints a resumed run
rotates away, printed before it is written, its folder checked for writing before the evaluation), and a bad
checkpoint or a non-finite model is one line naming the file and what to do."""
from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

import train
from eval import perplexity
from tests.helpers import reset_accelerate
from tests.test_faults import args, ckpt, copy_run, exit_line, truncate


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def evaluate(run: Path, *extra: str) -> dict:
    return perplexity.main(["--ckpt", str(run), "--split", "valid", *extra])


def test_evaluation_result_outlives_checkpoint_rotation(base_run, tmp_path):
    run = copy_run(base_run, tmp_path, "e")
    result = evaluate(run)
    out = run / "eval" / "step_00000004_valid_32_32.json"
    assert json.loads(out.read_text()) == result
    reset_accelerate()
    train.main(args(tmp_path, "e", "--train.max_steps=8", "--train.keep_ckpts=1") + ["--resume"])
    assert not ckpt(run, 4).exists() and json.loads(out.read_text()) == result   # step 4 rotated away, result kept


@pytest.mark.parametrize("fault, reason", [("read-only", "the file system is read-only"),
                                           ("folder", "a folder is in the way")])
def test_unwritable_out_fails_before_evaluating(base_run, tmp_path, monkeypatch, fault, reason):
    run = copy_run(base_run, tmp_path, "w")
    monkeypatch.setattr(perplexity, "prepare_split", lambda *a, **k: pytest.fail("evaluated before the check"))
    out = tmp_path / "out.json"
    if fault == "folder":
        out.mkdir()
    else:
        def refuse(*a, **k):
            raise OSError(errno.EROFS, "Read-only file system", str(tmp_path))
        monkeypatch.setattr(perplexity.tempfile, "TemporaryFile", refuse)
    line = exit_line(lambda: evaluate(run, "--out", str(out)))
    assert line.startswith(f"error: cannot write {out}: {reason}") and "--out" in line


def test_a_failed_write_after_evaluating_keeps_the_printed_result(base_run, tmp_path, monkeypatch, capsys):
    run = copy_run(base_run, tmp_path, "f")

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(perplexity, "write_atomic", full)
    line = exit_line(lambda: evaluate(run))
    assert "the disk is full" in line and "the result is printed above" in line
    assert '"token_ppl"' in capsys.readouterr().out


def test_evaluating_nan_weights_is_an_error_naming_the_tensor(base_run, tmp_path):
    from safetensors.torch import load_file, save_file

    run = copy_run(base_run, tmp_path, "nan")
    weights = ckpt(run, 4) / "model.safetensors"
    state = load_file(str(weights))
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name].view(-1)[0] = float("nan")
    save_file(state, str(weights))
    line = exit_line(lambda: evaluate(run))
    assert line.startswith(f"error: {weights}: tensor {name!r} holds 1 NaN or infinite values"), line
    assert not (run / "eval").exists()


def test_a_non_finite_loss_is_an_error_and_writes_nothing(base_run, tmp_path, monkeypatch):
    run = copy_run(base_run, tmp_path, "inf")
    monkeypatch.setattr(perplexity, "score_tokens", lambda *a, **k: (float("inf"), 10))
    line = exit_line(lambda: evaluate(run))
    assert "the loss on valid is inf although the weights are finite" in line and "--backend naive" in line
    assert not list((run / "eval").glob("*.json"))


@pytest.mark.parametrize("name", ["model.safetensors", "trainer_state.json"])
def test_evaluating_a_corrupt_checkpoint_names_the_file_and_a_good_one(base_run, tmp_path, name):
    run = copy_run(base_run, tmp_path, "bad")
    truncate(ckpt(run, 4) / name)
    line = exit_line(lambda: evaluate(run))
    assert line.startswith(f"error: {ckpt(run, 4) / name} is unreadable (truncated or corrupt"), line
    assert line.endswith(f"pass --ckpt {ckpt(run, 2)}")
