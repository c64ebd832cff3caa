"""The report of a benchmark run: the markdown tables (one per op, columns where any row has a value), the
long-format JSON rows with the device, versions and commit, and the plot of the times."""
from __future__ import annotations

import datetime
import json
import math
from pathlib import Path

import torch

from bench.runner import FAMILIES

DEFAULT_OUT = Path("runs/bench")

COLUMNS = [("fwd ms", "fwd_ms", ".4g"), ("fwd+bwd ms", "fwdbwd_ms", ".4g"), ("bwd ms", "bwd_ms", ".4g"),
           ("graph ms", "graph_ms", ".4g"), ("fwd TFLOP/s", "fwd_tflops", ".1f"),
           ("fwd+bwd TFLOP/s", "fwdbwd_tflops", ".1f"), ("bwd TFLOP/s", "bwd_tflops", ".1f"),
           ("fwd GB/s", "fwd_gbs", ".0f"), ("fwd+bwd GB/s", "fwdbwd_gbs", ".0f"), ("bwd GB/s", "bwd_gbs", ".0f"),
           ("peak MB", "peak_mb", ".0f"), ("saved MB", "saved_mb", ".0f"), ("kernel ms", "kernel_ms", ".4g"),
           ("model floor fwd ms", "floor_fwd_ms", ".3f"), ("model floor fwd+bwd ms", "floor_fwdbwd_ms", ".3f"),
           ("peer ÷ this fwd", "speedup_fwd", ".2f"), ("peer ÷ this fwd+bwd", "speedup_fwdbwd", ".2f"),
           ("peer ÷ this bwd", "speedup_bwd", ".2f"), ("peer ÷ this graph", "speedup_graph", ".2f")]


def to_markdown(rows: list[dict], env: dict, command: str, notes: list[str]) -> str:
    dtype = "bf16 (attention fp16)" if env.get("gpu") else "fp32 under Triton's interpreter (times mean nothing)"
    lines = [f"# Op benchmarks — {env['date']}, {env.get('gpu') or 'CPU'}", "", f"Command: `{command}`  ",
             f"torch {env['torch']}, triton {env['triton']}, fla {env['fla']}, commit {env.get('commit')}"
             f"{' (dirty)' if env.get('dirty') else ''}; {dtype}; bench_ms medians (do_bench), fwd+bwd by "
             "torch.autograd.grad; checks against the fp32 oracle before timing.", ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    for op in dict.fromkeys(r["op"] for r in rows):
        ours = [r for r in rows if r["op"] == op]
        cols = [c for c in COLUMNS if any(c[1] in r for r in ours)]
        peer = FAMILIES[op].peer
        heads = " | ".join(h.replace("peer", peer) for h, _, _ in cols)
        lines += [f"## {op}", "", f"| shape | variant | check | {heads} | notes |", "|" + "---|" * (len(cols) + 4)]
        for r in ours:
            dims = " ".join(f"{k}{v}" for k, v in r["dims"].items() if not isinstance(v, bool)) + \
                "".join(f" {k}" for k, v in r["dims"].items() if v is True)
            done = r["status"] in ("ok", "FAIL", "bound")
            check = r.get("check", "") if done else f"{r['status']}: {r.get('why', '')}"
            if r["status"] == "bound":
                check += ", not timed"
            cells = [format(r[k], f) if isinstance(r.get(k), (int, float)) else "" for _, k, f in cols]
            note = "; ".join(x for x in (r.get("note"), r.get("graph_error") and f"graph: {r['graph_error']}") if x)
            lines.append(f"| {r['shape']} ({dims}) | {r['variant']} | {check} | " + " | ".join(cells) + f" | {note} |")
        lines.append("")
    tables = [r for r in rows if "kernel_table" in r]
    if tables:
        lines += ["## Kernel tables (torch.profiler, 5 steps of fwd+bwd after 3)", ""]
        for r in tables:
            lines += [f"### {r['op']} {r['shape']} {r['variant']}", "", "```", r["kernel_table"], "```", ""]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """fwd+bwd (or bwd, or fwd for forward-only ops) ms per shape and variant, one panel per op, log scale."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    ops = list(dict.fromkeys(r["op"] for r in ok)) or ["(nothing timed)"]
    fig, axes = plt.subplots(1, len(ops), figsize=(5.5 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        mine = [r for r in ok if r["op"] == op]
        key = next((k for k in ("fwdbwd_ms", "bwd_ms", "fwd_ms") if any(k in r for r in mine)), "fwd_ms")
        shapes = list(dict.fromkeys(r["shape"] for r in mine))
        variants = list(dict.fromkeys(r["variant"] for r in mine))
        w = 0.8 / max(1, len(variants))
        for i, v in enumerate(variants):
            ys = [next((r.get(key, math.nan) for r in mine if r["shape"] == s and r["variant"] == v), math.nan)
                  for s in shapes]
            ax.bar([j + i * w for j in range(len(shapes))], ys, w, label=v)
        ax.set_xticks([j + w * (len(variants) - 1) / 2 for j in range(len(shapes))], shapes, rotation=15)
        ax.set(yscale="log", ylabel=key.replace("_ms", " ms").replace("fwdbwd", "fwd+bwd"), title=op)
        if variants:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment(device: torch.device) -> dict:
    from utils.runinfo import environment as run_environment

    env = run_environment(device)
    return {**env, "gpu": env.get("gpu"), "date": datetime.date.today().isoformat()}


def write(rows: list[dict], env: dict, command: str, notes: list[str], stem: Path) -> None:
    stem.with_suffix(".md").write_text(to_markdown(rows, env, command, notes))
    long = [{**{k: v for k, v in r.items() if k != "kernel_table"}, "device": env.get("gpu") or "cpu",
             "torch": env["torch"], "triton": env["triton"], "fla": env["fla"], "commit": env.get("commit"),
             "dirty": env.get("dirty"), "date": env["date"]} for r in rows]
    stem.with_suffix(".json").write_text(json.dumps({"command": command, "notes": notes, "env": env, "rows": long},
                                                    indent=1, default=str))
    plot(rows, stem.with_suffix(".png"))
