"""The runs of a parity test (scripts/parity.py): run specs, the floor's settings, the train.py command of every
backend and seed, their placement on the visible GPUs, and the scores of the finished runs (test perplexity,
per-window validation losses, teacher-forced losses on the reference's weights).

A run spec is a backend with optional train.py overrides, `fused[state]@optim.lr=3e-4`: the overrides go to that
run only, so that a setting's effect is measured the same way as a backend's. Every run of one seed gets the same
train.seed, hence the same initial weights and data order (data/sampler.py draws rows from the seed alone).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from config import ConfigError, load_config, parse_overrides, set_dotted
from ops import parse_backend

if TYPE_CHECKING:
    import torch

    from config import Config

REPO = Path(__file__).resolve().parents[1]

# set by parity for every run: a spec that changed them would break the pairing or the run folders; for all runs
# at once, the options that set them (train.seed, the first seed, may be set for all)
RESERVED = ("train.seed", "train.max_steps", "train.name", "train.out_dir", "train.eval_interval")
OPTION_FOR = {"train.max_steps": "--steps", "train.eval_interval": "--eval-interval", "train.name": "--out",
              "train.out_dir": "--out"}


@dataclass(frozen=True)
class Spec:
    """A run spec, `fused[state]@optim.lr=3e-4`: the backend and its train.py overrides (`--optim.lr=3e-4`)."""
    text: str
    backend: str
    overrides: tuple[str, ...]


def parse_spec(text: str) -> Spec:
    """`NAME@key=value[@key=value]`: a backend train.py accepts and overrides without commas; the keys parity sets
    for every run (RESERVED) are refused."""
    backend, *pairs = text.strip().split("@")
    parse_backend(backend)
    overrides = []
    for pair in pairs:
        if not re.fullmatch(r"[A-Za-z_][\w.]*=\S+", pair):
            raise ConfigError(f"run spec {text!r}: {pair!r} is not key=value (e.g. naive@model.norm_eps=1e-2)")
        if pair.split("=")[0] in RESERVED:
            raise ConfigError(f"run spec {text!r}: parity sets {pair.split('=')[0]} for every run")
        overrides.append(f"--{pair}")
    return Spec(text.strip(), backend, tuple(overrides))


def check_overrides(overrides: list[str]) -> None:
    """The overrides for every run (--key=value form) may not set what parity sets per run: the option instead."""
    for key, _ in parse_overrides(overrides):
        if key in OPTION_FOR:
            raise ConfigError(f"parity sets {key} for every run: pass {OPTION_FOR[key]} instead")


def split_specs(text: str) -> list[Spec]:
    """`naive,fused[chunk,state]@optim.lr=3e-4` → two specs: commas inside brackets stay. One or more, distinct
    (one alone measures only its floor: parity.py checks that a floor is run)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    specs = [parse_spec(p) for p in parts + [cur] if p.strip()]
    if not specs or len({s.text for s in specs}) != len(specs):
        raise ConfigError(f"--backends needs distinct run specs, got {text!r}")
    return specs


def slug(spec: str) -> str:
    """A run folder's name for a spec: fused[chunk,state]@optim.lr=3e-4 → fused-chunk-state-optim-lr-3e-4."""
    return re.sub(r"\W+", "-", spec).strip("-")


def backend_args(spec: str) -> list[str]:
    """train.py's arguments for `chunk` or `fused[state]` (the fused backend with only these components)."""
    name, fuse = parse_backend(spec)
    return ["--backend", name] + (["--fuse", fuse] if fuse else [])


def floor_overrides(config: str, overrides: list[str], split: int = 2) -> list[str]:
    """The micro-batch divided by `split`, the accumulation and evaluation batches multiplied by it: the same
    training rows and validation windows as the run it pairs with, another order of summation."""
    tc = load_config(config, overrides).train
    if split < 2 or tc.micro_batch_size % split:
        raise ConfigError(f"the floor splits the micro-batch ({tc.micro_batch_size}) into {split}: the split must be "
                          "2 or more and divide it; pass an even --train.micro_batch_size or --floor-backend none")
    return [f"--train.micro_batch_size={tc.micro_batch_size // split}", f"--train.grad_accum={tc.grad_accum * split}",
            f"--train.eval_batches={tc.eval_batches * split}"]


def preflight(config: str, overrides: list[str], flags: list[str], specs: list[Spec]) -> None:
    """Every override and backend checked before the first training starts, so that a typo (--train.max_stepz,
    naive@model.nrom_eps=1) or a backend this machine cannot run fails now, not after the reference has trained:
    each spec's model is built on the meta device, which runs every op's availability check and allocates nothing."""
    import torch

    from model import build_model

    for s in specs:
        cfg = load_config(config, overrides + list(s.overrides), flags)
        if not cfg.train.eval_batches:
            raise ConfigError("parity compares validation losses: train.eval_batches must be 1 or more")
        name, fuse = parse_backend(s.backend)
        with torch.device("meta"):
            build_model(dataclasses.replace(cfg.model, backend=name, fuse=fuse or cfg.model.fuse))


@dataclass
class Plan:
    """What a parity test trains. Run names are the spec texts plus the floor's, `<spec>~`.
    runs: name → seed → run folder; pairs: name → the name it is compared with (the reference, or for the floor
    its own spec); jobs: run folder name → train.py command; data: name → its --data.* overrides (for scoring)."""
    runs: dict[str, dict[int, Path]]
    pairs: dict[str, str]
    floor: str | None
    jobs: dict[str, list[str]]
    data: dict[str, list[str]]


def plan_runs(config: str, overrides: list[str], specs: list[Spec], floor_spec: str | None, seeds: list[int],
              steps: int, eval_interval: int, teacher: bool, out: Path) -> Plan:
    """Every run of the test: each spec, and the floor (`floor_spec` re-summed) when given, at every seed, from the
    reference's weights and data order at that seed. `overrides` in --key=value form. With `teacher` the reference
    keeps a checkpoint at every evaluation. Raises FileExistsError when a run folder is already there."""
    stem = Path(config).stem
    ref = specs[0].text
    run_args = {s.text: backend_args(s.backend) + list(s.overrides) for s in specs}
    pairs = {s.text: ref for s in specs[1:]}
    folders = {s.text: f"{stem}_{slug(s.text)}" for s in specs}
    floor = None
    if floor_spec:
        floor = f"{floor_spec}~"
        base = next(s for s in specs if s.text == floor_spec)
        run_args[floor] = run_args[floor_spec] + floor_overrides(config, overrides + list(base.overrides))
        pairs[floor], folders[floor] = floor_spec, f"{folders[floor_spec]}_floor"
    if len(set(folders.values())) != len(folders):
        raise ConfigError(f"two run specs share a folder name ({', '.join(folders.values())}); respell one")
    if teacher:
        run_args[ref] = run_args[ref] + [f"--train.ckpt_interval={eval_interval}",
                                         f"--train.keep_ckpts={steps // max(1, eval_interval) + 1}"]
    runs = {name: {seed: out / f"{folder}_s{seed}" for seed in seeds} for name, folder in folders.items()}
    taken = [str(r) for by_seed in runs.values() for r in by_seed.values() if r.exists()]
    if taken:
        raise FileExistsError(f"{', '.join(taken)} already exist; remove them or pass another --out")
    jobs = {runs[name][seed].name: [sys.executable, str(REPO / "train.py"), "--config", config,
                                    f"--train.name={runs[name][seed].name}", f"--train.out_dir={out}",
                                    f"--train.max_steps={steps}", f"--train.eval_interval={eval_interval}",
                                    "--train.ckpt_interval=0", *overrides, f"--train.seed={seed}", *run_args[name]]
            for seed in seeds for name in runs}
    data = {name: [o for o in overrides + a if o.startswith("--data.")] for name, a in run_args.items()}
    return Plan(runs, pairs, floor, jobs, data)


def visible_devices() -> list[str]:
    """The CUDA devices this process sees, as a child's CUDA_VISIBLE_DEVICES names them (this process's own list
    when it has one); empty without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    n = torch.cuda.device_count()
    mine = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return mine[:n] if mine else [str(i) for i in range(n)]


def pick_device(devices: list[str], busy: Mapping[str, int]) -> str | None:
    """The device for the next run to start: the one running the fewest runs, the first listed on a tie, so that
    runs started together go round-robin. None with fewer than two devices: every run shares the default one."""
    if len(devices) < 2:
        return None
    return min(devices, key=lambda d: busy.get(d, 0))


def prepare_data(config: str, data: list[list[str]]) -> None:
    """Every split's shards under each distinct set of --data.* overrides, built once here before concurrent runs
    race to write the same cache folder."""
    from data.prepare import main as prepare

    for overrides in sorted({tuple(d) for d in data}):
        prepare(["--config", config, *overrides])


def train_all(jobs: dict[str, list[str]], out: Path, limit: int | None, devices: Sequence[str] = (),
              what: str = "training") -> list[str]:
    """Run the train.py (or other) commands, `limit` at a time (None: one by one, output to this terminal; 0: all at once),
    the concurrent ones logging to <out>/<name>.log and spread over `devices` (pick_device) when two or more.
    They run in this process's working folder, so that relative paths (--config, --out, the data cache) name the
    same files in every run and in the scoring after them. A failed command does not stop the others: each is
    reported as an `error:` line and the failed names are returned, so that what did finish is still scored."""
    lock, busy = threading.Lock(), Counter()

    def one(name: str) -> int:
        with lock:
            device = pick_device(list(devices), busy)
            busy[device] += 1
        env = None if device is None else {**os.environ, "CUDA_VISIBLE_DEVICES": device}
        try:
            if limit is None:
                print(f"== {name}", flush=True)
                return subprocess.run(jobs[name], env=env).returncode
            print(f"== {name} (log: {out / name}.log{'' if device is None else f', GPU {device}'})", flush=True)
            with open(out / f"{name}.log", "w") as log:
                return subprocess.run(jobs[name], env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        finally:
            with lock:
                busy[device] -= 1

    if limit is None:
        codes = {name: one(name) for name in jobs}
    else:
        with ThreadPoolExecutor(limit or len(jobs)) as pool:
            codes = dict(zip(jobs, pool.map(one, jobs)))
    failed = [n for n, c in codes.items() if c]
    for n in failed:
        print(f"error: {what} {n} failed" + ("; its error is above" if limit is None else f" (see {out / n}.log)"),
              file=sys.stderr, flush=True)
    return failed


def drop_failed(runs: dict[str, dict[int, Path]], failed: Sequence[str]) -> list[str]:
    """Remove the failed runs (by folder name) from `runs` in place; a name left with no seed is removed. Returns a
    warning line per failed run for the report."""
    gone = set(failed)
    lines = []
    for name in list(runs):
        for seed, folder in list(runs[name].items()):
            if folder.name in gone:
                del runs[name][seed]
                lines.append(f"`{name}` at seed {seed} failed and is left out (see {folder}.log)")
        if not runs[name]:
            del runs[name]
    return lines


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def describe_devices(devices: Sequence[str]) -> str:
    """The device the runs trained on, for the report: the GPU's name (with the count when spread over several)."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return f"{len(devices)}× {torch.cuda.get_device_name()}" if len(devices) > 1 else torch.cuda.get_device_name()


def window_losses(run: Path, data_overrides: list[str]) -> dict:
    """The mean loss of each validation window train.py's final evaluation scored (its first
    eval_batches·micro_batch_size windows), on the run's final weights: {"losses", "micro_batch", "available"}."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from data.prepare import prepare_split
    from data.sampler import bos_token, eval_batches
    from eval.perplexity import load_model

    device = _device()
    model, cfg, _ = load_model(run, None, device)
    for key, value in parse_overrides(data_overrides):
        set_dotted(cfg, key, value)
    store = prepare_split(cfg.data, "valid", log=lambda *a: None)
    T, mb = cfg.data.seq_len, cfg.train.micro_batch_size
    bf16 = device == "cuda" and cfg.train.precision in ("auto", "bf16")   # evaluate as trained
    out = []
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16) if bf16 else contextlib.nullcontext():
        for x, y in eval_batches(store, T, mb, cfg.train.eval_batches, bos=bos_token(store, cfg.data.bos)):
            logits, _ = model(x.to(device))
            nll = F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten(), reduction="none")
            out.append(nll.view_as(y).double().mean(1).cpu())
    return {"losses": np.concatenate([o.numpy() for o in out]), "micro_batch": mb, "available": (len(store) - 1) // T}


def score_all(runs: Mapping[str, Mapping[int, Path]], data: Mapping[str, list[str]], out: Path, limit: int | None,
              devices: Sequence[str] = ()) -> dict[str, dict[int, dict]]:
    """score_test_split for every run: in this process one by one (`limit` None), else as eval/perplexity.py
    processes run like the training ones, `limit` at a time over `devices` (a slow backend's scoring overlaps the
    others'). {spec: {seed: result}}."""
    if limit is None:
        return {name: {seed: score_test_split(folder, data[name]) for seed, folder in by_seed.items()}
                for name, by_seed in runs.items()}
    jobs = {f"{folder.name}_test": [sys.executable, str(REPO / "eval" / "perplexity.py"), "--ckpt", str(folder),
                                    "--split", "test", "--out", str(folder / "eval_test.json"), *data[name]]
            for name, by_seed in runs.items() for folder in by_seed.values()}
    failed = train_all(jobs, out, limit, devices, what="scoring the test split")
    if failed and limit != 1:
        # concurrent scorers can run out of GPU memory together: the failed ones get the GPU to themselves
        print(f"scoring {len(failed)} run(s) again one at a time", flush=True)
        failed = train_all({n: jobs[n] for n in failed}, out, 1, devices, what="scoring the test split")
    return {name: {seed: ({"error": f"scoring failed (see {out / folder.name}_test.log)"}
                          if f"{folder.name}_test" in failed else json.loads((folder / "eval_test.json").read_text()))
                   for seed, folder in by_seed.items()} for name, by_seed in runs.items()}


def score_test_split(run: Path, data_overrides: list[str]) -> dict:
    """eval/perplexity.py on the run's final checkpoint, test split, non-overlapping windows (→ run/eval_test.json)."""
    from eval import perplexity

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return perplexity.main(["--ckpt", str(run), "--split", "test", "--out", str(run / "eval_test.json"),
                                *data_overrides])



class ShapesDiffer(Exception):
    """A spec's model.* overrides change parameter shapes: it cannot be scored on the reference's weights."""


def load_spec_model(ckpt: Path, spec: Spec, device: str) -> tuple[torch.nn.Module, Config]:
    """A checkpoint's weights in `spec`'s backend, with the spec's model.* overrides applied: (model, config).
    Raises ShapesDiffer when those overrides change the parameters' shapes."""
    from eval.perplexity import load_model
    from model import build_model

    name, fuse = parse_backend(spec.backend)
    model, cfg, _ = load_model(ckpt, name, device, fuse)
    changes = [(k, v) for k, v in parse_overrides(list(spec.overrides)) if k.startswith("model.")]
    if changes:
        for k, v in changes:
            set_dotted(cfg, k, v)
        rebuilt = build_model(cfg.model)
        try:
            rebuilt.load_state_dict(model.state_dict(), strict=True)
        except RuntimeError:
            raise ShapesDiffer(f"{spec.text}'s parameters have other shapes than the reference's") from None
        model = rebuilt.to(device).eval()
    return model, cfg


def teacher_forced(ref_run: Path, specs: list[Spec], data_overrides: list[str], tolerance: float) -> dict:
    """Each spec's validation loss on the reference run's checkpoints, minus the reference's own: the same function
    on trained weights, no training dynamics. {spec: {"loss": {step: loss}, "delta": {step: Δ}, "pass": every
    |Δ| ≤ tolerance}}; a spec whose model.* overrides change the parameters' shapes gets {"skipped": why}."""
    from eval.perplexity import evaluate_split
    from utils.checkpoint import complete_checkpoints

    device = _device()
    ckpts = sorted(complete_checkpoints(ref_run), key=lambda c: int(c.name.split("_")[-1]))
    if not ckpts:
        raise FileNotFoundError(f"--teacher found no checkpoints in {ref_run}")
    losses: dict[str, dict[int, float]] = {s.text: {} for s in specs}
    skipped: dict[str, str] = {}
    for ckpt in ckpts:
        for s in specs:
            if s.text in skipped:
                continue
            try:
                model, cfg = load_spec_model(ckpt, s, device)
            except ShapesDiffer as e:
                skipped[s.text] = str(e)
                continue
            for key, value in parse_overrides(data_overrides):
                set_dotted(cfg, key, value)
            seq = cfg.data.seq_len
            result = evaluate_split(model, cfg, "valid", seq, seq, cfg.train.micro_batch_size, progress=False)
            losses[s.text][int(ckpt.name.split("_")[-1])] = result["loss"]
            del model
    ref = losses[specs[0].text]
    out = {}
    for b in losses:
        if b in skipped:
            out[b] = {"skipped": skipped[b]}
        else:
            delta = {t: losses[b][t] - ref[t] for t in ref}
            out[b] = {"loss": losses[b], "delta": delta, "pass": all(abs(x) <= tolerance for x in delta.values())}
    return out
