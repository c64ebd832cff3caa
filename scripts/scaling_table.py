"""Issue [K]'s table: every (config, backend, launcher) pair that scripts/gpu_scaling_matrix.sh ran, one GPU against
N GPUs with the same global batch, in one markdown and JSON table and one PNG.

    python scripts/scaling_table.py OUT --out bench/results/<date>-h200x8-scaling/scaling

OUT holds one folder per pair, named CONFIG-BACKEND-LAUNCHER, each with the gpu1/ and gpuN/ run folders (run.json,
metrics.jsonl) that scripts/gpu_scaling.sh leaves. Per pair: tokens/s on one GPU and on N, per GPU, the scaling
efficiency (N-GPU rate per GPU ÷ one GPU's; [E]'s target is ≥ 0.90), peak memory of each, and the training-loss
gap over the common steps. A pair whose N-GPU run did not finish is a row that says so.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.compare_scaling import compare  # noqa: E402


def pair_row(folder: Path, skip: int) -> dict:
    config, backend, launcher = (folder.name.split("-", 2) + ["?", "?"])[:3]
    row = {"pair": folder.name, "config": config, "backend": backend, "launcher": launcher}
    runs = sorted((p for p in folder.glob("gpu*") if (p / "metrics.jsonl").is_file()), key=lambda p: int(p.name[3:]))
    one = next((p for p in runs if p.name == "gpu1"), None)
    many = [p for p in runs if p.name != "gpu1"]
    if one is None or not many:
        return {**row, "status": "missing " + ("the one-GPU run" if one is None else "the multi-GPU run")}
    try:
        c = compare(one, many[-1], skip)
    except SystemExit as e:                   # a run that died before `skip` steps
        return {**row, "status": str(e)}
    a, b, gaps = c["one"], c["many"], c["gaps"]
    peak = [max((r.get("peak_mem_gb") or 0) for r in x["steps"].values()) for x in (a, b)]
    return {**row, "status": "ok", "gpus": b["gpus"], "tps_1": a["tokens_per_s"], "tps_n": b["tokens_per_s"],
            "per_gpu": b["per_gpu"], "efficiency": c["ratio"], "peak_gb_1": peak[0], "peak_gb_n": peak[1],
            "steps": len(gaps), "max_dloss": c["max_dloss"], "median_dloss": statistics.median(abs(g) for _, g in gaps),
            "dloss": gaps}


def to_markdown(rows: list[dict], skip: int) -> str:
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


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.5))
    ax.barh([r["pair"] for r in ok], [r["efficiency"] for r in ok], color="tab:blue")
    ax.axvline(0.9, color="tab:red", ls="--", label="0.90 target")
    ax.set_xlabel("tokens/s per GPU, N GPUs ÷ 1 GPU")
    ax.legend()
    for r in ok:
        bx.plot(*zip(*r["dloss"]), label=r["pair"])
    bx.axhline(0, color="black", lw=0.5)
    bx.set_xlabel("step")
    bx.set_ylabel("training loss, N GPUs − 1 GPU (nats)")
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", type=Path, help="the folder holding one CONFIG-BACKEND-LAUNCHER folder per pair")
    p.add_argument("--skip", type=int, default=10, help="steps left out of the rates (compilation, autotuning)")
    p.add_argument("--out", type=Path, help="writes OUT.md, OUT.json and OUT.png (default: ROOT/scaling)")
    args = p.parse_args(argv)
    pairs = sorted(d for d in args.root.iterdir() if d.is_dir() and any(d.glob("gpu*/metrics.jsonl")))
    if not pairs:
        raise SystemExit(f"{args.root}: no CONFIG-BACKEND-LAUNCHER folder with gpu*/metrics.jsonl in it")
    rows = [pair_row(d, args.skip) for d in pairs]
    out = args.out or args.root / "scaling"
    out.parent.mkdir(parents=True, exist_ok=True)
    md = to_markdown(rows, args.skip)
    out.with_suffix(".md").write_text(md)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    plot(rows, out.with_suffix(".png"))
    print(md)
    return rows


if __name__ == "__main__":
    main()
