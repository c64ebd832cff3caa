"""--train.log_with (utils/trackers.py): a TensorBoard run's event files hold metrics.jsonl's values at its steps and
the config as hyperparameters; a resumed run continues the same event folder and hides what the interrupted
attempt logged after its checkpoint; a tracker whose package is missing is refused before any work; `none` writes
no tracker files. The event files are read back with the TFRecord framing and the writer's own protobufs
(tensorboardX's or tensorboard's: both write the same format), so the test needs no TensorBoard viewer."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

import train
from config import Config, ConfigError
from tests.helpers import reset_accelerate
from tests.test_train import tiny
from utils import trackers

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def protos():
    """(Event, SessionLog, HParamsPluginData) from whichever TensorBoard writer accelerate will use."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
    except ImportError:
        pytest.importorskip("tensorboardX", reason="tensorboardX is in requirements.txt; this image lacks it")
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
    return Event, SessionLog, HParamsPluginData


def events(path: Path) -> list:
    """The events of one TFRecord event file: each record is a u64 length, its CRC, the bytes and their CRC."""
    data, out, i = path.read_bytes(), [], 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        out.append(protos()[0].FromString(data[i + 12:i + 12 + n]))
        i += 12 + n + 4
    return out


def scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} from a folder's event files read in order, as TensorBoard shows them: a SessionLog
    START at step s (a writer opened with purge_step=s) hides the values earlier files logged at steps >= s. A step
    that still has two values of a tag (TensorBoard would draw both) fails the test."""
    seen: dict[str, list[tuple[int, float]]] = {}
    for f in sorted(log_dir.glob("events.out.tfevents.*")):
        for e in events(f):
            if e.HasField("session_log") and e.session_log.status == protos()[1].START:
                seen = {tag: [(s, v) for s, v in vals if s < e.step] for tag, vals in seen.items()}
            for v in e.summary.value:
                if v.HasField("simple_value"):
                    seen.setdefault(v.tag, []).append((e.step, v.simple_value))
    out = {tag: dict(vals) for tag, vals in seen.items()}
    twice = {tag: sorted(s for s, _ in vals if [t for t, _ in vals].count(s) > 1) for tag, vals in seen.items()}
    assert not any(twice.values()), f"steps logged twice: {twice}"
    return out


def jsonl(run: Path, key: str) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in rows if key in r}


def as_f32(values: dict[int, float]) -> dict[int, float]:
    """Event files store float32: metrics.jsonl's float64 values rounded as the writer rounds them."""
    return {s: float(np.float32(v)) for s, v in values.items()}


def test_tensorboard_holds_the_metrics_and_the_config(tmp_path):
    HParamsPluginData = protos()[2]
    train.main(tiny(tmp_path, "tb", "--train.log_with=tensorboard", "--train.log_interval=2"))
    run = tmp_path / "runs" / "tb"
    log_dir = run / "tensorboard" / "tb"
    got = scalars(log_dir)
    assert sorted(got["loss"]) == [2, 4, 6, 8, 10, 12]
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "val_loss", "val_ppl"):
        assert got[key] == as_f32(jsonl(run, key)), key
    assert "mfu" not in got      # None on a CPU: left out, as the tracker cannot take it

    (hp_file,) = log_dir.glob("*/events.out.tfevents.*")      # add_hparams' own timestamped folder
    (hp,) = [HParamsPluginData.FromString(v.metadata.plugin_data.content) for e in events(hp_file)
             for v in e.summary.value if v.tag == "_hparams_/session_start_info"]
    got_hp = hp.session_start_info.hparams
    assert got_hp["optim.lr"].number_value == 3e-3      # configs/smoke.yaml's
    assert got_hp["model.family"].string_value == "gla" and got_hp["train.name"].string_value == "tb"
    assert got_hp["data.seq_len"].number_value == 32 and got_hp["train.log_with"].string_value == "tensorboard"


def test_a_resumed_run_continues_the_same_event_folder(tmp_path):
    protos()
    train.main(tiny(tmp_path, "r", "--train.log_with=tensorboard", "--train.keep_ckpts=3"))
    run = tmp_path / "runs" / "r"
    before = scalars(run / "tensorboard" / "r")["loss"]
    # "crash" after the step-6 checkpoint, then resume with another lr, so steps 7-12 differ from the first attempt's
    shutil.rmtree(run / "checkpoints" / "step_00000012")
    (run / "checkpoints" / "latest").write_text("step_00000006")
    reset_accelerate()
    train.main(tiny(tmp_path, "r", "--train.log_with=tensorboard", "--train.keep_ckpts=3", "--optim.lr=1e-3")
               + ["--resume", "--allow-changes"])
    assert sorted(p.name for p in (run / "tensorboard").iterdir()) == ["r"]
    after = scalars(run / "tensorboard" / "r")
    assert after["loss"] == as_f32(jsonl(run, "loss")) and sorted(after["loss"]) == list(range(1, 13))
    assert after["val_loss"] == as_f32(jsonl(run, "val_loss"))
    assert all(after["loss"][s] == before[s] for s in range(1, 7))
    assert all(after["loss"][s] != before[s] for s in range(8, 13))


@pytest.mark.parametrize("name, check, pip", [("tensorboard", "is_tensorboard_available", "pip install tensorboardX"),
                                              ("wandb", "is_wandb_available", "pip install wandb")])
def test_a_missing_tracker_package_is_refused_before_any_work(tmp_path, monkeypatch, name, check, pip):
    monkeypatch.setattr(trackers, check, lambda: False)
    with pytest.raises(ConfigError, match=f"train.log_with={name} .*{pip}"):
        train.main(tiny(tmp_path, "missing", f"--train.log_with={name}"))
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_an_unknown_tracker_is_refused():
    with pytest.raises(ConfigError, match="none, tensorboard, wandb"):
        trackers.resolve_log_with("mlflow")


def test_none_writes_no_tracker_files(tmp_path):
    train.main(tiny(tmp_path, "plain", "--train.max_steps=2"))
    run = tmp_path / "runs" / "plain"
    assert not any(p.name in ("tensorboard", "wandb", trackers.WANDB_ID_FILE) for p in run.rglob("*"))
    assert sorted(jsonl(run, "loss")) == [1, 2]


def test_hparams_are_flat_scalars():
    hp = trackers.hparams(Config())
    assert hp["optim.lr"] == 6e-4 and hp["train.log_with"] == "none" and hp["model.family"] == Config().model.family
    assert all(isinstance(v, (bool, int, float, str)) for v in hp.values())
