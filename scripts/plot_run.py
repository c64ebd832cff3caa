"""Plot training and validation loss of one or more runs (metrics.jsonl) into a PNG.

    python scripts/plot_run.py runs/smoke [runs/other ...] --out loss.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(run: Path) -> tuple[list, list]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    return train, val


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, help="PNG path (default: <first run>/loss.png)")
    p.add_argument("--hline", type=float, help="a reference loss to draw, e.g. a source's entropy rate")
    args = p.parse_args(argv)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in args.runs:
        train, val = read(run)
        line, = ax.plot(*zip(*train), label=f"{run.name} train", lw=1)
        if val:
            ax.plot(*zip(*val), "o--", color=line.get_color(), label=f"{run.name} val", ms=4)
    if args.hline is not None:
        ax.axhline(args.hline, color="k", ls=":", lw=1, label=f"reference {args.hline:.4f}")
    ax.set(xlabel="step", ylabel="loss (nats/token)", title="training curves")
    ax.grid(alpha=0.3)
    ax.legend()
    out = args.out or args.runs[0] / "loss.png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    return out
if __name__ == "__main__":
    main()
