"""Does training scale to several GPUs? One GPU against N GPUs at the same global batch, then the report.

    python scripts/scaling.py --config configs/gla_340m.yaml --backend fused --nproc 2
    python scripts/scaling.py --config configs/gdn_340m.yaml --backend fused --nproc 2 --fsdp --steps 40
    python scripts/scaling.py --config configs/gla_340m.yaml,configs/gdn_340m.yaml --backend fused --nproc 2,4 \\
        --floor --steps 200 --rate-steps 60 --out runs/scaling/ddp      # a whole study on one 4-GPU host
    python scripts/scaling.py --report DIR                    # the report of a study already trained in DIR
    python scripts/scaling.py --table DIR [DIR ...]           # several studies in one table and plot

Per config, every run has the same global batch: gpu<N> runs under `accelerate launch` (configs/accelerate/ddp.yaml,
or fsdp.yaml with --fsdp) on N GPUs at accumulation maxN·A/N (A = --grad-accum, maxN the largest N), gpu1 on one
GPU at maxN·A, so each step is made of the same rows and only the reduction order differs. --floor adds gpu1-floor:
one GPU at half the micro-batch and twice the accumulation, the same rows summed in another order; its loss gap is
what reordering alone costs, and the N-GPU gap is read against it. Under FSDP the one-GPU runs are FSDP too (accelerate
with one process), so the ratio and the gap are the scaling's alone. gpu1, gpu1-floor and the largest N train --steps
steps and their losses are compared; the other N train --rate-steps, for their rate. Runs log every step, skip
evaluation and checkpoints, warm up 10 steps unless an override says otherwise; any other `--a.b=value` reaches every
run. The data are prepared once per config first (python -m data.prepare), so that the N processes do not all tokenize.

Concurrency: the runs of all configs share one queue and run at once on disjoint GPUs where they fit (--gpus of the
visible ones; each run gets its own CUDA_VISIBLE_DEVICES and rendezvous port); --serial runs one at a time, for
timings free of neighbours. A study stopped part-way (a time limit, a lost machine) goes on with --resume and the same
arguments: the runs it finished are kept, the others trained.

Each config's folder is <out>/<config>-<backend>-<launcher> (with one config, --out is that folder; default parent
runs/scaling): gpu*/ hold the runs' metrics.jsonl and run.json (their checkpoints are deleted), gpu*.log their output,
scaling.{md,json,png} the report (scripts/scaling_report.py: rates, per-GPU efficiency against ≥ 0.95 under DDP and
≥ 0.90 under FSDP, peak memory, loss gaps). With several configs, <out>/scaling.{md,json,png} gathers them; --table
gathers any study folders into <out>.{md,json,png}. NCCL runs with NVLink multicast off (NCCL_NVLS_ENABLE=0).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.scaling_report import FLOOR, report, table

REPO = Path(__file__).resolve().parents[1]
RESERVED = ("--train.grad_accum=", "--train.max_steps=", "--train.name=", "--train.out_dir=")   # the study sets them


@dataclass(eq=False)
class Run:
    """One training run of a study: its config's folder, its name there, its command and the GPUs it needs."""
    folder: Path
    name: str
    argv: list[str]
    gpus: int
    cost: float                     # steps × rows per GPU per step, in one-GPU steps: the schedule's duration guess
    port: int | None = None         # rendezvous port of an accelerate launch
    steps: int = 0                  # its --train.max_steps
    accum: int = 1                  # its --train.grad_accum
    ids: list[str] = field(default_factory=list)     # the physical GPUs it owns, set when scheduled
    start: float = 0.0              # when it started: seconds, or one-GPU steps in a dry run's estimate

    @property
    def label(self) -> str:
        return f"{self.folder.name}/{self.name}"


# ---- the runs of one config --------------------------------------------------------------------------------------

def commands(config: str, backend: str, nprocs: list[int], fsdp: bool, steps: int, rate_steps: int, grad_accum: int,
             out: Path, overrides: list[str], micro: int | None = None,
             port: int = 29500) -> tuple[list[str], list[Run]]:
    """The data preparation's argv and the runs of one config: gpu1, gpu<N> for each N and, given the config's
    micro-batch `micro`, gpu1-floor. The largest N runs at accumulation grad_accum, n GPUs at max(nprocs)·grad_accum/n
    (an integer: the caller checks). Accelerate launches take the ports port, port + 1, ..."""
    top, ports = max(nprocs), itertools.count(port)
    total = top * grad_accum
    launcher = REPO / "configs" / "accelerate" / ("fsdp.yaml" if fsdp else "ddp.yaml")

    def launch(n: int) -> tuple[int | None, list[str]]:
        if n == 1 and not fsdp:                                         # DDP on one process: plain training
            return None, [sys.executable]
        p = next(ports)
        return p, [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(launcher),
                   "--num_processes", str(n), "--main_process_port", str(p)]

    def run(name: str, n: int, length: int, accum: int, *extra: str) -> Run:
        p, head = launch(n)
        argv = [*head, "train.py", "--config", config, "--backend", backend, f"--train.max_steps={length}",
                "--train.log_interval=1", "--train.eval_interval=1000000", "--train.eval_batches=4",
                "--train.ckpt_interval=1000000", "--train.progress=false", f"--train.out_dir={out}",
                "--optim.warmup_steps=10", *overrides, f"--train.name={name}", f"--train.grad_accum={accum}",
                *extra]
        return Run(out, name, argv, n, length / n, p, length, accum)

    runs = [run("gpu1", 1, steps, total)]
    runs += [run(f"gpu{n}", n, steps if n == top else rate_steps, total // n) for n in nprocs]
    if micro is not None:
        runs.append(run(FLOOR, 1, steps, 2 * total, f"--train.micro_batch_size={micro // 2}"))
    data = [o for o in overrides if o.startswith("--data.")]
    return [sys.executable, "-m", "data.prepare", "--config", config, *data], runs


def micro_batch(config: str, overrides: list[str]) -> int:
    """train.micro_batch_size of the preset with the overrides applied (config.py's own loading)."""
    from config import load_config
    return load_config(config if Path(config).is_file() else REPO / config, overrides).train.micro_batch_size


def gpu_ids(count: int | None, dry_run: bool) -> list[str]:
    """The physical ids of the GPUs the study may use: the first `count` (default all) of CUDA_VISIBLE_DEVICES when
    it is set, else of the devices torch sees (a dry run with --gpus takes 0..count-1 without looking)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = []
        for token in (t.strip() for t in env.split(",")):
            if not token or token.startswith("-"):              # CUDA ignores the list from the first invalid id
                break
            ids.append(token)
    elif dry_run and count is not None:
        ids = [str(i) for i in range(count)]
    else:
        import torch
        ids = [str(i) for i in range(torch.cuda.device_count())]
    if count is not None and count > len(ids):
        raise SystemExit(f"--gpus {count}: only {len(ids)} GPU(s) are visible")
    return ids[:count] if count is not None else ids


# ---- scheduling ------------------------------------------------------------------------------------------------

def order(runs: list[Run]) -> list[Run]:
    """The queue: the runs needing the most GPUs first, the longest first among those."""
    return sorted(runs, key=lambda r: (-r.gpus, -r.cost))


def schedule(runs: list[Run], ids: list[str], serial: bool, start: Callable[[Run], object],
             wait: Callable[[list], list]) -> None:
    """Starts the queued runs in order, each on the first free GPUs (its `ids`) as soon as enough are free; a run
    that does not fit yet lets a later, smaller one go first. With `serial`, one run at a time. start(run) launches
    a run and returns its handle; wait(handles) blocks until some of them end and returns those."""
    if too_big := [r.label for r in runs if r.gpus > len(ids)]:
        raise SystemExit(f"{', '.join(too_big)} need(s) more than the {len(ids)} GPU(s) given")
    queue, free, running = list(runs), list(ids), {}
    while queue or running:
        for run in list(queue):
            if serial and running:
                break
            if run.gpus <= len(free):
                queue.remove(run)
                run.ids, free = free[:run.gpus], free[run.gpus:]
                running[start(run)] = run
        for handle in wait(list(running)):
            free = sorted(free + running.pop(handle).ids, key=ids.index)


def simulate(runs: list[Run], ids: list[str], serial: bool) -> list[Run]:
    """The schedule if each run took its `cost`: the runs in the order they would start, their ids and starts set."""
    clock, started = [0.0], []

    def start(run: Run) -> Run:
        run.start = clock[0]
        started.append(run)
        return run

    def wait(handles: list[Run]) -> list[Run]:
        clock[0] = min(r.start + r.cost for r in handles)
        return [r for r in handles if r.start + r.cost <= clock[0] + 1e-9]

    schedule(runs, ids, serial, start, wait)
    return started


def kill(proc: subprocess.Popen) -> None:
    """SIGTERM to the run's process group (accelerate and its workers), SIGKILL if it lingers."""
    for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


def execute(runs: list[Run], ids: list[str], serial: bool, timeout: float, env: dict[str, str],
            poll: float = 1.0) -> dict[Run, int | str]:
    """Trains the runs as `schedule` places them, each in its own process group with CUDA_VISIBLE_DEVICES = its ids
    and its output in <folder>/<name>.log; a run past `timeout` seconds (0: none) is killed. Returns each run's exit
    code (or why it was stopped); a failed run does not stop the others."""
    procs, results, t0 = {}, {}, time.monotonic()

    def start(run: Run) -> subprocess.Popen:
        run.folder.mkdir(parents=True, exist_ok=True)
        with open(run.folder / f"{run.name}.log", "w") as log:
            proc = subprocess.Popen(run.argv, cwd=REPO, env={**env, "CUDA_VISIBLE_DEVICES": ",".join(run.ids)},
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        run.start = time.monotonic()
        print(f"[{run.start - t0:6.0f} s] start {run.label} on GPUs {','.join(run.ids)}"
              + (f", port {run.port}" if run.port else ""), flush=True)
        procs[proc] = run
        return proc

    def wait(handles: list[subprocess.Popen]) -> list[subprocess.Popen]:
        while True:
            done = []
            for proc in handles:
                run, rc = procs[proc], proc.poll()
                if rc is None and timeout and time.monotonic() - run.start > timeout:
                    kill(proc)
                    rc = f"timeout after {timeout:g} s"
                if rc is not None:
                    results[run] = rc
                    finished(run, rc, time.monotonic() - t0)
                    done.append(proc)
            if done:
                return done
            time.sleep(poll)

    def terminated(signum, frame):
        raise SystemExit(f"scaling.py: stopped by signal {signum}")

    previous = signal.signal(signal.SIGTERM, terminated)     # `timeout` or a job manager: the same clean-up as Ctrl-C
    try:
        schedule(runs, ids, serial, start, wait)
    except BaseException:                                   # Ctrl-C or a bug: no orphaned training on the GPUs
        for proc in procs:
            if proc.poll() is None:
                kill(proc)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return results


def finished(run: Run, rc: int | str, now: float) -> None:
    """The end line of a run, the end of its log if it failed; its checkpoints deleted (gigabytes at 340M, and the
    report needs none)."""
    status = rc if isinstance(rc, str) else f"exit {rc}"
    print(f"[{now:6.0f} s] end {run.label} on GPUs {','.join(run.ids)}: {time.monotonic() - run.start:.0f} s, "
          f"{status}", flush=True)
    if rc != 0:
        tail = (run.folder / f"{run.name}.log").read_text(errors="replace").splitlines()[-5:]
        print(f"the end of {run.folder / run.name}.log:\n" + "\n".join(tail), flush=True)
    shutil.rmtree(run.folder / run.name / "checkpoints", ignore_errors=True)


def done_before(run: Run) -> bool:
    """Whether the run's folder already holds this run, finished: run.json with its GPU count, accumulation and
    length, and a training row at its last step (what --resume keeps)."""
    path = run.folder / run.name
    try:
        info = json.loads((path / "run.json").read_text())
        train = info["config"]["train"]
        if (info["world_size"], train["grad_accum"], train["max_steps"]) != (run.gpus, run.accum, run.steps):
            return False
        with open(path / "metrics.jsonl") as f:
            return any(r.get("step") == run.steps and "loss" in r for r in map(json.loads, f))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def prepare(folder: Path, argv: list[str], env: dict[str, str]) -> None:
    """The config's data preparation, before any training; its failure stops the study."""
    folder.mkdir(parents=True, exist_ok=True)
    print(f"== prepare {folder.name}: {' '.join(argv)}", flush=True)
    with open(folder / "prepare.log", "w") as log:
        if subprocess.run(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
            raise SystemExit(f"data preparation failed: see {folder / 'prepare.log'}")


# ---- the command line ------------------------------------------------------------------------------------------

def counts(text: str, p: argparse.ArgumentParser) -> list[int]:
    try:
        values = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        p.error(f"--nproc takes GPU counts separated by commas, e.g. 2,4; got {text!r}")
    if not values or values[0] < 2:
        p.error(f"--nproc must be at least 2 (the GPUs of the multi-GPU runs), got {text}")
    return values


def main(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="presets separated by commas, e.g. configs/gla_340m.yaml,configs/gdn_340m.yaml")
    p.add_argument("--backend", default="fused", help="train.py's --backend for every run (default fused)")
    p.add_argument("--nproc", default="2", help="GPU counts of the multi-GPU runs, e.g. 2,4 (each at least 2)")
    p.add_argument("--fsdp", action="store_true", help="FSDP (configs/accelerate/fsdp.yaml) instead of DDP")
    p.add_argument("--floor", action="store_true", help="add gpu1-floor: one GPU, half the micro-batch, twice the "
                   "accumulation (the loss gap of reordering alone)")
    p.add_argument("--steps", type=int, default=60, help="steps of the runs whose losses are compared: gpu1, "
                   "gpu1-floor and the largest N (default 60)")
    p.add_argument("--rate-steps", type=int, help="steps of the other N-GPU runs, which give a rate (default --steps)")
    p.add_argument("--grad-accum", type=int, default=2, help="the largest N's accumulation; n GPUs run at maxN·A/n")
    p.add_argument("--gpus", type=int, help="GPUs to use (default: all visible, CUDA_VISIBLE_DEVICES respected)")
    p.add_argument("--serial", action="store_true", help="one run at a time (timings free of neighbours)")
    p.add_argument("--port", type=int, default=29500, help="first rendezvous port; each launch takes the next")
    p.add_argument("--skip", type=int, default=10, help="steps left out of the rates (compilation, autotuning)")
    p.add_argument("--resume", action="store_true", help="keep the runs a stopped study already finished (same "
                   "GPU count, accumulation and steps) and train only the others")
    p.add_argument("--run-timeout", type=int, default=0, help="seconds each run may take (0: no limit)")
    p.add_argument("--out", type=Path, help="one config: its folder (default runs/scaling/<config>-<backend>-"
                   "<launcher>); several: their parent (default runs/scaling); with --table, the stem of the table's "
                   "files (default <first DIR>/scaling)")
    p.add_argument("--report", type=Path, metavar="DIR", help="only report the study already trained in DIR")
    p.add_argument("--table", type=Path, nargs="+", metavar="DIR", help="gather study folders into one table")
    p.add_argument("--dry-run", action="store_true", help="print the commands and the schedule, and exit")
    args, overrides = p.parse_known_args(argv)
    if bad := [o for o in overrides if not o.startswith("--") or "=" not in o]:
        p.error(f"unrecognised arguments {' '.join(bad)}: train.py overrides take the form --a.b=value")
    if args.table:
        return table(args.table, args.skip, args.out)
    if args.report:
        return report(args.report, args.skip, {})
    if not args.config:
        p.error("--config is required to train (or give --report DIR or --table DIR ...)")
    if taken := [o for o in overrides if o.startswith(RESERVED)]:
        p.error(f"{' '.join(taken)}: the study sets these (use --grad-accum, --steps, --out)")
    configs, nprocs = [c for c in args.config.split(",") if c], counts(args.nproc, p)
    if bad := [n for n in nprocs if nprocs[-1] * args.grad_accum % n]:
        p.error(f"--nproc {args.nproc} at --grad-accum {args.grad_accum}: the global batch of {nprocs[-1]} × "
                f"{args.grad_accum} micro-batches does not divide over {', '.join(map(str, bad))} GPUs")
    launcher = "fsdp" if args.fsdp else "ddp"
    folders = [f"{Path(c).stem}-{args.backend}-{launcher}" for c in configs]
    if len(set(folders)) < len(folders):
        p.error(f"two configs would share a folder: {', '.join(folders)}")
    parent = (args.out if args.out and len(configs) > 1 else REPO / "runs" / "scaling").resolve()
    paths = [args.out.resolve()] if args.out and len(configs) == 1 else [parent / f for f in folders]
    studies, port = [], args.port
    for config, folder in zip(configs, paths):
        micro = micro_batch(config, overrides) if args.floor else None
        if micro is not None and micro % 2:
            p.error(f"--floor halves the micro-batch, and {config}'s is {micro}, odd: pass an even "
                    "--train.micro_batch_size=")
        prep, runs = commands(config, args.backend, nprocs, args.fsdp, args.steps, args.rate_steps or args.steps,
                              args.grad_accum, folder, overrides, micro, port)
        port += sum(r.port is not None for r in runs)
        studies.append((config, folder, prep, runs))
    queue = order([r for *_, runs in studies for r in runs])
    ids = gpu_ids(args.gpus, args.dry_run)
    if args.dry_run and not ids:
        ids = [str(i) for i in range(nprocs[-1])]
        print(f"no GPU visible: the dry run assumes {nprocs[-1]}")
    mode = "one at a time" if args.serial else "concurrently on disjoint GPUs"
    if args.dry_run:
        planned = simulate(queue, ids, args.serial)
        for _, folder, prep, _ in studies:
            print(f"prepare {folder.name}: {' '.join(prep)}")
        print(f"schedule on GPUs {','.join(ids)}, {mode} (starts in one-GPU steps, if time ∝ steps × rows per GPU):")
        for k, run in enumerate(planned, 1):
            print(f"{k}. {run.label} at ≈{run.start:g}: CUDA_VISIBLE_DEVICES={','.join(run.ids)} "
                  + (f"port {run.port}: " if run.port else "") + " ".join(run.argv))
        return [(folder, prep) for _, folder, prep, _ in studies], planned
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0"}
    for _, folder, prep, _ in studies:
        prepare(folder, prep, env)
    kept = [r for r in queue if done_before(r)] if args.resume else []
    for r in kept:
        print(f"== kept {r.label}: finished before (--resume)", flush=True)
    queue = [r for r in queue if r not in kept]
    print(f"== {len(queue)} runs on GPUs {','.join(ids)}, {mode}", flush=True)
    results = {**execute(queue, ids, args.serial, args.run_timeout, env), **{r: 0 for r in kept}}
    command = "python scripts/scaling.py " + " ".join(argv if argv is not None else sys.argv[1:])
    reports = []
    for config, folder, _, runs in studies:
        failed = {r.name: (rc if isinstance(rc, str) else f"exit {rc}") + f", see {r.name}.log"
                  for r in runs if (rc := results.get(r, "not run")) != 0}
        meta = {"config": Path(config).stem, "backend": args.backend, "launcher": launcher, "nproc": nprocs,
                "grad_accum": args.grad_accum, "steps": args.steps, "rate_steps": args.rate_steps or args.steps,
                "planned": [r.name for r in runs], "failed": failed, "command": command}
        try:
            reports.append(report(folder, args.skip, meta))
        except SystemExit as e:                             # gpu1 failed: the other configs still get theirs
            print(f"no report for {folder.name}: {e}", flush=True)
    if len(studies) > 1:
        table([folder for _, folder, _, _ in studies], args.skip, parent / "scaling")
    return reports


if __name__ == "__main__":
    main()
