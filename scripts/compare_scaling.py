"""Compare a one-GPU run with an N-GPU run of the same model and global batch (scripts/gpu_scaling.sh):
tokens/s per GPU after warm-up, its ratio to one GPU's (issue [E]'s target: ≥ 0.9), and the largest
training-loss difference over the common steps (the same rows make each step, so only the
reduction order differs).

    python scripts/compare_scaling.py runs/gpu1 runs/gpu2 --out scaling.md
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


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
            "per_gpu": statistics.median(tps) / world, "steps": steps}


def compare(one: Path, many: Path, skip: int) -> dict:
    """The two runs' summaries, the per-GPU rate ratio (many ÷ one) and the training-loss gap (many − one) at each
    common step."""
    a, b = summary(one, skip), summary(many, skip)
    common = sorted(set(a["steps"]) & set(b["steps"]))
    gaps = [(s, b["steps"][s]["loss"] - a["steps"][s]["loss"]) for s in common]
    return {"one": a, "many": b, "ratio": b["per_gpu"] / a["per_gpu"], "gaps": gaps,
            "max_dloss": max((abs(g) for _, g in gaps), default=float("nan"))}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("one", type=Path, help="the one-GPU run folder")
    p.add_argument("many", type=Path, help="the multi-GPU run folder")
    p.add_argument("--skip", type=int, default=10, help="steps left out of the rate (compilation, autotuning)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    c = compare(args.one, args.many, args.skip)
    a, b, ratio, dloss = c["one"], c["many"], c["ratio"], c["max_dloss"]
    md = "\n".join([
        f"# Scaling: {a['run']} ({a['gpus']} GPU) vs {b['run']} ({b['gpus']} GPUs), same global batch", "",
        "| run | GPUs | tokens/s | tokens/s per GPU |", "|---|---|---|---|",
        *(f"| {r['run']} | {r['gpus']} | {r['tokens_per_s']:,.0f} | {r['per_gpu']:,.0f} |" for r in (a, b)), "",
        f"Per-GPU throughput ratio: **{ratio:.3f}** (target ≥ 0.90: {'met' if ratio >= 0.9 else 'missed'}); "
        f"median over logged steps after step {args.skip}.",
        f"Largest |Δ training loss| over the {len(c['gaps'])} common steps: {dloss:.4f}.", ""])
    if args.out:
        args.out.write_text(md)
    print(md)
    return {"ratio": ratio, "max_dloss": dloss}


if __name__ == "__main__":
    main()
