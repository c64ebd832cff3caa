"""The results of a parity test (scripts/parity.py): per run its validation curve, final loss and slope; per
compared pair the paired Δ over seeds with its verdict (eval/parity_stats.py); the markdown table, the warnings,
the exit status and the plot of the validation curves with their seed bands."""
from __future__ import annotations

import json
import math
from pathlib import Path

from eval import parity_stats as stats

EXIT_STATUS = {"equivalent": 0, "different": 1, "undecided": 2}


def read_metrics(run: Path) -> tuple[dict[int, float], dict[int, float]]:
    """A run's training and validation losses by step, from its metrics.jsonl."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return ({r["step"]: r["loss"] for r in rows if "loss" in r},
            {r["step"]: r["val_loss"] for r in rows if "val_loss" in r})


def summarize(runs: dict[str, dict[int, Path]], pairs: dict[str, str], floor: str | None, windows: dict[str, dict],
              tests: dict[str, dict[int, dict]], tolerance: float) -> tuple[dict, dict]:
    """(curves, compared). curves: per run name its per-seed validation curve, final loss, slope and test scores,
    and the means over seeds. compared: per name in `pairs` (each backend against the reference, the floor against
    its own spec) Δ over seeds, parity_stats.verdict's keys (the floor's Δ as the floor of every other name) and
    the paired window SE at the first seed with the windows that would bring it under WINDOW_SE_TARGET."""
    curves = {}
    for name, by_seed in runs.items():
        per = {}
        for seed, folder in by_seed.items():
            train, val = read_metrics(folder)
            if not val:
                raise SystemExit(f"error: {folder} logged no validation loss")
            steps = sorted(val)
            per[seed] = {"folder": str(folder), "train_loss": train, "val_loss": val, "final_val_loss": val[steps[-1]],
                         "final_step": steps[-1], "val_slope": stats.final_slope(steps, [val[s] for s in steps]),
                         "test": tests[name][seed]}
        curves[name] = with_means(per)
    return curves, compare(curves, pairs, floor, windows, tolerance)


def with_means(per: dict[int, dict]) -> dict:
    """A run's curves over its seeds and their means: {"seeds", "val_slope_mean", "final_val_loss_mean"}."""
    return {"seeds": per, "val_slope_mean": sum(r["val_slope"] for r in per.values()) / len(per),
            "final_val_loss_mean": sum(r["final_val_loss"] for r in per.values()) / len(per)}


def compare(curves: dict, pairs: dict[str, str], floor: str | None, windows: dict[str, dict],
            tolerance: float) -> dict:
    """summarize's `compared` from the runs' curves: paired over the seeds both runs finished (a failed run leaves
    its seed out of its comparisons only)."""
    seeds = {name: c["seeds"] for name, c in curves.items()}
    pairs = {name: base for name, base in pairs.items() if set(seeds.get(name, ())) & set(seeds.get(base, ()))}
    deltas = {name: [seeds[name][s]["final_val_loss"] - seeds[base][s]["final_val_loss"]
                     for s in sorted(seeds[name]) if s in seeds[base]] for name, base in pairs.items()}
    floor_d = deltas.get(floor) if floor else None
    compared = {}
    for name, base in pairs.items():
        v = stats.verdict(deltas[name], tolerance, None if name == floor else floor_d)
        if name in windows:
            w = windows[name]["losses"]
            se = stats.paired_window_se(windows[base]["losses"], w)
            need = stats.windows_for_se(se, len(w)) if se > stats.WINDOW_SE_TARGET else None
            win = {"window_se": se, "windows": len(w), "windows_needed": need,
                   "windows_available": windows[name]["available"], "window_micro_batch": windows[base]["micro_batch"]}
        else:
            win = {"window_se": None, "windows": 0, "windows_needed": None}
        compared[name] = {"against": base, "deltas": deltas[name], **v, **win}
    return compared


# the options merged tests may differ in: the first seed, and where the token shards are cached
NOT_THE_PROTOCOL = ("--train.seed=", "--data.cache_dir=")


def merge(results: list[dict]) -> dict:
    """One parity result from tests of one protocol (config, steps, overrides, specs, reference, floor, tolerance)
    over disjoint seeds, e.g. seeds trained in several calls or on several machines: their curves pooled and every
    comparison and verdict recomputed over all the seeds. The paired window SE (checked at one seed of each test)
    and the teacher-forced scores stay in the merged files."""
    base = results[0]
    protocol = lambda r: (r["config"], r["steps"], r["tolerance"], r["reference"], r["floor"], sorted(r["runs"]),
                          sorted(o for o in r["overrides"] if not o.startswith(NOT_THE_PROTOCOL)))
    seen: set[int] = set()
    for r in results:
        if protocol(r) != protocol(base):
            raise ValueError(f"cannot merge parity tests of different protocols: {protocol(base)} and {protocol(r)}")
        if seen & set(r["seeds"]):
            raise ValueError(f"cannot merge parity tests that share seeds {sorted(seen & set(r['seeds']))}")
        seen |= set(r["seeds"])
    curves = {}
    for name in base["runs"]:
        per = {}
        for r in results:
            for seed, run in r["runs"][name]["seeds"].items():
                per[int(seed)] = {**run, "train_loss": {int(k): v for k, v in run["train_loss"].items()},
                                  "val_loss": {int(k): v for k, v in run["val_loss"].items()}}
        curves[name] = with_means(dict(sorted(per.items())))
    pairs = {name: c["against"] for name, c in base["compared"].items()}
    compared = compare(curves, pairs, base["floor"], {}, base["tolerance"])
    devices = sorted({r["device"] for r in results})
    out = {k: v for k, v in base.items() if k not in ("teacher", "teacher_tolerance")}
    out.update(seeds=sorted(seen), runs=curves, compared=compared, window_seed=None, device="; ".join(devices),
               warnings=list(dict.fromkeys(w for r in results for w in r["warnings"])), merged=len(results))
    out["exit_status"] = exit_status(compared, base["floor"])
    return out


def window_warnings(compared: dict, seed: int) -> list[str]:
    """One line per comparison whose paired window SE exceeds WINDOW_SE_TARGET: the windows, and the
    --train.eval_batches, that would bring it under (and the split's size when it holds fewer)."""
    out = []
    for name, c in compared.items():
        if c["windows_needed"]:
            more = c["windows_needed"] - c["windows"]
            batches = -(-c["windows_needed"] // c["window_micro_batch"])
            tail = (f"; the split holds {c['windows_available']} windows" if c["windows_needed"] > c["windows_available"]
                    else "")
            out.append(f"`{name}` − `{c['against']}` at seed {seed}: paired window SE {c['window_se']:.4f} over "
                       f"{c['windows']} validation windows exceeds {stats.WINDOW_SE_TARGET} nats; {c['windows_needed']} "
                       f"windows ({more} more: --train.eval_batches={batches}) bring it under{tail}")
    return out


def exit_status(compared: dict, floor: str | None) -> int:
    """1 when any backend is different, else 2 when any is undecided, else 0 (the floor's own row is no verdict)."""
    verdicts = {c["verdict"] for n, c in compared.items() if n != floor}
    return 1 if "different" in verdicts else 2 if "undecided" in verdicts else 0


def fmt(x: float | None, spec: str = "+.4f") -> str:
    """A number for the table in `spec` (a fixed-point format), in scientific notation where that would show
    fewer than two significant digits (rounding-level differences are the floor's scale); — for None and NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    digits = int(spec.rsplit(".", 1)[1].rstrip("f"))
    if x != 0 and math.isfinite(x) and abs(x) < 10.0 ** (1 - digits):
        return format(x, spec.rsplit(".", 1)[0] + ".1e")
    return format(x, spec)


def to_markdown(result: dict, command: str) -> str:
    """parity.md: the settings, one row per run (the reference's final losses, each backend's Δ and verdict, the
    floor's), the warnings and, with --teacher, the teacher-forced Δ per backend, seed and checkpoint."""
    ref, floor, tol = result["reference"], result["floor"], result["tolerance"]
    seeds, curves, comp = result["seeds"], result["runs"], result["compared"]
    conf = f"{stats.CONFIDENCE:.0%}"
    lines = [f"# Parity: {result['config']}, {result['steps']} steps, seeds {', '.join(map(str, seeds))}, reference "
             f"`{ref}`", "", f"Command: `{command}`  ", f"Device: {result['device']}", "",
             f"Δ = final validation loss − `{ref}`'s at the same seed (nats/token); interval: {conf} Student t over "
             f"the seeds. `equivalent`: the interval inside ±{tol} (two one-sided tests at 5 %: TOST p < 0.05) and "
             "the spread of Δ not significantly above the floor's (one-sided F-test at 5 %); `different`: the interval excludes 0 and misses the floor's; else `undecided`, "
             "with the seeds that would decide at the observed spread. "
             + (f"Floor: `{floor}` − `{comp[floor]['against']}`, the same backend re-summed (micro-batch split in two, "
                "the same rows per step)." if floor else
                "**No floor was run: the spread and floor conditions are not checked**; `equivalent` rests on the "
                "interval alone, `different` on excluding 0."), "",
             f"| run | Δ per seed | mean Δ | sd Δ | {conf} interval | TOST p | spread ≤ floor's (F-test) | final val slope "
             f"(nats/1k steps) | window SE (seed {'—' if result.get('window_seed') is None else result['window_seed']}) | test token ppl | test word ppl | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ppl(name: str, key: str) -> str:
        vals = [r["test"].get(key) for r in curves[name]["seeds"].values()]
        return "—" if None in vals else f"{sum(vals) / len(vals):.3f}"

    r0 = curves[ref]
    lines.append(f"| `{ref}` (reference; final val loss) | "
                 + ", ".join(f"{r['final_val_loss']:.4f}" for r in r0["seeds"].values())
                 + f" | {r0['final_val_loss_mean']:.4f} | | | | | {fmt(1000 * r0['val_slope_mean'], '+.3f')} | | "
                 f"{ppl(ref, 'token_ppl')} | {ppl(ref, 'word_ppl')} | reference |")
    for name, c in comp.items():
        spread = {True: "yes", False: "**no**", None: "not checked"}[c["spread_ok"]]
        if name == floor:
            spread, verdict = "", "noise floor"
        elif c["verdict"] == "undecided":
            verdict = f"undecided: {c['reason']}"
        else:
            verdict = f"**{c['verdict']}**" if c["verdict"] == "different" else c["verdict"]
        label = f"`{name}` − `{c['against']}` (floor)" if name == floor else f"`{name}`"
        lines.append(f"| {label} | " + ", ".join(fmt(d) for d in c["deltas"]) + f" | {fmt(c['mean'])} | "
                     f"{fmt(c['sd'], '.4f')} | [{fmt(c['lo'])}, {fmt(c['hi'])}] | {fmt(c['tost_p'], '.3f')} | {spread} "
                     f"| {fmt(1000 * curves[name]['val_slope_mean'], '+.3f')} | {fmt(c['window_se'], '.4f')} | "
                     f"{ppl(name, 'token_ppl')} | {ppl(name, 'word_ppl')} | {verdict} |")
    if result["warnings"]:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in result["warnings"]]
    if "teacher" in result:
        lines += _teacher_lines(result["teacher"], ref, result["teacher_tolerance"])
    return "\n".join(lines) + "\n"


def _teacher_lines(teacher: dict, ref: str, tol: float) -> list[str]:
    steps = sorted({s for t in teacher.values() for s in t[ref]["delta"]})
    lines = ["", f"Teacher-forced: each backend's validation loss on `{ref}`'s weights at its checkpoints, minus "
             f"`{ref}`'s own (the same function on trained weights; no training dynamics). Pass: every |Δ| ≤ {tol}.",
             "", "| backend | seed | " + " | ".join(f"Δ at {s}" for s in steps) + " | verdict |",
             "|---|---|" + "---|" * (len(steps) + 1)]
    for seed, by_spec in teacher.items():
        for b, r in by_spec.items():
            if "skipped" in r:
                lines.append(f"| `{b}` | {seed} | " + " | ".join("—" for _ in steps) + f" | n/a: {r['skipped']} |")
            elif b != ref:
                lines.append(f"| `{b}` | {seed} | " + " | ".join(fmt(r["delta"].get(s), "+.6f") for s in steps)
                             + f" | {'pass' if r['pass'] else '**FAIL**'} |")
    return lines


def plot(result: dict, path: Path) -> None:
    """One PNG: left, each run's validation loss (mean over seeds, band min–max); right, the paired Δ of each
    compared run over training, with the ±tolerance band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax, dx) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = {}
    for name, c in result["runs"].items():
        per = list(c["seeds"].values())
        steps = sorted(set.intersection(*(set(r["val_loss"]) for r in per)))
        v = np.array([[r["val_loss"][s] for s in steps] for r in per])
        line, = ax.plot(steps, v.mean(0), "o-", ms=3, label=f"{name} (mean of {len(per)})")
        ax.fill_between(steps, v.min(0), v.max(0), color=line.get_color(), alpha=0.2)
        colors[name] = line.get_color()
    for name, cmp in result["compared"].items():
        a, b = result["runs"][name]["seeds"], result["runs"][cmp["against"]]["seeds"]
        both = [s for s in a if s in b]
        steps = sorted(set.intersection(*(set(a[s]["val_loss"]) & set(b[s]["val_loss"]) for s in both)))
        d = np.array([[a[s]["val_loss"][t] - b[s]["val_loss"][t] for t in steps] for s in both])
        dx.plot(steps, d.mean(0), "o-", ms=3, color=colors[name], label=f"{name} − {cmp['against']}")
        dx.fill_between(steps, d.min(0), d.max(0), color=colors[name], alpha=0.2)
    tol = result["tolerance"]
    dx.axhspan(-tol, tol, color="0.5", alpha=0.15, label=f"±{tol} nats")
    dx.set_yscale("symlog", linthresh=tol)      # linear inside ±tolerance, a far-off run does not flatten the rest
    ax.set(xlabel="step", ylabel="validation loss (nats/token)", title="validation loss: mean, band min–max over seeds")
    dx.set(xlabel="step", ylabel="Δ validation loss", title=f"Δ to {result['reference']} (floor: to its backend)")
    for a in (ax, dx):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
