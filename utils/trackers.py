"""Experiment trackers for train.py, through accelerate's: `--train.log_with=none|tensorboard|wandb`.

Every row metrics.jsonl receives (the training rows, the validation rows, a divergence's error row) also goes to
the tracker at its step, with the fields that are None (mfu off a GPU) left out; the run's config goes in once
at start as hyperparameters, one dotted key per field (`optim.lr`). metrics.jsonl stays the run's record, which
the repository's own tools read; a tracker is a view of it.

- tensorboard: accelerate's TensorBoardTracker, writing with `tensorboard` (torch.utils.tensorboard) if installed,
  else with the lighter `tensorboardX` (requirements.txt has it); both write the same event files. They go to
  <run dir>/tensorboard/<run name>/ (accelerate puts each project in a folder of the logging dir), the
  hyperparameters to a timestamped folder inside it. A resumed run writes to the same folder with `purge_step`
  at the first step after its checkpoint, so TensorBoard hides what an interrupted attempt logged after the
  checkpoint, as metrics.jsonl drops those rows.
- wandb: the project is `chunkfuse` (or WANDB_PROJECT), each run named by its folder. The run id is kept in
  <run dir>/wandb_run_id, so a resumed run continues the same wandb run; wandb's files go to <run dir>/wandb/ unless WANDB_DIR says otherwise, and the
  rest of wandb's environment (WANDB_MODE=offline or disabled, WANDB_ENTITY, ...) applies as usual. wandb ignores
  steps below the last it has seen, so after a resume the steps between the checkpoint and the interruption keep
  the interrupted attempt's values there (metrics.jsonl and TensorBoard have the resumed ones).
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, is_tensorboard_available, is_wandb_available

from config import Config, ConfigError, flatten, to_dict
from utils.runinfo import JsonlWriter

CHOICES = ("none", "tensorboard", "wandb")
# what to install when a tracker's package is missing: tensorboardX is accelerate's lighter TensorBoard writer
# (0.1 MB beside protobuf; `tensorboard` itself brings grpcio and its data server, ~60 MB installed)
INSTALL = {"tensorboard": "pip install tensorboardX", "wandb": "pip install wandb"}
WANDB_ID_FILE = "wandb_run_id"


def resolve_log_with(name: str) -> str | None:
    """accelerate's tracker name for train.log_with (None for `none`), checked before any work: an unknown name,
    or a tracker whose package is not installed (accelerate would drop it with a debug message and train
    untracked), is a ConfigError that says what to pass or install."""
    if name not in CHOICES:
        raise ConfigError(f"train.log_with must be one of {', '.join(CHOICES)}, got {name!r}")
    if name == "none":
        return None
    available = {"tensorboard": is_tensorboard_available, "wandb": is_wandb_available}[name]
    if not available():
        also = " (or tensorboard, which also brings the viewer)" if name == "tensorboard" else ""
        raise ConfigError(f"train.log_with={name} needs a package that is not installed: {INSTALL[name]}{also}; "
                          "or pass --train.log_with=none")
    return name


def project_config(run_dir: Path) -> ProjectConfiguration:
    """The Accelerator's project: the run folder, with TensorBoard's files under <run dir>/tensorboard/."""
    return ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "tensorboard"))


def hparams(cfg: Config) -> dict[str, bool | int | float | str]:
    """The config as the flat dict of scalars trackers take: dotted keys, anything not a scalar as its text."""
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in flatten(to_dict(cfg)).items()}


def _init_kwargs(name: str, run_dir: Path, step: int) -> dict[str, dict[str, Any]]:
    """The tracker's own start-up arguments: where to write, and how a resumed run (step > 0) continues."""
    if name == "tensorboard":
        # event files are named by the second they start in: a resume's own suffix keeps it from overwriting the
        # file of an attempt that started in the same second
        return {"tensorboard": {"purge_step": step + 1, "filename_suffix": f".resume{step:09d}"}} if step else {}
    id_file = run_dir / WANDB_ID_FILE
    if step and id_file.is_file():
        run_id = id_file.read_text().strip()
    else:                   # a fresh run (its metrics.jsonl starts empty) is a new wandb run
        run_id = uuid.uuid4().hex[:12]
        id_file.write_text(run_id + "\n")
    kwargs = {"id": run_id, "resume": "allow", "name": run_dir.name}
    if "WANDB_DIR" not in os.environ:
        kwargs["dir"] = str(run_dir)
    return {"wandb": kwargs}


def start_trackers(accelerator: Accelerator, cfg: Config, run_dir: Path, step: int) -> None:
    """Start the Accelerator's trackers (none: nothing) on the main process for the run at `step` (0 when fresh,
    else the checkpoint's step), with the config as hyperparameters."""
    name = cfg.train.log_with
    if accelerator.is_main_process and name != "none":
        # TensorBoard: the project is the subfolder; wandb: one project holds every run, each named by its folder
        project = os.environ.get("WANDB_PROJECT", "chunkfuse") if name == "wandb" else cfg.train.name
        accelerator.init_trackers(project, config=hparams(cfg), init_kwargs=_init_kwargs(name, run_dir, step))


def record(row: dict, metrics: JsonlWriter | None, accelerator: Accelerator) -> None:
    """One metrics row to metrics.jsonl (where this process writes it) and to the trackers at row["step"]."""
    if metrics:
        metrics.write(row)
    accelerator.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=row["step"])
