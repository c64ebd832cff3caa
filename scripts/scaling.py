"""Does training scale to several GPUs? One GPU against N GPUs at the same global batch, then the report.

    python scripts/scaling.py --config configs/gla_340m.yaml --backend fused --nproc 2
    python scripts/scaling.py --config configs/gdn_340m.yaml --backend fused --nproc 2 --fsdp --steps 40
    python scripts/scaling.py --config configs/gla_340m.yaml --backend fused --nproc 2 --optim.warmup_steps=500
    python scripts/scaling.py --report DIR                    # the report of a pair already trained in DIR
    python scripts/scaling.py --table DIR [DIR ...]           # several pairs in one table and plot

A pair is two runs of train.py with the same model, backend and global batch: one GPU at gradient accumulation
N·A, and N GPUs under `accelerate launch` (configs/accelerate/ddp.yaml, or fsdp.yaml with --fsdp) at A
(--grad-accum), so that each step is made of the same rows and only the reduction order differs. Under FSDP the
one-GPU run is FSDP too (accelerate launch with one process): FSDP on one GPU already differs from plain
training (bf16 parameters), and the ratio and the loss gap are then the scaling's alone. Runs log every step and
skip evaluation and checkpoints; --steps sets their length, 10 warm-up steps of learning rate unless an
override says otherwise. Any other `--a.b=value` is passed to both runs (the data flags, for one). The data
are prepared once first (python -m data.prepare), so that the N processes do not all tokenize.

The report: tokens/s of each run and per GPU (the median over the logged steps after --skip), the per-GPU
efficiency (N-GPU rate per GPU ÷ one GPU's; ≥ 0.90 is the target), peak memory, and the training-loss gap
(N GPUs − 1 GPU) at every common step. Writes <out>/scaling.{md,json,png}; <out>/gpu1 and <out>/gpu<N> hold
the runs' metrics.jsonl and run.json (their checkpoints are deleted), <out>/gpu*.log their output. --table
gathers pair folders (any folder holding gpu1/ and gpu<N>/ with metrics.jsonl, or folders of them) into
<out>.{md,json,png}. NCCL runs with NVLink multicast off (NCCL_NVLS_ENABLE=0).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.90


# ---- training a pair ---------------------------------------------------------------------------------------------

def commands(config: str, backend: str, nproc: int, fsdp: bool, steps: int, grad_accum: int, out: Path,
             overrides: list[str]) -> list[tuple[str, list[str], dict]]:
    """(name, argv, extra environment) of the data preparation, the one-GPU run and the N-GPU run."""
    launcher = REPO / "configs" / "accelerate" / ("fsdp.yaml" if fsdp else "ddp.yaml")
    common = ["train.py", "--config", config, "--backend", backend, f"--train.max_steps={steps}",
              "--train.log_interval=1", "--train.eval_interval=1000000", "--train.eval_batches=4",
              "--train.ckpt_interval=1000000", "--train.progress=false", f"--train.out_dir={out}",
              "--optim.warmup_steps=10", *overrides]
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(launcher)]
    one = [*accelerate, "--num_processes", "1"] if fsdp else [sys.executable]   # DDP on one process: plain training
    data = [o for o in overrides if o.startswith("--data.")]
    return [("prepare", [sys.executable, "-m", "data.prepare", "--config", config, *data], {}),
            ("gpu1", [*one, *common, "--train.name=gpu1", f"--train.grad_accum={nproc * grad_accum}"],
             {"CUDA_VISIBLE_DEVICES": "0"}),
            (f"gpu{nproc}", [*accelerate, "--num_processes", str(nproc), *common, f"--train.name=gpu{nproc}",
                             f"--train.grad_accum={grad_accum}"], {})]


def train_pair(args, overrides: list[str]) -> None:
    """Prepares the data, then trains the two runs one after the other, each logging to <out>/<run>.log."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0"}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, argv, extra in commands(args.config, args.backend, args.nproc, args.fsdp, args.steps, args.grad_accum,
                                      args.out, overrides):
        print(f"== {name}: {' '.join(argv)}", flush=True)
        with open(args.out / f"{name}.log", "w") as log:
            try:
                rc = subprocess.run(argv, cwd=REPO, env={**env, **extra}, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=args.run_timeout or None).returncode
            except subprocess.TimeoutExpired:
                rc = f"timeout after {args.run_timeout} s"
        if rc != 0:
            tail = (args.out / f"{name}.log").read_text().splitlines()[-5:]
            print(f"{name}: exit {rc}; the end of {name}.log:\n" + "\n".join(tail), flush=True)
            if name == "prepare":
                raise SystemExit(f"data preparation failed: see {args.out / 'prepare.log'}")
    for ckpt in args.out.glob("gpu*/checkpoints"):          # gigabytes at 340M, and the report needs none
        shutil.rmtree(ckpt, ignore_errors=True)


# ---- the report of one pair --------------------------------------------------------------------------------------

def load(run: Path) -> tuple[dict, dict[int, dict]]:
    info = json.loads((run / "run.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return info, {r["step"]: r for r in rows if "loss" in r}


def summary(run: Path, skip: int) -> dict:
    info, steps = load(run)
    world = info.get("world_size") or info.get("num_processes") or 1
    tps = [r["tokens_per_s"] for s, r in steps.items() if s > skip and r.get("tokens_per_s")]
    if not tps:
        raise SystemExit(f"{run}: no logged step after step {skip}; run more steps or lower --skip")
    return {"run": run.name, "gpus": world, "tokens_per_s": statistics.median(tps),
            "per_gpu": statistics.median(tps) / world, "steps": steps,
            "peak_gb": max((r.get("peak_mem_gb") or 0) for r in steps.values())}


def compare(one: Path, many: Path, skip: int) -> dict:
    """The two runs' summaries, the per-GPU rate ratio (many ÷ one) and the training-loss gap (many − one) at each
    common step."""
    a, b = summary(one, skip), summary(many, skip)
    common = sorted(set(a["steps"]) & set(b["steps"]))
    gaps = [(s, b["steps"][s]["loss"] - a["steps"][s]["loss"]) for s in common]
    return {"one": a, "many": b, "ratio": b["per_gpu"] / a["per_gpu"], "gaps": gaps,
            "max_dloss": max((abs(g) for _, g in gaps), default=float("nan")),
            "median_dloss": statistics.median(abs(g) for _, g in gaps) if gaps else float("nan")}


def pair_runs(folder: Path) -> tuple[Path | None, list[Path]]:
    runs = sorted((p for p in folder.glob("gpu*") if (p / "metrics.jsonl").is_file() and p.name[3:].isdigit()),
                  key=lambda p: int(p.name[3:]))
    return next((p for p in runs if p.name == "gpu1"), None), [p for p in runs if p.name != "gpu1"]


def pair_row(folder: Path, skip: int) -> dict:
    """One pair folder as a table row: named by its scaling.json, else by the folder (CONFIG-BACKEND-LAUNCHER)."""
    meta = json.loads((folder / "scaling.json").read_text()) if (folder / "scaling.json").is_file() else {}
    config, backend, launcher = (folder.name.split("-", 2) + ["?", "?"])[:3]
    row = {"pair": folder.name, "config": meta.get("config", config), "backend": meta.get("backend", backend),
           "launcher": meta.get("launcher", launcher)}
    one, many = pair_runs(folder)
    if one is None or not many:
        return {**row, "status": "missing " + ("the one-GPU run" if one is None else "the multi-GPU run")}
    try:
        c = compare(one, many[-1], skip)
    except SystemExit as e:                    # a run that died before `skip` steps
        return {**row, "status": str(e)}
    a, b = c["one"], c["many"]
    return {**row, "status": "ok", "gpus": b["gpus"], "tps_1": a["tokens_per_s"], "tps_n": b["tokens_per_s"],
            "per_gpu": b["per_gpu"], "efficiency": c["ratio"], "peak_gb_1": a["peak_gb"], "peak_gb_n": b["peak_gb"],
            "steps": len(c["gaps"]), "max_dloss": c["max_dloss"], "median_dloss": c["median_dloss"],
            "dloss": c["gaps"], "loss_1": sorted((s, r["loss"]) for s, r in a["steps"].items()),
            "loss_n": sorted((s, r["loss"]) for s, r in b["steps"].items())}


def report(folder: Path, skip: int, meta: dict) -> dict:
    """<folder>/scaling.{md,json,png} for the pair trained there."""
    if meta:
        (folder / "scaling.json").write_text(json.dumps(meta, indent=1))
    row = pair_row(folder, skip)
    if row["status"] != "ok":
        raise SystemExit(f"{folder}: {row['status']}")
    md = [f"# Scaling: {row['config']} on {row['backend']}, {row['launcher']}, 1 GPU against {row['gpus']}, the same "
          "global batch", "",
          *([f"Command: `{meta['command']}`", ""] if meta.get("command") else []),
          "| run | GPUs | tokens/s | tokens/s per GPU | peak GB |", "|---|---|---|---|---|",
          f"| gpu1 | 1 | {row['tps_1']:,.0f} | {row['tps_1']:,.0f} | {row['peak_gb_1']:.1f} |",
          f"| gpu{row['gpus']} | {row['gpus']} | {row['tps_n']:,.0f} | {row['per_gpu']:,.0f} | "
          f"{row['peak_gb_n']:.1f} |",
          "", f"Per-GPU efficiency: **{row['efficiency']:.3f}** (target ≥ {TARGET:.2f}: "
          f"{'met' if row['efficiency'] >= TARGET else 'missed'}); rates are medians over the logged steps after step "
          f"{skip}.", f"Largest |Δ training loss| over the {row['steps']} common steps: {row['max_dloss']:.4f} "
          f"(median {row['median_dloss']:.4f}); Δ = the {row['gpus']}-GPU run's loss minus the one-GPU run's.", ""]
    (folder / "scaling.md").write_text("\n".join(md))
    (folder / "scaling.json").write_text(json.dumps({**meta, **row}, indent=1))
    plot_pair(row, folder / "scaling.png")
    print("\n".join(md))
    return row


def plot_pair(row: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (("loss_1", "1 GPU"), ("loss_n", f"{row['gpus']} GPUs")):
        ax.plot(*zip(*row[key]), label=label)
    ax.set(xlabel="step", ylabel="training loss", title=f"{row['config']} {row['backend']} {row['launcher']}")
    ax.legend()
    bx.plot(*zip(*row["dloss"]))
    bx.axhline(0, color="black", lw=0.5)
    bx.set(xlabel="step", ylabel=f"loss, {row['gpus']} GPUs − 1 GPU (nats)",
           title=f"per-GPU efficiency {row['efficiency']:.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- several pairs -----------------------------------------------------------------------------------------------

def table_markdown(rows: list[dict], skip: int) -> str:
    lines = ["| config | backend | launcher | GPUs | tokens/s, 1 GPU | tokens/s, N GPUs | per GPU | efficiency | "
             "peak GB 1 / N | steps | max / median \\|Δ loss\\| | status |", "|" + "---|" * 12]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['config']} | {r['backend']} | {r['launcher']} | | | | | | | | | {r['status']} |")
            continue
        lines.append(f"| {r['config']} | {r['backend']} | {r['launcher']} | {r['gpus']} | {r['tps_1']:,.0f} | "
                     f"{r['tps_n']:,.0f} | {r['per_gpu']:,.0f} | **{r['efficiency']:.3f}** | {r['peak_gb_1']:.1f} / "
                     f"{r['peak_gb_n']:.1f} | {r['steps']} | {r['max_dloss']:.4f} / {r['median_dloss']:.4f} | ok |")
    return "\n".join(lines + ["", f"Rates are medians over the logged steps after step {skip}; the loss gap is the "
                              "N-GPU run's training loss minus the one-GPU run's at each common step.", ""])


def plot_table(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.5))
    ax.barh([r["pair"] for r in ok], [r["efficiency"] for r in ok], color="tab:blue")
    ax.axvline(TARGET, color="tab:red", ls="--", label=f"{TARGET:.2f} target")
    ax.set_xlabel("tokens/s per GPU, N GPUs ÷ 1 GPU")
    ax.legend()
    for r in ok:
        bx.plot(*zip(*r["dloss"]), label=r["pair"])
    bx.axhline(0, color="black", lw=0.5)
    bx.set(xlabel="step", ylabel="training loss, N GPUs − 1 GPU (nats)")
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(paths: list[Path], skip: int, out: Path | None) -> list[dict]:
    """Every pair folder among paths (a path holding gpu*/metrics.jsonl is one; otherwise its subfolders that
    do), one row each, written to <out>.{md,json,png} (default: <first path>/scaling)."""
    pairs = []
    for p in paths:
        if not p.is_dir():
            raise SystemExit(f"{p}: no such folder")
        pairs += [p] if any(p.glob("gpu*/metrics.jsonl")) else \
            sorted(d for d in p.iterdir() if d.is_dir() and any(d.glob("gpu*/metrics.jsonl")))
    if not pairs:
        raise SystemExit(f"{', '.join(map(str, paths))}: no pair folder (gpu1/ and gpu<N>/ with metrics.jsonl) in it")
    rows = [pair_row(d, skip) for d in pairs]
    out = out or paths[0] / "scaling"
    out.parent.mkdir(parents=True, exist_ok=True)
    md = table_markdown(rows, skip)
    out.with_suffix(".md").write_text(md)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    plot_table(rows, out.with_suffix(".png"))
    print(md)
    return rows


def main(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="the model's preset, e.g. configs/gla_340m.yaml")
    p.add_argument("--backend", default="fused", help="train.py's --backend for both runs (default fused)")
    p.add_argument("--nproc", type=int, default=2, help="GPUs of the second run (at least 2)")
    p.add_argument("--fsdp", action="store_true", help="FSDP (configs/accelerate/fsdp.yaml) instead of DDP")
    p.add_argument("--steps", type=int, default=60, help="training steps of each run (default 60)")
    p.add_argument("--grad-accum", type=int, default=2, help="the N-GPU run's accumulation; the one-GPU run's is N×")
    p.add_argument("--skip", type=int, default=10, help="steps left out of the rates (compilation, autotuning)")
    p.add_argument("--run-timeout", type=int, default=0, help="seconds each run may take (0: no limit)")
    p.add_argument("--out", type=Path, help="the pair's folder (default runs/scaling/<config>-<backend>-<launcher>); "
                   "with --table, the stem of the table's files (default <first DIR>/scaling)")
    p.add_argument("--report", type=Path, metavar="DIR", help="only report the pair already trained in DIR")
    p.add_argument("--table", type=Path, nargs="+", metavar="DIR", help="gather pair folders into one table")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args, overrides = p.parse_known_args(argv)
    if bad := [o for o in overrides if not o.startswith("--") or "=" not in o]:
        p.error(f"unrecognised arguments {' '.join(bad)}: train.py overrides take the form --a.b=value")
    if args.table:
        return table(args.table, args.skip, args.out)
    if args.report:
        return report(args.report, args.skip, {})
    if not args.config:
        p.error("--config is required to train a pair (or give --report DIR or --table DIR ...)")
    if args.nproc < 2:
        p.error(f"--nproc must be at least 2 (the second run's GPUs), got {args.nproc}")
    launcher = "fsdp" if args.fsdp else "ddp"
    name = Path(args.config).stem
    args.out = (args.out or REPO / "runs" / "scaling" / f"{name}-{args.backend}-{launcher}").resolve()
    if args.dry_run:
        cmds = commands(args.config, args.backend, args.nproc, args.fsdp, args.steps, args.grad_accum, args.out,
                        overrides)
        for run, argv_, extra in cmds:
            print(f"{run}: " + "".join(f"{k}={v} " for k, v in extra.items()) + " ".join(argv_))
        return cmds
    train_pair(args, overrides)
    command = "python scripts/scaling.py " + " ".join(argv if argv is not None else sys.argv[1:])
    return report(args.out, args.skip, {"config": name, "backend": args.backend, "launcher": launcher,
                                        "nproc": args.nproc, "command": command})


if __name__ == "__main__":
    main()
