r"""Training parity across backends: is it the same model? An equivalence test over seeds.

    python scripts/parity.py --config configs/gla_125m.yaml --backends naive,chunk,fused --steps 300 \
        --eval-interval 50 --seeds 3 [--teacher] [--parallel [N]] [--data.source=local:DIR ... any train.py override]

For each seed (train.seed + i, i < --seeds) every run spec listed trains a complete schedule in its own process
(`python train.py`): the config's warm-up, then cosine decay to the end of --steps (train.max_steps = --steps),
from the same initial weights on the same data order as the reference, the first spec listed. A spec is a backend
with optional overrides for that run, NAME@key=value[@key=value] (naive@model.norm_eps=1e-2,
fused[state]@optim.lr=3e-4; values without commas), so that a setting's effect is measured the same way. The
floor: --floor-backend (default: the reference; `none` disables) again with its micro-batch split in two and twice
the accumulation (the same rows per step, summed in another order), at the same seeds, paired with that spec's own
runs: the drift of two correct runs.
One spec alone (--backends fused) trains only it and its floor: how far a recipe's correct runs drift apart,
to choose a setting by (--model.o_norm_eps, --optim.lr) before comparing backends under it.

Per spec, Δ_s = final validation loss − the reference's at seed s; reported: the mean Δ, its sample sd, the 90 %
Student t interval (infinite for one seed) and the TOST p-value, the floor's, the slope of the validation loss over
the last three evaluations (mean over seeds), the paired standard error across the validation windows at the first
seed (sd of the per-window differences / √windows; a warning above 0.002 nats says how many windows would do), and
the test split's token and word perplexity (eval/perplexity.py). Verdict (eval/parity_stats.py):
  equivalent  the interval lies inside ±--tolerance (two one-sided tests at 5 %) and the spread of Δ
              not significantly above the floor's (one-sided F-test at 5 %)
  different   the interval excludes 0 and misses the floor's interval
  undecided   otherwise, with the seeds that would decide at the observed spread
Without a floor the spread and floor conditions are not checked, and the report says so.
--teacher also keeps the reference's weights at every evaluation and scores each spec on them at every seed (its
validation split; a spec's model.* overrides apply, one that changes shapes is left out): the same function on
trained weights, no training dynamics; it passes when every |Δ| ≤ --teacher-tolerance (default 1e-4 nats).
--parallel [N] trains N runs at once (default: all), each logging to <out>/<run>.log; with two or more GPUs visible
the runs go round-robin over them (CUDA_VISIBLE_DEVICES per run), with one they share it. With an fla spec, a
two-step fla run goes first, alone, so that the concurrent fla runs read its autotuning from Triton's cache.
A run that fails does not stop the others: it is left out of its comparisons (the report names it) and the exit status
is 1; a test-split scoring that fails among concurrent ones is run again alone.
--merge DIR... pools finished tests of one protocol over disjoint seeds (seeds trained in several calls or on
several machines) and recomputes every verdict over all of them; no training.
Writes <out>/parity.{json,md,png}; exits 0 when every spec is equivalent, 1 when any is different (or on an error),
2 when any is undecided and none different.
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

FLA_WARMUP = "fla_autotune_warmup"
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from config import Config, ConfigError, load_config, parse_overrides, parser_flags  # noqa: E402
from eval import parity_report as report  # noqa: E402
from eval import parity_runs as runs_  # noqa: E402
from eval import parity_stats as stats  # noqa: E402
from utils.cli import run_cli  # noqa: E402


def parser() -> argparse.ArgumentParser:
    """The options; abbreviations are off, so that --floor or --teacher-tol is a typo with a hint, not a prefix."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--config", help="the model and recipe (required unless --merge)")
    p.add_argument("--backends", default="naive,chunk", help="comma-separated run specs, the first is the reference: "
                   "a backend (chunk; fused[state] = --fuse state) with optional @key=value overrides")
    p.add_argument("--seeds", type=int, default=3, help="seeds per spec: train.seed, train.seed + 1, ...")
    p.add_argument("--steps", type=int, default=300, help="steps of each run (train.max_steps: the cosine ends there)")
    p.add_argument("--eval-interval", type=int, default=50)
    p.add_argument("--tolerance", type=float, default=0.01, help="equivalence margin in nats on the mean Δ")
    p.add_argument("--floor-backend", help="the spec re-summed against itself for the noise floor (default: the "
                   "reference; none: no floor)")
    p.add_argument("--teacher", action="store_true", help="also score every spec on the reference's weights "
                   "at each evaluation, at every seed")
    p.add_argument("--teacher-tolerance", type=float, default=1e-4, help="the largest |Δ| in nats a spec may show "
                   "on the reference's weights (the same function: rounding only)")
    p.add_argument("--parallel", nargs="?", const=0, type=int, metavar="N",
                   help="train N runs at once (default: all; round-robin over the visible GPUs)")
    p.add_argument("--out", type=Path, help="folder for the runs and parity.{json,md,png} (default runs/parity_<config>)")
    p.add_argument("--merge", nargs="+", type=Path, metavar="DIR",
                   help="no training: pool finished tests of one protocol over disjoint seeds (their DIR/parity.json, "
                        "e.g. --train.seed=1337 and --train.seed=1340 runs of --seeds 3) into one verdict in --out")
    return p


def main(argv: list[str] | None = None) -> dict:
    """Train every run, score them, write parity.{json,md,png} and return the result (its exit_status: 0
    equivalent, 1 any different, 2 any undecided). Every setting is checked before the first run starts."""
    p = parser()
    args, rest = p.parse_known_args(argv)
    if args.merge:
        if rest:
            raise ConfigError(f"--merge pools finished tests and trains nothing: drop {' '.join(rest)}")
        return merge(args, argv)
    if not args.config:
        raise ConfigError("--config is required (a YAML file under configs/) unless --merge pools finished tests")
    flags = parser_flags(p)
    overrides = [f"--{k}={v}" for k, v in parse_overrides(rest, flags)]
    runs_.check_overrides(overrides)
    if args.seeds < 1 or (args.parallel or 0) < 0 or args.steps < 1 or args.eval_interval < 1:
        raise ConfigError(f"--seeds, --steps and --eval-interval must be 1 or more and --parallel 0 (all) or more, "
                          f"got {args.seeds}, {args.steps}, {args.eval_interval} and {args.parallel}")
    specs = runs_.split_specs(args.backends)
    texts = [s.text for s in specs]
    floor_spec = {None: texts[0], "none": None}.get(args.floor_backend, args.floor_backend)
    if floor_spec is not None and floor_spec not in texts:
        raise ConfigError(f"--floor-backend {floor_spec!r} is not one of --backends ({', '.join(texts)}) nor none")
    if len(texts) == 1 and floor_spec is None:
        raise ConfigError(f"--backends {texts[0]} alone compares nothing: add a backend to compare with it, or drop "
                          "--floor-backend none to measure its noise floor (it against itself re-summed)")
    runs_.preflight(args.config, overrides, flags, specs)
    cfg = load_config(args.config, overrides)
    seeds = [cfg.train.seed + i for i in range(args.seeds)]
    out = args.out or REPO / "runs" / f"parity_{Path(args.config).stem}"
    plan = runs_.plan_runs(args.config, overrides, specs, floor_spec, seeds, args.steps, args.eval_interval,
                           args.teacher, out)
    warnings = []
    warnings += lr_warning(load_config(args.config, []), cfg)
    if cfg.optim.warmup_steps >= args.steps:
        warnings.append(f"the warm-up ({cfg.optim.warmup_steps} steps) is not shorter than --steps ({args.steps}): "
                        "the runs end at the peak learning rate, not annealed")

    out.mkdir(parents=True, exist_ok=True)
    devices = []
    if args.parallel is not None:
        runs_.prepare_data(args.config, list(plan.data.values()))
        devices = runs_.visible_devices()
    # one after another (no --parallel), the first fla run autotunes alone anyway
    if args.parallel is not None and (warm := fla_warmup(plan, specs)):
        print("fla: one short run first, so that the concurrent fla runs read its autotuning", flush=True)
        if runs_.train_all(warm, out, 1, devices, what="fla's autotuning warm-up"):
            warnings.append("fla's autotuning warm-up failed: its runs autotuned each on their own")
    failed = runs_.train_all(plan.jobs, out, args.parallel, devices)
    warnings += runs_.drop_failed(plan.runs, failed)
    if texts[0] not in plan.runs:
        raise SystemExit(f"error: every run of the reference `{texts[0]}` failed; nothing to compare with")

    tests = runs_.score_all(plan.runs, plan.data, out, args.parallel, devices)
    # per-window losses at the first seed every remaining run has (the paired window SE needs one seed for all)
    wseed = min(set.intersection(*(set(by_seed) for by_seed in plan.runs.values())), default=None)
    windows = {} if wseed is None else {name: runs_.window_losses(by_seed[wseed], plan.data[name])
                                        for name, by_seed in plan.runs.items()}
    curves, compared = report.summarize(plan.runs, plan.pairs, plan.floor, windows, tests, args.tolerance)
    warnings += report.window_warnings(compared, wseed)
    result = {"config": args.config, "steps": args.steps, "seeds": seeds, "tolerance": args.tolerance,
              "confidence": stats.CONFIDENCE, "device": runs_.describe_devices(devices), "overrides": overrides, "reference": texts[0],
              "floor": plan.floor, "runs": curves, "compared": compared, "warnings": warnings, "window_seed": wseed}
    if args.teacher:
        result["teacher_tolerance"] = args.teacher_tolerance
        result["teacher"] = {seed: runs_.teacher_forced(plan.runs[texts[0]][seed], specs, plan.data[texts[0]],
                                                        args.teacher_tolerance) for seed in plan.runs[texts[0]]}
    result["exit_status"] = 1 if failed else report.exit_status(compared, plan.floor)
    write(out, result, argv)
    summary = ", ".join(f"{n}: {c['verdict']}" for n, c in compared.items() if n != plan.floor)
    print(f"wrote {out}/parity.{{json,md,png}}; {summary}")
    return result


def fla_warmup(plan: runs_.Plan, specs: list[runs_.Spec]) -> dict[str, list[str]]:
    """The first fla run cut to two steps with an evaluation after each ({name: command}, empty without fla): run
    alone first, it autotunes fla's kernels at the training and evaluation shapes and leaves the results in Triton's
    on-disk cache, where every fla run started after it finds them. Started together, each fla process autotunes
    the same kernels at once (gla_125m: 445 s before its first step, six at a time on one GPU)."""
    fla = next((s.text for s in specs if s.backend == "fla"), None)
    if fla is None:
        return {}
    first = plan.runs[fla][min(plan.runs[fla])].name
    return {FLA_WARMUP: plan.jobs[first] + [f"--train.name={FLA_WARMUP}", "--train.max_steps=2",
                                           "--train.eval_interval=1"]}


def lr_warning(config: Config, runs: Config) -> list[str]:
    """A warning when the runs train fewer tokens a step than the config at the config's own learning rate: the
    square-root rule's rate for their batch. A rate too high for the batch widens the re-summed floor (GLA's
    from 0.004 to 0.02 nats at a 1/8 batch), so that fewer seeds decide."""
    tokens = lambda c: c.train.micro_batch_size * c.train.grad_accum * c.data.seq_len
    if tokens(runs) >= tokens(config) or runs.optim.lr != config.optim.lr:
        return []
    scaled = config.optim.lr * math.sqrt(tokens(runs) / tokens(config))
    return [f"the runs train {tokens(runs):,} tokens a step, {tokens(runs) / tokens(config):.3g} of the config's "
            f"{tokens(config):,}, at its learning rate {config.optim.lr:g}; scaled by the square root of the batch "
            f"it would be {scaled:.3g} (--optim.lr={scaled:.2g}), which keeps the floor narrow"]


def merge(args: argparse.Namespace, argv: list[str] | None) -> dict:
    """--merge: parity.{json,md,png} in --out from the pooled tests, verdicts recomputed over all their seeds."""
    if not args.out:
        raise ConfigError("--merge needs --out, the folder for the pooled parity.{json,md,png}")
    files = [d / "parity.json" if d.is_dir() else d for d in args.merge]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ConfigError(f"--merge: no parity.json at {', '.join(missing)} (a finished scripts/parity.py --out folder)")
    try:
        result = report.merge([json.loads(f.read_text()) for f in files])
    except ValueError as e:
        raise ConfigError(f"--merge: {e}") from None
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out, result, argv)
    return result


def write(out: Path, result: dict, argv: list[str] | None) -> None:
    """<out>/parity.{json,md,png}, the markdown (with the command as typed) also printed."""
    command = "python scripts/parity.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    (out / "parity.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "parity.md").write_text(report.to_markdown(result, command))
    report.plot(result, out / "parity.png")
    print((out / "parity.md").read_text())


def cli() -> None:
    """The command line: main() on sys.argv, exiting with its exit status."""
    sys.exit(main()["exit_status"])


if __name__ == "__main__":
    run_cli(cli)
