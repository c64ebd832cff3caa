"""Atomic checkpoints on top of accelerate's save_state.

    <run>/checkpoints/step_00000500/   model.safetensors, optimizer.bin, RNG states, trainer_state.json
    <run>/checkpoints/latest           the name of the newest complete checkpoint

Under FSDP, accelerate saves the model and optimizer sharded (with configs/accelerate/fsdp.yaml's
SHARDED_STATE_DICT: pytorch_model_fsdp_0/, optimizer_0/, what --resume reads back) and no model.safetensors.
save_checkpoint then gathers the full weights and writes model.safetensors as well, so eval/perplexity.py,
generation and parity read every run's checkpoints alike.

A checkpoint is written under `<name>.tmp` and renamed into place only when complete, and
`latest` moves only after that, so a crash mid-save leaves the previous checkpoint usable.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import torch
from accelerate.utils import DistributedType

from utils.runinfo import write_atomic

_STEP = re.compile(r"^step_(\d{8})$")
STATE_FILE = "trainer_state.json"
WEIGHTS_FILE = "model.safetensors"


def complete_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run (the `latest` pointer, else the highest step)."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if pointer.is_file():
        p = pointer.parent / pointer.read_text().strip()
        if (p / STATE_FILE).is_file():
            return p
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a run folder meaning its latest checkpoint."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise FileNotFoundError(f"no complete checkpoint in {path} (expected {path}/checkpoints/step_*/{STATE_FILE})")
    return latest


def save_checkpoint(accelerator, run_dir: Path, step: int, state: dict, keep: int,
                    model: torch.nn.Module | None = None) -> Path:
    """Save model, optimizer and RNG states plus `state` (JSON) as step `step`; all ranks call this.
    `model` (the prepared one) is needed under FSDP, for the gathered model.safetensors."""
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    if fsdp and model is None:
        raise ValueError("save_checkpoint under FSDP needs the prepared model, to write the full weights")
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:08d}"
    tmp = root / f"{final.name}.tmp"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    if fsdp:   # gathers on every rank (a collective), writes on rank 0; one file, the one eval/perplexity.py reads
        accelerator.save_model(model, str(tmp), max_shard_size="1000GB", safe_serialization=True)
    # every rank writes its own RNG state into tmp: none may be renamed away while another still writes
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_atomic(tmp / STATE_FILE, json.dumps({**state, "step": step}, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        write_atomic(root / "latest", final.name)
        for old in complete_checkpoints(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def read_state(path: Path) -> dict:
    """A checkpoint's trainer_state.json (step, config) without loading any tensor."""
    return json.loads((Path(path) / STATE_FILE).read_text())


def supersede_after(run_dir: Path, step: int, resumed: Path) -> list[Path]:
    """Move the run's checkpoints after `step` into checkpoints/superseded-<time>-<random>/ and point `latest` at
    `resumed` (or at the newest checkpoint left, if `resumed` is another run's): a run resumed from an older
    checkpoint starts a new history there, and a later plain --resume must continue that one, not the old
    branch. Nothing is deleted. Returns the moved folders' new paths."""
    root = Path(run_dir) / "checkpoints"
    newer = [p for p in complete_checkpoints(run_dir) if int(_STEP.match(p.name).group(1)) > step]
    if not newer:
        return []
    aside = Path(tempfile.mkdtemp(prefix=f"superseded-{time.strftime('%Y%m%d-%H%M%S')}-", dir=root))
    moved = [Path(shutil.move(str(p), str(aside / p.name))) for p in newer]
    if Path(resumed).parent.resolve() == root.resolve():
        write_atomic(root / "latest", Path(resumed).name)
    else:
        left = complete_checkpoints(run_dir)
        if left:
            write_atomic(root / "latest", left[-1].name)
        else:
            (root / "latest").unlink(missing_ok=True)
    return moved


def load_checkpoint(accelerator, path: Path) -> dict:
    accelerator.load_state(str(path))
    return read_state(path)
