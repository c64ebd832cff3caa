"""Does a run survive a crash? Train, crash at a checkpoint, resume, and compare; then evaluate the checkpoint elsewhere.

    python scripts/check_resume.py --config configs/gla_125m.yaml --nproc 4 --fsdp --steps 40 --at 20
    python scripts/check_resume.py --config configs/smoke.yaml --nproc 1 --steps 8 --at 4 --eval gpu,cpu
    python scripts/check_resume.py --config configs/gla_125m.yaml --nproc 4 --fsdp --dry-run

1. `full`: train --steps steps on --nproc processes (accelerate launch with configs/accelerate/ddp.yaml, or
   fsdp.yaml with --fsdp; plain python with --nproc 1 and no --fsdp), a checkpoint and a validation at every
   --at steps. Its metrics.jsonl is kept as full.jsonl.
2. `resume`: the same command with `--resume <run>/checkpoints/step_<at>`, as after a crash just past step --at:
   train.py moves the later checkpoints aside and truncates the metrics after step --at.
3. Bit for bit: every logged row after step --at (loss, gradient norm, learning rate, tokens, validation loss) must
   equal the uninterrupted run's exactly; timing fields are left out.
4. With --eval: eval/perplexity.py scores the final checkpoint's gathered model.safetensors on one GPU (`gpu`:
   bf16, the trained backend) and on the CPU (`cpu`: fp32, --eval-backend, default naive) on the validation split
   (--data.* overrides apply: a small --data.eval_source keeps the CPU pass short); the two mean losses must agree
   within --eval-tol nats (bf16 against fp32).

Any other `--a.b=value` goes to train.py (and the data ones to the evaluations). Writes <out>/resume.{md,json};
the exit status is 1 if a check failed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.scaling import kill  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TIMING = frozenset({"tokens_per_s", "mfu", "peak_mem_gb", "first_step_s", "elapsed_s"})


def train_command(args, overrides: list[str], resume: Path | None = None) -> list[str]:
    """train.py under the launcher: accelerate for several processes or FSDP, plain python otherwise."""
    base = ["train.py", "--config", args.config, "--backend", args.backend, f"--train.max_steps={args.steps}",
            f"--train.ckpt_interval={args.at}", f"--train.eval_interval={args.at}", "--train.log_interval=1",
            "--train.progress=false", f"--train.out_dir={args.out}", "--train.name=run", *overrides]
    if args.nproc > 1 or args.fsdp:
        launcher = REPO / "configs" / "accelerate" / ("fsdp.yaml" if args.fsdp else "ddp.yaml")
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(launcher),
               "--num_processes", str(args.nproc), *base]
    else:
        cmd = [sys.executable, *base]
    return cmd + (["--resume", str(resume)] if resume else [])


def eval_command(args, ckpt: Path, where: str, overrides: list[str]) -> tuple[list[str], dict]:
    data = [o for o in overrides if o.startswith("--data.")]
    cmd = [sys.executable, "eval/perplexity.py", "--ckpt", str(ckpt), "--split", "valid",
           "--out", str(args.out / f"eval-{where}.json"), *data]
    if where == "cpu":
        return cmd + ["--backend", args.eval_backend], {"CUDA_VISIBLE_DEVICES": ""}
    return cmd, {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}


def rows(path: Path) -> dict[tuple[int, str], dict]:
    """metrics.jsonl's rows keyed by (step, kind), timing fields dropped; a later row of the same key wins."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            kind = "val" if "val_loss" in r else "error" if "error" in r else "train"
            out[(r["step"], kind)] = {k: v for k, v in r.items() if k not in TIMING}
    return out


def compare_rows(full: dict, resumed: dict, after: int) -> tuple[int, list[str]]:
    """(rows compared, differences) over the rows after step `after`: every field must be equal, bit for bit."""
    keys = sorted(k for k in full if k[0] > after)
    diffs = [f"step {s} {kind}: missing after the resume" for s, kind in keys if (s, kind) not in resumed]
    diffs += [f"step {s} {kind}: {full[(s, kind)]} ≠ {resumed[(s, kind)]}" for s, kind in keys
              if (s, kind) in resumed and full[(s, kind)] != resumed[(s, kind)]]
    diffs += [f"step {s} {kind}: only after the resume" for s, kind in sorted(resumed) if s > after
              and (s, kind) not in full]
    return len(keys), diffs


def run(cmd: list[str], log: Path, extra: dict | None = None) -> int:
    print(f"== {' '.join(cmd)}  (log: {log})", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", **(extra or {})}
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait()
        except BaseException:              # Ctrl-C or SIGTERM: no training or evaluation left behind on the GPUs
            kill(proc)
            raise
    if rc:
        print(f"exit {rc}; the end of {log}:\n" + "\n".join(log.read_text().splitlines()[-8:]), flush=True)
    return rc


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--backend", default="fused")
    p.add_argument("--nproc", type=int, default=1, help="training processes (GPUs)")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (configs/accelerate/fsdp.yaml) instead of DDP")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--at", type=int, default=20, help="the checkpoint the resume starts from (and the interval)")
    p.add_argument("--eval", default="", help="comma-separated: gpu, cpu (where the final checkpoint is scored)")
    p.add_argument("--eval-backend", default="naive", help="the CPU evaluation's backend")
    p.add_argument("--eval-tol", type=float, default=0.02, help="nats between the evaluations")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "check_resume")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args, overrides = p.parse_known_args(argv)
    if bad := [o for o in overrides if not o.startswith("--") or "=" not in o]:
        p.error(f"unrecognised arguments {' '.join(bad)}: train.py overrides take the form --a.b=value")
    if not 0 < args.at < args.steps:
        p.error(f"--at must lie between 0 and --steps ({args.steps}), got {args.at}")
    places = [w for w in args.eval.split(",") if w]
    if unknown := set(places) - {"gpu", "cpu"}:
        p.error(f"--eval takes gpu and/or cpu, got {', '.join(sorted(unknown))}")
    args.out = args.out.resolve()
    ckpt = args.out / "run" / "checkpoints" / f"step_{args.at:08d}"
    final = args.out / "run" / "checkpoints" / f"step_{args.steps:08d}"
    commands = {"full": train_command(args, overrides), "resume": train_command(args, overrides, ckpt),
                **{f"eval-{w}": eval_command(args, final, w, overrides)[0] for w in places}}
    if args.dry_run:
        for name, cmd in commands.items():
            print(f"{name}: {' '.join(cmd)}")
        return commands
    if (args.out / "run").exists():
        shutil.rmtree(args.out / "run")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"command": "python scripts/check_resume.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "config": args.config, "backend": args.backend, "nproc": args.nproc,
              "launcher": "fsdp" if args.fsdp else "ddp" if args.nproc > 1 else "none", "ok": False}
    if run(commands["full"], args.out / "full.log"):
        result["error"] = "the uninterrupted run failed (full.log)"
    else:
        shutil.copy(args.out / "run" / "metrics.jsonl", args.out / "full.jsonl")
        if run(commands["resume"], args.out / "resume.log"):
            result["error"] = "the resumed run failed (resume.log)"
        else:
            n, diffs = compare_rows(rows(args.out / "full.jsonl"), rows(args.out / "run" / "metrics.jsonl"), args.at)
            result.update(rows_compared=n, differences=diffs, bitwise=not diffs and n > 0)
            result["sharded"] = (ckpt / "pytorch_model_fsdp_0").is_dir()
            for w in places:
                cmd, extra = eval_command(args, final, w, overrides)
                result[f"eval_{w}"] = (json.loads((args.out / f"eval-{w}.json").read_text())
                                       if run(cmd, args.out / f"eval-{w}.log", extra) == 0 else None)
            losses = [result[f"eval_{w}"]["loss"] for w in places if result[f"eval_{w}"]]
            result["eval_gap"] = max(losses) - min(losses) if len(losses) == len(places) > 1 else None
            result["ok"] = (result["bitwise"] and len(losses) == len(places)
                            and (result["eval_gap"] is None or result["eval_gap"] <= args.eval_tol))
    (args.out / "resume.json").write_text(json.dumps(result, indent=1))
    (args.out / "resume.md").write_text(markdown(result, args))
    print((args.out / "resume.md").read_text())
    if not result["ok"]:
        raise SystemExit(1)
    return result


def _terminated(signum, frame):
    raise SystemExit(f"check_resume.py: stopped by signal {signum}")


def markdown(r: dict, args) -> str:
    lines = [f"# Resume check: {r['config']} on {r['backend']}, {r['nproc']} process(es), launcher {r['launcher']}",
             "", f"Command: `{r['command']}`", ""]
    if "error" in r:
        return "\n".join(lines + [f"**Failed:** {r['error']}", ""])
    lines += [f"- Resumed from step {args.at} of {args.steps}"
              + (" (a sharded FSDP checkpoint)" if r["sharded"] else "") + f": {r['rows_compared']} logged rows "
              f"after it, **{'bit for bit equal' if r['bitwise'] else 'different'}** to the uninterrupted run's."]
    lines += [f"  - {d}" for d in r["differences"][:10]]
    for w in ("gpu", "cpu"):
        if f"eval_{w}" in r:
            e = r[f"eval_{w}"]
            lines.append(f"- Evaluated on the {w.upper()}: " + (f"validation loss {e['loss']:.4f} nats over "
                         f"{e.get('tokens_scored', '?'):,} tokens" if e else "failed (see eval-{w}.log)"))
    if r.get("eval_gap") is not None:
        lines.append(f"- GPU against CPU: {r['eval_gap']:.4f} nats (tolerance {args.eval_tol}).")
    return "\n".join(lines + ["", f"Verdict: **{'ok' if r['ok'] else 'failed'}**", ""])


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)      # `timeout` or a job manager: the same clean-up as Ctrl-C
    main()
