"""train.py end to end on CPU: the smoke run reaches the entropy target, resume reproduces the
uninterrupted run exactly, divergence stops the run and keeps the last good checkpoint, and a
crash mid-save leaves the previous checkpoint usable."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState

import train
from scripts import plot_run
from config import ConfigError
from ops import BackendError
from tests.helpers import reset_accelerate
from utils.checkpoint import (STATE_FILE, CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint,
                              supersede_after)
from utils.errors import UserError
from utils.precision import fsdp_plugin
from utils.runinfo import JsonlWriter


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def tiny(tmp_path, name="tiny", *extra):
    return ["--config", "configs/smoke.yaml", f"--train.out_dir={tmp_path / 'runs'}",
            f"--data.cache_dir={tmp_path / 'cache'}", f"--train.name={name}", "--train.progress=false",
            "--model.d_model=32", "--model.n_layers=1", "--model.head_k_dim=8", "--model.head_v_dim=8",
            "--model.mlp_hidden=64", "--data.seq_len=32", "--train.micro_batch_size=4",
            "--data.synthetic.train_tokens=20000", "--data.synthetic.eval_tokens=2000",
            "--train.max_steps=12", "--train.log_interval=1", "--train.eval_interval=6",
            "--train.eval_batches=2", "--train.ckpt_interval=6", "--optim.warmup_steps=3", *extra]


def losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}, {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}


@pytest.mark.slow
def test_smoke_run_reaches_entropy_rate(tmp_path):
    result = train.main(["--config", "configs/smoke.yaml", f"--train.out_dir={tmp_path / 'runs'}",
                         f"--data.cache_dir={tmp_path / 'cache'}", "--train.progress=false"])
    gap = result["val_loss"] - result["entropy_rate"]
    assert result["steps"] == 400 and 0 <= gap < 0.1, result
    run = tmp_path / "runs" / "smoke"
    info = json.loads((run / "run.json").read_text())
    assert [b["backend"] for b in info["backends"]] == ["naive"]      # one layer
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_mem_gb"} <= set(row)


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    train.main(tiny(tmp_path, "full", "--train.keep_ckpts=3"))
    full = tmp_path / "runs" / "full"
    # "crash" after the step-6 checkpoint: drop the final checkpoint and point latest back
    crashed = tmp_path / "runs" / "crashed"
    shutil.copytree(full, crashed)
    shutil.rmtree(crashed / "checkpoints" / "step_00000012")
    (crashed / "checkpoints" / "latest").write_text("step_00000006")
    reset_accelerate()
    train.main(tiny(tmp_path, "crashed", "--train.keep_ckpts=3") + ["--resume"])
    (a_loss, a_val), (b_loss, b_val) = losses(full), losses(crashed)
    assert sorted(b_loss) == list(range(1, 13))       # rows after the checkpoint were rewritten, once
    assert a_loss == b_loss and a_val == b_val
    png = plot_run.main([str(full), str(crashed), "--out", str(tmp_path / "loss.png")])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_existing_run_needs_resume(tmp_path):
    train.main(tiny(tmp_path, "r", "--train.max_steps=2"))
    AcceleratorState._reset_state(True)
    with pytest.raises(FileExistsError, match="--resume"):
        train.main(tiny(tmp_path, "r", "--train.max_steps=2"))


def test_resume_refuses_settings_that_change_the_run(tmp_path):
    train.main(tiny(tmp_path, "c", "--train.max_steps=6"))
    run = tmp_path / "runs" / "c"
    saved = (run / "config.yaml").read_text()
    reset_accelerate()
    with pytest.raises(ConfigError, match=r"train.seed \(checkpoint 1337, now 5\).*--allow-changes"):
        train.main(tiny(tmp_path, "c", "--train.seed=5") + ["--resume"])
    reset_accelerate()
    with pytest.raises(ConfigError, match=r"model differs.*model.d_model \(checkpoint 32, now 64\)"):
        train.main(tiny(tmp_path, "c", "--model.d_model=64") + ["--resume", "--allow-changes"])
    assert (run / "config.yaml").read_text() == saved          # the run's record is untouched
    reset_accelerate()
    out = train.main(tiny(tmp_path, "c", "--train.seed=5", "--optim.lr=1e-3") + ["--resume", "--allow-changes"])
    assert out["steps"] == 12 and "seed: 5" in (run / "config.yaml").read_text()


def test_resume_may_change_backend_and_length(tmp_path, capsys):
    train.main(tiny(tmp_path, "l", "--train.max_steps=6"))
    reset_accelerate()
    out = train.main(tiny(tmp_path, "l", "--train.max_steps=9", "--train.log_interval=3") + ["--resume"])
    assert out["steps"] == 9
    assert "the cosine schedule now ends at step 9, not 6" in capsys.readouterr().out


def test_resuming_a_finished_run_says_so_and_touches_nothing(tmp_path, capsys):
    train.main(tiny(tmp_path, "f", "--train.max_steps=6"))
    run = tmp_path / "runs" / "f"
    before = {p.name: p.read_bytes() for p in (run / "config.yaml", run / "metrics.jsonl")}
    reset_accelerate()
    out = train.main(tiny(tmp_path, "f", "--train.max_steps=6") + ["--resume"])
    assert out["steps"] == 6 and "nothing to train" in capsys.readouterr().out
    assert before == {p.name: p.read_bytes() for p in (run / "config.yaml", run / "metrics.jsonl")}


def test_resume_from_an_older_checkpoint_moves_the_newer_aside(tmp_path):
    train.main(tiny(tmp_path, "o", "--train.keep_ckpts=3"))
    run = tmp_path / "runs" / "o"
    old12 = (run / "checkpoints" / "step_00000012" / STATE_FILE).read_bytes()
    reset_accelerate()
    train.main(tiny(tmp_path, "o", "--train.keep_ckpts=3", "--train.max_steps=9", "--train.ckpt_interval=3")
               + ["--resume", str(run / "checkpoints" / "step_00000006")])
    aside = list(run.glob("checkpoints/superseded-*/step_00000012"))
    assert len(aside) == 1 and (aside[0] / STATE_FILE).read_bytes() == old12      # moved, not deleted
    assert latest_checkpoint(run).name == "step_00000009"
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == list(range(1, 10))          # one history: the old branch's steps 10-12 are gone


def test_supersede_points_latest_at_what_is_left(tmp_path):
    root = tmp_path / "checkpoints"
    for s in (3, 6, 9):
        (root / f"step_{s:08d}").mkdir(parents=True)
        (root / f"step_{s:08d}" / STATE_FILE).write_text("{}")
    (root / "latest").write_text("step_00000009")
    assert [p.name for p in supersede_after(tmp_path, 3, root / "step_00000003")] == ["step_00000006", "step_00000009"]
    assert latest_checkpoint(tmp_path).name == "step_00000003"
    assert supersede_after(tmp_path, 3, root / "step_00000003") == []
    other = tmp_path / "elsewhere" / "step_00000001"
    supersede_after(tmp_path, 1, other)          # another run's checkpoint: latest falls back to what is left
    assert not (root / "latest").exists() and latest_checkpoint(tmp_path) is None


def test_torn_metrics_line_is_dropped_on_resume(tmp_path, capsys):
    train.main(tiny(tmp_path, "t", "--train.max_steps=6"))
    run = tmp_path / "runs" / "t"
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "loss": 2.2')                   # a crash mid-write
    reset_accelerate()
    train.main(tiny(tmp_path, "t", "--train.max_steps=8") + ["--resume"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 9))
    assert "dropped a torn last line" in capsys.readouterr().out


def test_a_corrupt_metrics_line_before_the_last_is_an_error(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, \n{"step": 3}\n')
    with pytest.raises(UserError, match="line 2 is not JSON"):
        JsonlWriter(path, truncate_after_step=3)
    assert path.read_text().count("\n") == 3                 # left as it was


def test_ctrl_c_names_the_last_checkpoint(tmp_path, monkeypatch):
    real = train.lr_at

    def interrupt_at_8(step, cfg):
        if step == 8:
            raise KeyboardInterrupt
        return real(step, cfg)

    monkeypatch.setattr(train, "lr_at", interrupt_at_8)
    with pytest.raises(train.Interrupted,
                       match=r"interrupted at step 8; the last checkpoint is .*step_00000006.*--resume"):
        train.main(tiny(tmp_path, "k"))


def test_names_are_checked_before_any_data_is_prepared(tmp_path):
    with pytest.raises(BackendError, match="bogus"):
        train.main(tiny(tmp_path, "b", "--model.backend=bogus"))
    with pytest.raises(UserError, match="unknown model family 'transformer'"):
        train.main(tiny(tmp_path, "b", "--model.family=transformer"))
    assert not (tmp_path / "cache").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 is real on a GPU")
def test_fp16_without_a_gpu_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
        train.main(tiny(tmp_path, "h", "--train.precision=fp16"))


def test_fewer_validation_windows_than_asked_are_reported(tmp_path, capsys):
    train.main(tiny(tmp_path, "v", "--train.max_steps=1", "--train.eval_batches=100"))
    assert "the split holds 62 windows of 32 tokens, fewer than the 400" in capsys.readouterr().out


def test_divergence_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    train.main(tiny(tmp_path, "d", "--train.max_steps=6"))
    run = tmp_path / "runs" / "d"
    good = latest_checkpoint(run)
    AcceleratorState._reset_state(True)
    # an infinite learning rate from the resumed step on (the config refuses --optim.lr=inf itself)
    monkeypatch.setattr(train, "lr_at", lambda step, cfg: float("inf"))
    with pytest.raises(train.Diverged, match=r"at step 12 is not finite: 5 consecutive steps \(8-12\) were, and "
                                             r"train.max_bad_steps is 5; stopping.*step_00000006"):
        train.main(tiny(tmp_path, "d", "--train.max_steps=12", "--train.log_interval=5", "--train.ckpt_interval=3")
                   + ["--resume"])
    assert latest_checkpoint(run) == good                      # step 9's checkpoint, mid-streak, was not saved
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # step 7's inf update makes every later loss NaN: steps 8-10 are skipped, warned about and counted at the
    # step-10 log (whose loss is step 7's, the one finite), and the fifth in a row, step 12, stops the run
    assert (rows[-2]["step"], rows[-2]["bad_steps"], math.isfinite(rows[-2]["loss"])) == (10, 3, True)
    assert "error" in rows[-1] and rows[-1]["step"] == 12
    out = capsys.readouterr().out
    assert "warning: step 8: loss nan / grad norm nan is not finite; the update was skipped" in out
    assert "warning: step 9: no checkpoint while steps are being skipped (2 in a row)" in out


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(torch.nn.Linear(3, 2), torch.optim.AdamW(torch.nn.Linear(3, 2).parameters()))
    first = save_checkpoint(acc, tmp_path, 1, {"note": "good"}, keep=2)

    def crash(output_dir, **kw):
        (tmp_path / "checkpoints" / "step_00000002.tmp" / "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(acc, "save_state", crash)
    with pytest.raises(CheckpointError, match=r"step_00000002: disk full\. The partial step_00000002.tmp was "
                                              r"removed; the last good checkpoint is .*step_00000001"):
        save_checkpoint(acc, tmp_path, 2, {}, keep=2)
    assert latest_checkpoint(tmp_path) == first and not (tmp_path / "checkpoints" / "step_00000002.tmp").exists()
    monkeypatch.undo()
    assert load_checkpoint(acc, first)["note"] == "good"


@pytest.mark.parametrize("main_process", [True, False], ids=["rank0", "rank1"])
def test_fsdp_checkpoint_writes_full_weights(tmp_path, monkeypatch, main_process):
    """Under FSDP accelerate saves the model sharded and no model.safetensors; save_checkpoint gathers the
    full weights on every rank (a collective: a rank that skipped it would hang the others) and rank 0 writes
    model.safetensors, which eval/perplexity.py loads. FSDP needs GPUs, so accelerate's side is stood in for
    here (scripts/scaling.py on GPUs is the real thing)."""
    from safetensors.torch import load_file

    from accelerate.utils import DistributedType

    acc = Accelerator(cpu=True)
    layer = torch.nn.Linear(3, 2)
    model, opt = acc.prepare(layer, torch.optim.AdamW(layer.parameters()))
    gathered = []
    monkeypatch.setattr(Accelerator, "distributed_type", property(lambda self: DistributedType.FSDP))
    monkeypatch.setattr(acc, "save_state", lambda output_dir, **kw: (Path(output_dir) / "pytorch_model_fsdp_0").mkdir())
    monkeypatch.setattr(acc, "get_state_dict", lambda m: gathered.append(1) or {k: v.detach().clone()
                                                                                for k, v in m.state_dict().items()})
    with pytest.raises(ValueError, match="needs the prepared model"):
        save_checkpoint(acc, tmp_path, 1, {}, keep=2)
    if not main_process:     # the other ranks gather too, but write nothing (rank 0 renames the folder)
        from accelerate.state import PartialState

        monkeypatch.setattr(PartialState, "is_main_process", property(lambda self: False))
        assert not acc.is_main_process
        (tmp_path / "checkpoints" / "step_00000002.tmp").mkdir(parents=True)
        save_checkpoint(acc, tmp_path, 2, {}, keep=2, model=model)
        assert gathered == [1] and not list(tmp_path.rglob("model.safetensors"))
        return
    ckpt = save_checkpoint(acc, tmp_path, 2, {}, keep=2, model=model)
    assert gathered == [1]
    assert latest_checkpoint(tmp_path) == ckpt and (ckpt / "pytorch_model_fsdp_0").is_dir()
    saved = load_file(ckpt / "model.safetensors")
    assert saved.keys() == model.state_dict().keys()
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_fsdp2_policy_reduces_in_fp32_and_leaves_outputs(monkeypatch):
    """Under an FSDP2 launch in bf16, gradients are reduced and accumulated in fp32 and outputs keep their dtype (the
    loss stays fp32; accelerate's default policy rounds both to bf16). Outside FSDP, under FSDP1 (accelerate's
    default version) and in fp32, accelerate's own defaults stand."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    policy = fsdp_plugin("bf16").mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (torch.bfloat16, torch.float32, None)
    assert fsdp_plugin("no") is None
    monkeypatch.setenv("FSDP_VERSION", "1")
    assert fsdp_plugin("bf16") is None
    monkeypatch.delenv("FSDP_VERSION")
    assert fsdp_plugin("bf16") is None
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert fsdp_plugin("bf16") is None


def test_missing_backend_is_a_clear_error(tmp_path):
    mamba2 = ["--model.family=mamba2", "--model.ssm_head_dim=8", "--model.ssm_state=8"]
    with pytest.raises(BackendError, match="op 'ssd', backend 'fused': no fused chunk component"):
        train.main(tiny(tmp_path, "b") + ["--backend", "fused", "--fuse", "chunk"] + mamba2)
    with pytest.raises(BackendError, match="op 'attention' has no 'chunk' backend"):
        train.main(tiny(tmp_path, "c") + ["--backend", "chunk", "--model.family=gpt2"])


def test_interval_clock_reads_each_interval_once_the_device_reaches_it():
    """train.py's log clock: marks cost no wait, and each read measures from the previous read's mark. On a GPU the
    interval is the GPU's (a kernel that spins 1e8 cycles, over 40 ms at any H100 or A100 clock, lies inside it,
    though the host passed the marks at once)."""
    import time as _time

    from utils.timing import IntervalClock

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    clock = IntervalClock(device)
    t0 = _time.time()
    if device.type == "cuda":
        torch.cuda._sleep(100_000_000)
    else:
        _time.sleep(0.05)
    first = clock.mark()
    queued = _time.time() - t0
    _time.sleep(0.02)
    second = clock.mark()
    a, b = clock.seconds(first), clock.seconds(second)
    assert a >= 0.04 and (device.type == "cpu" or queued < 0.02)
    assert 0.015 <= b < 0.5 if device.type == "cpu" else 0 <= b < 0.5


def test_a_profiled_window_writes_its_report_and_changes_no_loss(tmp_path):
    """--train.profile=A:N profiles steps A..A+N-1 (the summary's step time is theirs, host work included) into
    <run>/profile/, and the run's losses are those of the same run unprofiled."""
    short = ["--train.max_steps=5", "--train.eval_interval=0", "--train.ckpt_interval=0"]
    train.main(tiny(tmp_path, "plain", *short))
    train.main(tiny(tmp_path, "prof", *short, "--train.profile=2:3"))
    folder = tmp_path / "runs" / "prof" / "profile"
    summary = json.loads((folder / "profile.json").read_text())
    assert summary["steps"] == [2, 4] and summary["step_ms"] > 0
    assert bool(summary["top"]) == torch.cuda.is_available()        # device kernels: none on a CPU
    assert "Steps 2–4, profiled" in (folder / "profile.md").read_text()
    assert "traceEvents" in json.loads((folder / "trace.json").read_text())
    assert losses(tmp_path / "runs" / "prof") == losses(tmp_path / "runs" / "plain")
    assert not (tmp_path / "runs" / "plain" / "profile").exists()


@pytest.mark.parametrize("shape", [(), (3,)])
def test_host_copy_reads_a_step_without_waiting_for_later_work(shape):
    """HostCopy holds the values it was made from, whatever is written to the tensor later; on a GPU reading it
    waits only for its own copy, not for the work queued after it (a plain .tolist() would wait ~1 s here)."""
    import time as _time

    from utils.timing import HostCopy

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = torch.arange(1, 4, dtype=torch.float32, device=device)[: (3 if shape else 1)].reshape(shape) * 2
    copy = HostCopy(t)
    t.fill_(-1)
    if device == "cuda":
        torch.cuda._sleep(2_000_000_000)         # about a second of GPU work queued after the copy
    t0 = _time.time()
    values = copy.tolist()
    waited = _time.time() - t0
    assert values == ([2.0, 4.0, 6.0] if shape else 2.0)
    if device == "cuda":
        assert waited < 0.3 and not torch.cuda.current_stream().query()
        torch.cuda.synchronize()


def test_a_forward_only_backend_is_refused_before_training(tmp_path, monkeypatch):
    """GPT-2's `fused` attention (the WMMA kernel) has no backward: train.py says so at start-up, before any data
    is prepared, not at the first backward (where torch.compile would bury it in its own exception). Its device
    check is lifted so that the refusal is the one under test on a CPU too."""
    import ops.attention.fused as wmma

    monkeypatch.setattr(wmma, "check_available", lambda op, backend: None)
    with pytest.raises(BackendError, match=r"op 'attention', backend 'fused': its kernel is forward-only .* cannot "
                                          r"train; choose another --backend \(for GPT-2's attention: naive"):
        train.main(tiny(tmp_path, "wmma", "--model.family=gpt2", "--model.n_heads=2", "--model.max_seq_len=64",
                        "--backend", "fused"))
    assert not (tmp_path / "cache").exists()        # refused before the data
