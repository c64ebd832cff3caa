"""Training parity across backends: is it the same model?

    python scripts/parity.py --config configs/gla_125m.yaml --backends naive,chunk,fla \
        --steps 300 --eval-interval 50 [--data.source=local:DIR ... any train.py override]

Each backend trains in its own process (`python train.py`) from the same initial weights (same seed)
on the same data order for --steps steps, evaluating validation loss every --eval-interval steps,
then scores the test split with eval/perplexity.py. The first backend listed is the reference.
Reported per backend: the validation-loss difference to the reference at every evaluation, the
mean train-loss difference over the last half of the run, the final test token/word perplexity, and
pass/fail: |Δ val loss| ≤ --tolerance nats (default 0.01) at the last evaluation.

--floor adds a run that measures how far two correct runs drift apart: the reference backend again,
with half the micro-batch and twice the accumulation (the same rows per step, summed in another
order, so it differs from the reference by rounding alone). Its Δ is the noise floor of the
comparison: a backend's Δ within the floor is indistinguishable from rounding. One such run is one
sample of a chaotic process; `--floor 2,4` adds one run per split (`naive~`, `naive~4`) for a spread.
--parallel trains every run at once on the same device (each logs to <out>/<run>.log): parity does not
time anything, and the naive runs leave most of a GPU idle.
--teacher also saves the reference's weights at every evaluation and scores each backend on them (the
validation split, eval/perplexity.py's windows): the Δ to the reference's own loss there is the same
function on trained weights, with no training dynamics in it. Where rounding alone moves two free runs
apart by more than the tolerance (GLA-125M: the floor is 0.04–0.06 nats), this is the comparison that
can still tell a different model from a drifted one; it passes when |Δ| ≤ --tolerance at every checkpoint.
Writes <out>/parity.{json,md,png} (curves overlaid, and Δ to the reference); exits 1 if any fails.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from config import parser_flags  # noqa: E402
from ops import parse_backend, split_backends  # noqa: E402
from utils.cli import run_cli  # noqa: E402


def slug(spec: str) -> str:
    """A run folder's name for a backend: fused[chunk,state] → fused-chunk-state."""
    return re.sub(r"\W+", "-", spec).strip("-")


def backend_args(spec: str) -> list[str]:
    """train.py's arguments for `chunk` or `fused[state]` (the fused backend with only these components)."""
    name, fuse = parse_backend(spec)
    return ["--backend", name] + (["--fuse", fuse] if fuse else [])


def read_metrics(run: Path) -> tuple[dict[int, float], dict[int, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return ({r["step"]: r["loss"] for r in rows if "loss" in r},
            {r["step"]: r["val_loss"] for r in rows if "val_loss" in r})


def compare(runs: dict[str, Path], tests: dict[str, dict], tolerance: float) -> dict:
    """Per backend: Δ val loss at each evaluation and Δ train loss (last half) against the first run."""
    names = list(runs)
    metrics = {b: read_metrics(p) for b, p in runs.items()}
    ref_train, ref_val = metrics[names[0]]
    out = {}
    for b in names:
        train, val = metrics[b]
        steps = sorted(set(val) & set(ref_val))
        if not steps:
            raise SystemExit(f"error: no common validation steps between {names[0]} and {b}")
        d_val = {s: val[s] - ref_val[s] for s in steps}
        late = [train[s] - ref_train[s] for s in sorted(set(train) & set(ref_train)) if s > max(train) / 2]
        out[b] = {"val_loss": val, "train_loss": train, "delta_val": d_val,
                  "final_delta_val": d_val[steps[-1]], "max_abs_delta_val": max(abs(v) for v in d_val.values()),
                  "mean_delta_train_last_half": sum(late) / len(late) if late else float("nan"),
                  "test": tests.get(b), "pass": abs(d_val[steps[-1]]) <= tolerance}
    return out


def preflight(config: str, overrides: list[str], flags: list[str], backends: list[str]) -> None:
    """Every override and every backend checked before the first training starts, so that a typo (--train.max_stepz,
    --tolerence) or a backend this machine cannot run fails now, not after the reference has trained: each backend's
    model is built on the meta device, which runs every op's availability check (ops.get_op) and allocates nothing."""
    import dataclasses

    import torch

    from config import load_config
    from model import build_model

    cfg = load_config(config, overrides, flags)
    for b in backends:
        name, fuse = parse_backend(b)
        with torch.device("meta"):
            build_model(dataclasses.replace(cfg.model, backend=name, fuse=fuse or cfg.model.fuse))


def floor_overrides(config: str, overrides: list[str], split: int = 2) -> list[str]:
    """The micro-batch divided by `split`, the accumulation and evaluation batches multiplied by it: the same
    training rows and validation windows as the reference, another order of summation."""
    from config import load_config

    tc = load_config(config, overrides).train
    if split < 2 or tc.micro_batch_size % split:
        raise SystemExit(f"error: --floor splits the micro-batch ({tc.micro_batch_size}) into {split}: the split "
                         "must be 2 or more and divide it; pass --train.micro_batch_size or other --floor splits")
    return [f"--train.micro_batch_size={tc.micro_batch_size // split}", f"--train.grad_accum={tc.grad_accum * split}",
            f"--train.eval_batches={tc.eval_batches * split}"]


def floor_run(ref: str, split: int) -> tuple[str, str]:
    """The floor run of a split, (name, folder suffix): (`naive~`, `naive_floor`) for the default split of 2,
    (`naive~4`, `naive_floor4`) for 4."""
    n = "" if split == 2 else str(split)
    return f"{ref}~{n}", f"{slug(ref)}_floor{n}"


def floor_splits(text: str) -> list[int]:
    """--floor's value: comma-separated micro-batch splits, each a whole number ≥ 2, none twice."""
    try:
        splits = [int(x) for x in text.split(",")]
    except ValueError:
        splits = []
    if not splits or min(splits) < 2 or len(set(splits)) != len(splits):
        raise argparse.ArgumentTypeError(f"--floor takes distinct whole numbers ≥ 2 separated by commas (e.g. 2,4), "
                                         f"got {text!r}")
    return splits


def teacher_forced(ref_run: Path, backends: list[str], data_overrides: list[str], tolerance: float) -> dict:
    """Each backend's validation loss on the reference run's checkpoints, minus the reference's own:
    {backend: {"loss": {step: loss}, "delta": {step: Δ}, "pass": every |Δ| ≤ tolerance}}."""
    import torch

    from config import parse_overrides, set_dotted
    from eval.perplexity import evaluate_split, load_model
    from utils.checkpoint import complete_checkpoints

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ckpts = sorted(complete_checkpoints(ref_run), key=lambda c: int(c.name.split("_")[-1]))
    if not ckpts:
        raise SystemExit(f"error: --teacher found no checkpoints in {ref_run}")
    losses: dict[str, dict[int, float]] = {b: {} for b in backends}
    for ckpt in ckpts:
        for b in backends:
            name, fuse = parse_backend(b)
            model, cfg, _ = load_model(ckpt, name, device, fuse)
            for key, value in parse_overrides(data_overrides):
                set_dotted(cfg, key, value)
            seq = cfg.data.seq_len
            result = evaluate_split(model, cfg, "valid", seq, seq, cfg.train.micro_batch_size, progress=False)
            losses[b][int(ckpt.name.split("_")[-1])] = result["loss"]
            del model
    ref = losses[backends[0]]
    return {b: {"loss": losses[b], "delta": (d := {s: losses[b][s] - ref[s] for s in ref}),
                "pass": all(abs(x) <= tolerance for x in d.values())} for b in backends}


def to_markdown(result: dict, command: str, tolerance: float) -> str:
    names = list(result["backends"])
    ref = names[0]
    lines = [f"# Parity: {result['config']}, {result['steps']} steps, reference `{ref}`", "",
             f"Command: `{command}`  ", f"Device: {result['device']}; pass: |Δ val loss| ≤ {tolerance} nats at the "
             "last evaluation.", "",
             "| backend | final val loss | Δ val (last) | max \\|Δ val\\| | mean Δ train (last half) | test token ppl "
             "| test word ppl | verdict |", "|---|---|---|---|---|---|---|---|"]
    for b, r in result["backends"].items():
        last = max(r["val_loss"])
        t = r["test"] or {}
        word = f"{t['word_ppl']:.2f}" if t.get("word_ppl") else "—"
        ppl = f"{t['token_ppl']:.2f}" if t else "—"
        verdict = "reference" if b == ref else "noise floor" if "~" in b else \
            ("pass" if r["pass"] else "**FAIL**")
        lines.append(f"| {b} | {r['val_loss'][last]:.4f} | {r['final_delta_val']:+.4f} | {r['max_abs_delta_val']:.4f} | "
                     f"{r['mean_delta_train_last_half']:+.4f} | {ppl} | {word} | {verdict} |")
    if "teacher" in result:
        steps = list(result["teacher"][ref]["delta"])
        lines += ["", f"Teacher-forced: each backend's validation loss on `{ref}`'s weights at its checkpoints, minus "
                  f"`{ref}`'s own (the same function on trained weights; no training dynamics). Pass: every |Δ| ≤ "
                  f"{tolerance}.", "", "| backend | " + " | ".join(f"Δ at {s}" for s in steps) + " | verdict |",
                  "|---|" + "---|" * (len(steps) + 1)]
        for b, r in result["teacher"].items():
            verdict = "reference" if b == ref else ("pass" if r["pass"] else "**FAIL**")
            lines.append(f"| {b} | " + " | ".join(f"{r['delta'][s]:+.5f}" for s in steps) + f" | {verdict} |")
    floor = {b: r for b, r in result["backends"].items() if "~" in b}
    if floor:
        drifts = "; ".join(f"`{b}` ends {r['final_delta_val']:+.4f} and drifts {r['max_abs_delta_val']:.4f} at most"
                           for b, r in floor.items())
        lines += ["", f"Noise floor: `{ref}` again with the micro-batch split in two (`{ref}~`) or in N (`{ref}~N`), "
                  f"the same rows summed in another order: {drifts}."]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, dx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for b, r in result["backends"].items():
        line, = ax.plot(list(r["train_loss"]), list(r["train_loss"].values()), lw=1, label=f"{b} train")
        ax.plot(list(r["val_loss"]), list(r["val_loss"].values()), "o--", ms=4, color=line.get_color(), label=f"{b} val")
        dx.plot(list(r["delta_val"]), list(r["delta_val"].values()), "o-", ms=4, color=line.get_color(), label=b)
    tol = result["tolerance"]
    dx.axhspan(-tol, tol, color="g", alpha=0.1, label=f"±{tol} nats")
    ax.set(xlabel="step", ylabel="loss (nats/token)", title="training curves")
    dx.set(xlabel="step", ylabel="val loss − reference", title=f"Δ to {next(iter(result['backends']))}")
    for a in (ax, dx):
        a.grid(alpha=0.3)
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--backends", default="naive,chunk", help="comma-separated, the first is the reference; fused[state] is the fused backend with only "
                                                           "those components (--fuse state)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-interval", type=int, default=50)
    p.add_argument("--tolerance", type=float, default=0.01, help="|Δ val loss| in nats at the last evaluation")
    p.add_argument("--floor", nargs="?", const=[2], type=floor_splits, metavar="SPLITS", help="also re-run the "
                   "reference with its micro-batch split in SPLITS parts (default 2; e.g. 2,4 for one run per split; "
                   "same rows per step): the noise floor of the comparison")
    p.add_argument("--teacher", action="store_true", help="also score every backend on the reference's weights "
                   "at each evaluation (the same function on trained weights, no training dynamics)")
    p.add_argument("--parallel", action="store_true", help="train all runs at once (one device; memory permitting)")
    p.add_argument("--out", type=Path, help="folder for the runs and parity.{json,md,png} (default runs/parity_<config>)")
    args, overrides = p.parse_known_args(argv)
    backends = split_backends(args.backends)
    if len(set(backends)) != len(backends) or len(backends) < 2:
        raise SystemExit(f"error: --backends needs two or more distinct backends, got {args.backends!r}")
    preflight(args.config, overrides, parser_flags(p), backends)
    stem = Path(args.config).stem
    out = args.out or REPO / "runs" / f"parity_{stem}"
    runs = {b: out / f"{stem}_{slug(b)}" for b in backends}
    extra = {b: [] for b in backends}
    if args.teacher:        # the reference keeps its weights at every evaluation for teacher_forced
        extra[backends[0]] += [f"--train.ckpt_interval={args.eval_interval}",
                               f"--train.keep_ckpts={args.steps // args.eval_interval + 1}"]
    if args.floor:
        floors = {s: floor_run(backends[0], s) for s in args.floor}
        runs = {backends[0]: runs[backends[0]], **{name: out / f"{stem}_{folder}" for name, folder in floors.values()},
                **runs}
        for s, (name, _) in floors.items():
            extra[name] = floor_overrides(args.config, overrides, s)
    taken = [str(r) for r in runs.values() if r.exists()]
    if taken:
        raise SystemExit(f"error: {', '.join(taken)} already exist; remove them or pass another --out")
    data_overrides = [o for o in overrides if o.startswith("--data.")]
    def train_cmd(b: str, run: Path) -> list[str]:
        return [sys.executable, str(REPO / "train.py"), "--config", args.config, *backend_args(b.split("~")[0]),
                f"--train.name={run.name}", f"--train.out_dir={out}", f"--train.max_steps={args.steps}",
                f"--train.eval_interval={args.eval_interval}", "--train.ckpt_interval=0", *overrides, *extra[b]]

    if args.parallel:
        # shards once, before the runs race to build the same cache folder
        subprocess.run([sys.executable, "-m", "data.prepare", "--config", args.config, *data_overrides],
                       check=True, cwd=REPO)
        out.mkdir(parents=True, exist_ok=True)
        procs = {}
        for b, run in runs.items():
            print(f"== {b}: training {args.steps} steps {' '.join(extra[b])} (log: {out / run.name}.log)", flush=True)
            with open(out / f"{run.name}.log", "w") as log:
                procs[b] = subprocess.Popen(train_cmd(b, run), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        failed = [b for b, proc in procs.items() if proc.wait() != 0]
        if failed:
            raise SystemExit(f"error: training failed for {', '.join(failed)}; see "
                             + ", ".join(f"{out / runs[b].name}.log" for b in failed))
    tests = {}
    for b, run in runs.items():
        if not args.parallel:
            print(f"== {b}: training {args.steps} steps {' '.join(extra[b])}", flush=True)
            if subprocess.run(train_cmd(b, run), cwd=REPO).returncode:
                raise SystemExit(f"error: training on {b} failed; train.py's error is above")
        subprocess.run([sys.executable, str(REPO / "eval" / "perplexity.py"), "--ckpt", str(run), "--split", "test",
                        "--out", str(run / "eval_test.json"), *data_overrides], check=True, cwd=REPO,
                       stdout=subprocess.DEVNULL)
        tests[b] = json.loads((run / "eval_test.json").read_text())
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    result = {"config": args.config, "steps": args.steps, "tolerance": args.tolerance, "device": device,
              "overrides": overrides, "backends": compare(runs, tests, args.tolerance)}
    if args.teacher:
        result["teacher"] = teacher_forced(runs[backends[0]], backends, data_overrides, args.tolerance)
    command = "python scripts/parity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "parity.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "parity.md").write_text(to_markdown(result, command, args.tolerance))
    plot(result, out / "parity.png")
    print((out / "parity.md").read_text())
    failed = [b for b, r in result["backends"].items() if not r["pass"] and "~" not in b]
    print(f"wrote {out}/parity.{{json,md,png}}; " + (f"FAIL: {', '.join(failed)}" if failed else "all within tolerance"))
    if failed and argv is None:
        sys.exit(1)
    return result


if __name__ == "__main__":
    run_cli(main)
