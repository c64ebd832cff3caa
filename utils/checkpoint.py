"""Atomic checkpoints on top of accelerate's save_state.

    <run>/checkpoints/step_00000500/   model.safetensors, optimizer.bin, RNG states, trainer_state.json
    <run>/checkpoints/latest           the name of the newest complete checkpoint

Under FSDP, accelerate saves the model and optimizer sharded (with configs/accelerate/fsdp.yaml's
SHARDED_STATE_DICT: pytorch_model_fsdp_0/, optimizer_0/, what --resume reads back) and no model.safetensors.
save_checkpoint then gathers the full weights and writes model.safetensors as well, so eval/perplexity.py,
generation and parity read every run's checkpoints alike.

A checkpoint is written under `<name>.tmp` and renamed into place only when complete, and
`latest` moves only after that, so a crash mid-save leaves the previous checkpoint usable. A save that fails
(full disk, read-only folder) removes its `.tmp` folder and raises CheckpointError naming the last good
checkpoint; `.tmp` folders a killed process left are removed at the next start (clean_stale_tmp).

On --resume, find_resumable checks each candidate cheaply before accelerate's load_state (trainer_state.json
parses, model.safetensors's header opens, optimizer.bin loads memory-mapped) and falls back to the previous
good checkpoint, saying what it skipped and why. check_resume_config refuses a resume whose settings would change
the run being continued (RESUMABLE lists those it may change).
"""
from __future__ import annotations

import itertools
import json
import os
import pickle
import re
import shutil
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable

import torch
from accelerate.utils import DistributedType
from safetensors import SafetensorError, safe_open

from config import Config, ConfigError, flatten, to_dict
from utils.errors import UserError, free_bytes, os_reason
from utils.runinfo import write_atomic

_STEP = re.compile(r"^step_(\d{8})$")
STATE_FILE = "trainer_state.json"
WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.bin"
FSDP_MODEL_DIR = "pytorch_model_fsdp_0"
# what a resume may do instead when a checkpoint cannot be used
START_OVER = "start over with another --train.name"
PICK_ANOTHER = "pass --resume PATH to a specific checkpoint (a step_* folder)"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written or read back, with the file, the reason and what to do."""


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


_AGREEMENTS = itertools.count()       # every rank makes the same calls, so the n-th call has the same keys on all


def _first_failure(accelerator, error: str | None) -> str | None:
    """Every rank's `error` (None: this rank succeeded): the first one, or None on every rank if all succeeded.
    Every rank then fails alike instead of the others waiting forever for a rank that stopped. The errors go
    through the process group's key-value store around a barrier, not an object collective: gloo's worker thread
    releases a finished object collective's Python tensors after it, and when that comes as the process group
    is torn down at exit it needs the GIL its destructor holds (a hang)."""
    if accelerator.num_processes == 1:
        return error
    from torch.distributed import distributed_c10d

    store, n = distributed_c10d._get_default_store(), next(_AGREEMENTS)
    keys = [f"chunkfuse/agreement/{n}/{rank}" for rank in range(accelerator.num_processes)]
    if error:
        store.set(keys[accelerator.process_index], error)
    accelerator.wait_for_everyone()
    return next((store.get(k).decode() for k in keys if store.check([k])), None)


# how torch's zip writer and safetensors report a full disk (a RuntimeError, not an OSError)
_WRITE_FAILURE_TEXT = re.compile(r"No space left|unexpected pos|failed writing|write failed|file write|IoError|"
                                 r"StorageFull|Disk quota", re.I)
_LOW_SPACE = 64 << 20


def _write_failure(e: BaseException, where: Path) -> str | None:
    """Why writing under `where` failed, in words, if `e` is a failed write (an OSError, torch's or safetensors'
    write errors, or any error with the disk nearly full); None if it looks like a bug."""
    free = free_bytes(where)
    low = free is not None and free < _LOW_SPACE
    if isinstance(e, OSError):
        return os_reason(e)
    lines = str(e).strip().splitlines() or [""]
    line = next((x for x in lines if _WRITE_FAILURE_TEXT.search(x)), lines[0]).strip()[:200]
    if _WRITE_FAILURE_TEXT.search(str(e)) or low:
        disk = f"the disk is full ({free / 2**20:.0f} MiB free)" if low else "the write failed"
        return f"{disk}: {type(e).__name__}: {line}"
    return None


def save_checkpoint(accelerator, run_dir: Path, step: int, state: dict, keep: int,
                    model: torch.nn.Module | None = None) -> Path:
    """Save model, optimizer and RNG states plus `state` (JSON) as step `step`; all ranks call this.
    `model` (the prepared one) is needed under FSDP, for the gathered model.safetensors.
    A failed write (full disk, read-only folder) removes the partial `.tmp` folder, leaves the previous
    checkpoint as it was, and raises CheckpointError on every rank, naming the last good checkpoint."""
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    if fsdp and model is None:
        raise ValueError("save_checkpoint under FSDP needs the prepared model, to write the full weights")
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:08d}"
    tmp = root / f"{final.name}.tmp"
    main = accelerator.is_main_process
    previous = latest_checkpoint(run_dir) if main else None
    bug: BaseException | None = None

    def attempt(fn: Callable[[], None]) -> None:
        """Run fn on this rank, then agree with the others; on any rank's failure clean up and raise."""
        nonlocal bug
        error = None
        try:
            fn()
        except Exception as e:
            error = _write_failure(e, root)
            if error is None:
                bug, error = e, f"{type(e).__name__} on rank {accelerator.process_index}: {e}"
        failure = _first_failure(accelerator, error)
        if failure is None:
            return
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        if bug is not None:
            raise bug       # a bug keeps its traceback (the partial folder is gone all the same)
        last = previous if main else None
        raise CheckpointError(
            f"could not write checkpoint {final}: {failure}. The partial {tmp.name} was removed; "
            + (f"the last good checkpoint is {last}" if last else "no earlier checkpoint was saved" if main
               else "see rank 0's message for the last good checkpoint")
            + f". Free space or make {root} writable, then continue with the same command and --resume")

    def begin() -> None:
        if main:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()

    def write() -> None:
        accelerator.save_state(str(tmp), safe_serialization=True)
        if fsdp:   # gathers on every rank (a collective), writes on rank 0; one file, the one eval/perplexity.py reads
            accelerator.save_model(model, str(tmp), max_shard_size="1000GB", safe_serialization=True)

    def finish() -> None:
        if main:
            write_atomic(tmp / STATE_FILE, json.dumps({**state, "step": step}, indent=1))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            write_atomic(root / "latest", final.name)
            for old in complete_checkpoints(run_dir)[:-keep] if keep > 0 else []:
                shutil.rmtree(old, ignore_errors=True)

    attempt(begin)
    # every rank writes its own RNG state into tmp: none may be renamed away while another still writes
    attempt(write)
    attempt(finish)
    return final


def clean_stale_tmp(run_dir: Path, log: Callable[[str], None] = print) -> list[Path]:
    """Remove the `<step>.tmp` checkpoint folders (and `latest.tmp`) that a process killed mid-save left in the
    run folder; call with the run's lock held, so no live run is writing them. Returns what was removed."""
    root = Path(run_dir) / "checkpoints"
    stale = sorted(p for p in root.glob("*.tmp")) if root.is_dir() else []
    for p in stale:
        log(f"removing {p}: a checkpoint left incomplete by an earlier process that stopped mid-save")
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return stale


def checkpoint_problem(path: Path, optimizer: bool = True) -> str | None:
    """Why the checkpoint folder `path` cannot be resumed from (the file and what is wrong with it), or None.
    Cheap: trainer_state.json is parsed, model.safetensors's header opened (safetensors checks it against the
    file's size), optimizer.bin loaded memory-mapped (its zip index sits at the end: a truncated or garbage file
    fails at once; `optimizer` False skips it, for evaluation). A sharded FSDP checkpoint's shard folders are left
    to accelerate."""
    path = Path(path)
    state = path / STATE_FILE
    try:
        saved = json.loads(state.read_text())
    except FileNotFoundError:
        return f"{state} is missing"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return f"{state} is unreadable (truncated or corrupt: {type(e).__name__}: {e})"
    if not isinstance(saved, dict) or not isinstance(saved.get("step"), int):
        return f"{state} records no step (not a trainer state)"
    sharded = (path / FSDP_MODEL_DIR).is_dir()
    weights = path / WEIGHTS_FILE
    if weights.exists() or not sharded:
        try:
            with safe_open(str(weights), framework="pt") as f:
                if not list(f.keys()):
                    return f"{weights} holds no tensors"
        except FileNotFoundError:
            return f"{weights} is missing"
        except (OSError, SafetensorError, ValueError, RuntimeError) as e:
            return f"{weights} is unreadable (truncated or corrupt: {type(e).__name__}: {e})"
    opt = path / OPTIMIZER_FILE
    if optimizer and (opt.exists() or not sharded):
        if not opt.is_file():
            return f"{opt} is missing"
        try:
            if not zipfile.is_zipfile(opt):     # its index is at the end: gone when truncated
                return f"{opt} is unreadable (truncated or corrupt: not a complete torch.save archive)"
            torch.load(opt, map_location="cpu", mmap=True, weights_only=True)
        except FileNotFoundError:
            return f"{opt} is missing"
        except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as e:
            why = (str(e).strip().splitlines() or [""])[0][:200]
            return f"{opt} is unreadable (truncated or corrupt: {type(e).__name__}: {why})"
    return None


def find_resumable(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint of a run that passes checkpoint_problem: the `latest` pointer's, else the newest
    one before it that does. Returns it (None if none does) and the (checkpoint, problem) of each skipped."""
    first = latest_checkpoint(run_dir)
    if first is None:
        return None, []
    older = [p for p in reversed(complete_checkpoints(run_dir)) if p.name < first.name]
    skipped = []
    for p in [first, *older]:
        problem = checkpoint_problem(p)
        if problem is None:
            return p, skipped
        skipped.append((p, problem))
    return None, skipped


def resume_target(path: Path, log: Callable[[str], None] = print) -> Path:
    """What --resume continues from: `path` itself if it is a checkpoint folder (which must be usable), else the
    newest usable checkpoint of the run folder `path`, skipping (with a warning each) newer ones that are not.
    Raises CheckpointError naming the bad file when none is usable, FileNotFoundError when there is none."""
    path = Path(path)
    if (path / STATE_FILE).is_file() or _STEP.match(path.name):
        problem = checkpoint_problem(path)
        if problem:
            raise CheckpointError(f"--resume {path}: {problem}. Pass --resume PATH to another checkpoint (or to "
                                  f"the run folder, for its newest usable one), or {START_OVER}")
        return path
    found, skipped = find_resumable(path)
    for bad, problem in skipped:
        log(f"warning: --resume: skipping {bad}: {problem}")
    if found is None:
        if skipped:
            problems = "; ".join(problem for _, problem in skipped)
            raise CheckpointError(f"--resume: {path} has no usable checkpoint: {problems}. {START_OVER[0].upper()}"
                                  f"{START_OVER[1:]}, or {PICK_ANOTHER}")
        raise FileNotFoundError(f"--resume: no complete checkpoint under {path}/checkpoints (expected "
                                f"step_*/{STATE_FILE}); start without --resume, or pass --resume PATH")
    if skipped:
        log(f"warning: --resume: continuing from {found} (step {read_state(found)['step']}), the newest usable "
            f"checkpoint; the skipped ones will be moved to {path}/checkpoints/superseded-*/, not deleted")
    return found


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
    """Load a checkpoint's states into the prepared objects; its trainer state. A file accelerate cannot read
    (one checkpoint_problem does not check, e.g. random_states_0.pkl) is a CheckpointError naming it."""
    try:
        accelerator.load_state(str(path))
    except (OSError, EOFError, RuntimeError, ValueError, KeyError, pickle.UnpicklingError, SafetensorError) as e:
        why = (str(e).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(f"could not load checkpoint {path}: {type(e).__name__}: {why}. Pass --resume PATH to "
                              f"an earlier checkpoint, or {START_OVER}") from e
    return read_state(path)


# What a resumed run may change without --allow-changes: how long it runs, what it logs and where, and which
# kernels compute the (same) model. Anything else changes the model, the data order or the numerics of the run
# being continued, so the run would silently mix two settings.
RESUMABLE = frozenset({"model.backend", "model.fuse", "train.name", "train.out_dir", "train.max_steps",
                       "train.log_interval", "train.eval_interval", "train.eval_batches", "train.ckpt_interval",
                       "train.keep_ckpts", "train.progress", "train.log_with", "train.activation_checkpointing",
                       "train.max_bad_steps", "train.cuda_graphs", "train.compile", "train.compile_scope",
                       "data.cache_dir", "data.num_proc", "data.verify", "data.tokenizer_file"})


def check_resume_config(saved: dict | None, cfg: Config, allow: bool, log) -> None:
    """Refuse a resume whose settings differ from the checkpoint's outside RESUMABLE (model keys always, the
    rest unless `allow`); log every difference that goes through. Keys a checkpoint predates are not compared."""
    if saved is None:
        log("resume: the checkpoint records no config; the settings were not compared")
        return
    old, new = flatten(saved), flatten(to_dict(cfg))
    changed = {k: (old[k], new[k]) for k in sorted(old.keys() & new.keys()) if old[k] != new[k]}

    def listed(keys):
        return "; ".join(f"{k} (checkpoint {changed[k][0]!r}, now {changed[k][1]!r})" for k in keys)

    model = [k for k in changed if k.startswith("model.") and k not in RESUMABLE]
    if model:
        raise ConfigError(f"--resume: the model differs from the checkpoint's: {listed(model)}. The checkpoint's "
                          "weights are that model's: resume with its settings (its config is in the run's "
                          "config.yaml), or start a new run with another --train.name")
    other = [k for k in changed if k not in RESUMABLE and not k.startswith("model.")]
    if other and not allow:
        raise ConfigError(f"--resume: settings differ from the checkpoint's: {listed(other)}. They change the "
                          "data order or the numerics of the run being continued. Pass the checkpoint's values, "
                          "add --allow-changes to continue with the new ones, or start a new run with another "
                          "--train.name")
    for k, (a, b) in changed.items():
        log(f"resume: {k} {a!r} -> {b!r}")
