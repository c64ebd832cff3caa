"""The report of a scaling study (scripts/scaling.py): one folder per config, holding gpu1/, gpu<N>/ for each GPU count
and optionally gpu1-floor/, each with the metrics.jsonl and run.json of train.py.

Rates are the median tokens/s over the logged steps after `skip` (compilation and autotuning left out); the per-GPU
efficiency of an N-GPU run is its rate per GPU ÷ the one-GPU run's. The loss gap Δ of a run is its training loss
minus gpu1's at each common step. The floor (gpu1-floor: the same global batch at half the micro-batch and twice the
accumulation) sums the same rows in another order, so its gap is what reordering alone costs; the N-GPU gap is read
against it.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

TARGETS = {"ddp": 0.95, "fsdp": 0.90}      # per-GPU efficiency to meet, by launcher
FLOOR_FACTOR = 1.5                         # the N-GPU gap is "within the floor's" up to this multiple of it
FLOOR = "gpu1-floor"
META_KEYS = ("config", "backend", "launcher", "nproc", "grad_accum", "steps", "rate_steps", "planned", "failed",
             "command")


def target(launcher: str) -> float | None:
    """The efficiency target of a launcher (None when the folder does not say which launcher ran)."""
    return TARGETS.get(launcher)


def load(run: Path) -> tuple[dict, dict[int, dict]]:
    info = json.loads((run / "run.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return info, {r["step"]: r for r in rows if "loss" in r}


def summary(run: Path, skip: int) -> dict:
    """A run's median tokens/s after `skip`, per GPU, its peak memory and its logged steps."""
    info, steps = load(run)
    world = info.get("world_size") or info.get("num_processes") or 1
    tps = [r["tokens_per_s"] for s, r in steps.items() if s > skip and r.get("tokens_per_s")]
    if not tps:
        raise SystemExit(f"{run}: no logged step after step {skip}; run more steps or lower --skip")
    return {"run": run.name, "status": "ok", "gpus": world, "tokens_per_s": statistics.median(tps),
            "per_gpu": statistics.median(tps) / world, "steps": steps,
            "peak_gb": max((r.get("peak_mem_gb") or 0) for r in steps.values())}


def gap(one: dict, other: dict) -> dict:
    """other's training loss − one's at each common step, and the largest and median |Δ|."""
    gaps = [(s, other["steps"][s]["loss"] - one["steps"][s]["loss"]) for s in sorted(set(one["steps"]) &
                                                                                     set(other["steps"]))]
    return {"dloss": gaps, "common": len(gaps), "max_dloss": max((abs(g) for _, g in gaps), default=float("nan")),
            "median_dloss": statistics.median(abs(g) for _, g in gaps) if gaps else float("nan")}


def runs_of(folder: Path) -> tuple[Path | None, list[Path], Path | None]:
    """gpu1, the gpu<N> runs by N (digits only after "gpu", so gpu1-floor is not one) and gpu1-floor, of those
    holding a metrics.jsonl."""
    runs = sorted((p for p in folder.glob("gpu*") if (p / "metrics.jsonl").is_file() and p.name[3:].isdigit()),
                  key=lambda p: int(p.name[3:]))
    floor = folder / FLOOR
    return (next((p for p in runs if p.name == "gpu1"), None), [p for p in runs if p.name != "gpu1"],
            floor if (floor / "metrics.jsonl").is_file() else None)


def read_meta(folder: Path) -> dict:
    """What the training command recorded in <folder>/scaling.json (names, the runs it meant, why some failed)."""
    path = folder / "scaling.json"
    meta = json.loads(path.read_text()) if path.is_file() else {}
    return {k: meta[k] for k in META_KEYS if k in meta} if isinstance(meta, dict) else {}


def names(folder: Path, meta: dict) -> dict:
    """config, backend and launcher: from scaling.json, else from the folder's name CONFIG-BACKEND-LAUNCHER."""
    config, backend, launcher = (folder.name.split("-", 2) + ["?", "?"])[:3]
    return {"pair": folder.name, "config": meta.get("config", config), "backend": meta.get("backend", backend),
            "launcher": meta.get("launcher", launcher)}


def study(folder: Path, skip: int) -> dict:
    """Every run of one folder against gpu1: its rate, efficiency and loss gap; one table row per N-GPU run; the
    floor's gap and the reading of the largest-N gap against it. Raises SystemExit when gpu1 cannot be read."""
    meta = read_meta(folder)
    base = names(folder, meta)
    failed = meta.get("failed", {})
    one, many, floor = runs_of(folder)
    if planned := meta.get("planned"):                   # runs an earlier study left in the folder are not this one's
        many, floor = [p for p in many if p.name in planned], floor if FLOOR in planned else None
    if one is None:
        raise SystemExit(f"{folder}: missing the one-GPU run" + (f" (gpu1: {failed['gpu1']})" if "gpu1" in failed
                                                                  else ""))
    a = summary(one, skip)
    runs, pairs, floor_gap = [a], [], None
    for path in [*many, *([floor] if floor else [])]:
        try:
            b = summary(path, skip)
            b.update(gap(a, b))
        except SystemExit as e:                                  # a run that died before `skip` steps
            b = {"run": path.name, "status": str(e)}
        runs.append(b)
        if path.name == FLOOR and b["status"] == "ok":
            floor_gap = {k: b[k] for k in ("max_dloss", "median_dloss", "common", "dloss")}
    found = {r["run"] for r in runs}
    runs += [{"run": n, "status": failed.get(n, "no metrics.jsonl")} for n in planned or [] if n not in found]
    runs.sort(key=lambda r: 10 ** 6 if r["run"] == FLOOR else int(r["run"][3:]))      # gpu1, gpu<N> by N, the floor
    for b in runs:
        if b["run"] == "gpu1" or b["run"] == FLOOR:
            continue
        if b["status"] != "ok":
            pairs.append({**base, "gpus": int(b["run"][3:]), "status": f"{b['run']}: {b['status']}"})
            continue
        b["efficiency"] = b["per_gpu"] / a["per_gpu"]
        pairs.append({**base, "status": "ok", "gpus": b["gpus"], "tps_1": a["tokens_per_s"],
                      "tps_n": b["tokens_per_s"], "per_gpu": b["per_gpu"], "efficiency": b["efficiency"],
                      "peak_gb_1": a["peak_gb"], "peak_gb_n": b["peak_gb"], "steps": b["common"],
                      "max_dloss": b["max_dloss"], "median_dloss": b["median_dloss"], "dloss": b["dloss"],
                      "loss_1": losses(a), "loss_n": losses(b)})
    pairs.sort(key=lambda r: r["gpus"])
    largest = pairs[-1] if pairs and pairs[-1]["status"] == "ok" else None     # the run of --steps steps
    for r in pairs:
        r["floor_max_dloss"] = floor_gap["max_dloss"] if floor_gap else None
        r["floor_median_dloss"] = floor_gap["median_dloss"] if floor_gap else None
        r["reading"] = reading(r["max_dloss"], floor_gap["max_dloss"], r["gpus"]) \
            if floor_gap and r is largest else None
    return {**meta, **base, "target": target(base["launcher"]), "skip": skip, "runs": runs, "pairs": pairs,
            "floor": floor_gap, "reading": largest["reading"] if largest else None}


def losses(run: dict) -> list[tuple[int, float]]:
    return sorted((s, r["loss"]) for s, r in run["steps"].items())


def reading(max_n: float, max_floor: float, gpus: int) -> str:
    """The N-GPU gap against the floor's: within it up to FLOOR_FACTOR times the floor's largest |Δ|."""
    return f"{gpus}-GPU gap {'within' if max_n <= max_floor * FLOOR_FACTOR else 'above'} the floor's"


def pair_rows(folder: Path, skip: int) -> list[dict]:
    """One table row per (config, N) of a folder; one row with the reason when gpu1 or every N-GPU run is missing."""
    base = names(folder, read_meta(folder))
    try:
        pairs = study(folder, skip)["pairs"]
    except SystemExit as e:
        return [{**base, "status": str(e).removeprefix(f"{folder}: ")}]
    return pairs or [{**base, "status": "missing the multi-GPU run"}]


# ---- one folder ------------------------------------------------------------------------------------------------

def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "" if x is None else format(x, spec)


def report(folder: Path, skip: int, meta: dict) -> dict:
    """<folder>/scaling.{md,json,png} for the study trained there (meta: what the training command knows, kept in
    scaling.json so that a later --report still knows it)."""
    if meta:
        (folder / "scaling.json").write_text(json.dumps(meta, indent=1))
    s = study(folder, skip)
    t, ok = s["target"], [p for p in s["pairs"] if p["status"] == "ok"]
    counts = ", ".join(str(p["gpus"]) for p in s["pairs"]) or "no other count of"
    md = [f"# Scaling: {s['config']} on {s['backend']}, {s['launcher']}, 1 GPU against {counts} GPUs, the same global "
          "batch",
          "", *([f"Command: `{s['command']}`", ""] if s.get("command") else []),
          "| run | GPUs | steps | tokens/s | tokens/s per GPU | per-GPU efficiency | peak GB | "
          "max / median \\|Δ loss\\| vs gpu1 | status |", "|" + "---|" * 9]
    for r in s["runs"]:
        if r["status"] != "ok":
            md.append(f"| {r['run']} | | | | | | | | {r['status']} |")
            continue
        eff = f"**{r['efficiency']:.3f}**" if "efficiency" in r else ""
        dl = f"{r['max_dloss']:.4f} / {r['median_dloss']:.4f}" if "max_dloss" in r else ""
        md.append(f"| {r['run']} | {r['gpus']} | {len(r['steps'])} | {r['tokens_per_s']:,.0f} | {r['per_gpu']:,.0f} | "
                  f"{eff} | {r['peak_gb']:.1f} | {dl} | ok |")
    md += ["", f"Rates are medians over the logged steps after step {skip}; per-GPU efficiency = tokens/s per GPU ÷ "
           "gpu1's; Δ = the run's training loss minus gpu1's at each common step."]
    if t is None:
        md.append(f"No efficiency target: the launcher ({s['launcher']}) is unknown.")
    elif ok:
        md.append(f"Target ≥ {t:.2f} under {s['launcher'].upper()}: " + ", ".join(
            f"{p['gpus']} GPUs {p['efficiency']:.3f} {'met' if p['efficiency'] >= t else 'missed'}" for p in ok) + ".")
    if ok and ok[-1] is s["pairs"][-1]:
        big = ok[-1]
        md.append(f"Largest |Δ training loss| of gpu{big['gpus']} against gpu1 over the {big['steps']} common steps: "
                  f"{big['max_dloss']:.4f} (median {big['median_dloss']:.4f}).")
    if s["floor"]:
        f = s["floor"]
        md.append(f"The floor ({FLOOR}: half the micro-batch, twice the accumulation, the same rows per step summed in "
                  f"another order) against gpu1 over {f['common']} steps: {f['max_dloss']:.4f} (median "
                  f"{f['median_dloss']:.4f}).")
    if s["reading"]:
        md.append(f"Reading: **{s['reading']}** (within when the N-GPU run's largest |Δ| ≤ {FLOOR_FACTOR} × the "
                  "floor's, else above).")
    md.append("")
    (folder / "scaling.md").write_text("\n".join(md))
    (folder / "scaling.json").write_text(json.dumps({k: v for k, v in s.items() if k != "runs"} | {
        "runs": [{k: v for k, v in r.items() if k != "steps"} for r in s["runs"]]}, indent=1))
    plot_study(s, folder / "scaling.png")
    print("\n".join(md))
    return s


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_study(s: dict, path: Path) -> None:
    """Left: the loss curves of every run; right: each run's Δ loss against gpu1 (the floor's dashed)."""
    plt = _pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for r in s["runs"]:
        if r["status"] != "ok":
            continue
        style = {"ls": "--", "color": "gray"} if r["run"] == FLOOR else {}
        label = "floor (1 GPU, half micro-batch)" if r["run"] == FLOOR else f"{r['gpus']} GPU" + "s" * (r["gpus"] > 1)
        ax.plot(*zip(*losses(r)), label=label, **style)
        if r.get("dloss"):
            bx.plot(*zip(*r["dloss"]), label=label, **style)
    ax.set(xlabel="step", ylabel="training loss", title=f"{s['config']} {s['backend']} {s['launcher']}")
    ax.legend()
    bx.axhline(0, color="black", lw=0.5)
    effs = ", ".join(f"{p['gpus']}: {p['efficiency']:.3f}" for p in s["pairs"] if p["status"] == "ok")
    bx.set(xlabel="step", ylabel="training loss − 1 GPU's (nats)", title=f"per-GPU efficiency {effs}")
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- several folders -------------------------------------------------------------------------------------------

def table_markdown(rows: list[dict], skip: int) -> str:
    lines = ["| config | backend | launcher | GPUs | tokens/s, 1 GPU | tokens/s, N GPUs | per GPU | efficiency | "
             "peak GB 1 / N | steps | max / median \\|Δ loss\\| | floor max / median \\|Δ loss\\| | status |",
             "|" + "---|" * 13]
    for r in rows:
        head = f"| {r['config']} | {r['backend']} | {r['launcher']} | "
        if r["status"] != "ok":
            lines.append(head + f"{r.get('gpus', '')} | | | | | | | | | {r['status']} |")
            continue
        fl = f"{r['floor_max_dloss']:.4f} / {r['floor_median_dloss']:.4f}" if r["floor_max_dloss"] is not None else ""
        status = "ok" + (f"; {r['reading']}" if r["reading"] else "")
        lines.append(head + f"{r['gpus']} | {r['tps_1']:,.0f} | {r['tps_n']:,.0f} | {r['per_gpu']:,.0f} | "
                     f"**{r['efficiency']:.3f}** | {r['peak_gb_1']:.1f} / {r['peak_gb_n']:.1f} | {r['steps']} | "
                     f"{r['max_dloss']:.4f} / {r['median_dloss']:.4f} | {fl} | {status} |")
    targets = "; ".join(f"≥ {v:.2f} under {k.upper()}" for k, v in TARGETS.items())
    return "\n".join(lines + ["", f"Rates are medians over the logged steps after step {skip}; the loss gap is the "
                              "N-GPU run's training loss minus the one-GPU run's at each common step, the floor's that "
                              "of one GPU at half the micro-batch and twice the accumulation. Efficiency targets: "
                              f"{targets}. The largest N is read against the floor: within when its largest |Δ| ≤ "
                              f"{FLOOR_FACTOR} × the floor's.", ""])


def plot_table(rows: list[dict], path: Path) -> None:
    plt = _pyplot()
    ok = [r for r in rows if r["status"] == "ok"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.5))
    ax.barh([f"{r['pair']} ×{r['gpus']}" for r in ok], [r["efficiency"] for r in ok], color="tab:blue")
    for (launcher, t), color in zip(TARGETS.items(), ("tab:red", "tab:orange")):
        if any(r["launcher"] == launcher for r in ok):
            ax.axvline(t, color=color, ls="--", label=f"{t:.2f} target, {launcher.upper()}")
    ax.set_xlabel("tokens/s per GPU, N GPUs ÷ 1 GPU")
    ax.legend(fontsize=8)
    for r in ok:
        bx.plot(*zip(*r["dloss"]), label=f"{r['pair']} ×{r['gpus']}")
    bx.axhline(0, color="black", lw=0.5)
    bx.set(xlabel="step", ylabel="training loss, N GPUs − 1 GPU (nats)")
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(paths: list[Path], skip: int, out: Path | None) -> list[dict]:
    """Every study folder among paths (a path holding gpu*/metrics.jsonl is one; otherwise its subfolders that
    do), one row per (folder, N), written to <out>.{md,json,png} (default: <first path>/scaling)."""
    folders = []
    for p in paths:
        if not p.is_dir():
            raise SystemExit(f"{p}: no such folder")
        folders += [p] if any(p.glob("gpu*/metrics.jsonl")) else \
            sorted(d for d in p.iterdir() if d.is_dir() and any(d.glob("gpu*/metrics.jsonl")))
    if not folders:
        raise SystemExit(f"{', '.join(map(str, paths))}: no pair folder (gpu1/ and gpu<N>/ with metrics.jsonl) in it")
    rows = [r for d in folders for r in pair_rows(d, skip)]
    out = out or paths[0] / "scaling"
    out.parent.mkdir(parents=True, exist_ok=True)
    md = table_markdown(rows, skip)
    out.with_suffix(".md").write_text(md)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    plot_table(rows, out.with_suffix(".png"))
    print(md)
    return rows
