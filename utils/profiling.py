"""Where a training step's time goes, from torch.profiler's timeline: GPU busy fraction, host gaps, NCCL time and
how much of it no other kernel hides, and the top kernels.

    summary = analyse(trace, wall_us, steps)       # a Chrome trace's numbers per step (scripts/profile_step.py)
    prof = StepProfiler("30:5", run_dir)           # train.py's --train.profile=30:5
    prof.after_step(step)                          # once per finished step; the summary after the window's last

From the trace's kernel, copy and set events: GPU busy is their union over the wall time; compute busy the same
without NCCL's kernels (which also count while they spin waiting for a peer); host gaps are wall − busy;
communication is the union of NCCL kernels and exposed communication the part of it during which no other kernel
runs. Numbers are per step.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from utils.timing import on_gpu, sync

BUSY_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by [start, end) intervals."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def subtract_length(these: list[tuple[float, float]], others: list[tuple[float, float]]) -> float:
    """Length of the union of `these` not covered by the union of `others`."""
    return union_length(these + others) - union_length(others)


def analyse(trace: dict, wall_us: float, steps: int, top: int = 12) -> dict:
    """A Chrome trace → the step's busy, gap and communication numbers (ms per step) and its top kernels."""
    events = [e for e in trace.get("traceEvents", []) if e.get("cat") in BUSY_CATS and e.get("dur", 0) > 0]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in events if "nccl" in e["name"].lower()]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in events if "nccl" not in e["name"].lower()]
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e["name"], []).append(e["dur"])
    busy = union_length(spans)
    compute_busy = union_length(compute)
    kernels = sorted(((sum(d), len(d), n) for n, d in by_name.items()), reverse=True)[:top]
    return {"step_ms": wall_us / steps / 1e3, "busy": busy / wall_us if wall_us else 0.0,
            "compute_busy": compute_busy / wall_us if wall_us else 0.0,
            "gap_ms": (wall_us - busy) / steps / 1e3, "comm_ms": union_length(comm) / steps / 1e3,
            "exposed_comm_ms": subtract_length(comm, compute) / steps / 1e3,
            "top": [{"name": n, "ms_per_step": t / steps / 1e3, "calls_per_step": c / steps} for t, c, n in kernels]}


def markdown(summary: dict, title: str) -> str:
    """analyse()'s numbers as a short markdown report."""
    s = summary
    lines = [f"# {title}", "", "| ms / step | GPU busy | compute busy | host gaps ms | NCCL ms | exposed NCCL ms |",
             "|---|---|---|---|---|---|",
             f"| {s['step_ms']:.1f} | {s['busy']:.1%} | {s['compute_busy']:.1%} | {s['gap_ms']:.1f} | "
             f"{s['comm_ms']:.1f} | {s['exposed_comm_ms']:.1f} |", "", "Top kernels (ms per step, calls per step):", ""]
    lines += [f"- {k['ms_per_step']:.2f} ms ×{k['calls_per_step']:.0f} `{k['name'][:90]}`" for k in s["top"]] or [
        "- none: no device kernels in the window (a CPU run; its host events are in trace.json)"]
    return "\n".join(lines) + "\n"


class StepProfiler:
    """Profiles training steps first … first+count−1 (numbered from 1, as train.py counts them) with torch.profiler:
    it starts once step first−1 has finished and stops once the last profiled one has, synchronizing the device at
    both ends (a graph or a queue ahead of the host would otherwise put other steps' work in the window). Then it
    writes <out>/trace.json (Chrome trace: Perfetto or chrome://tracing), profile.json (analyse()'s numbers, the top
    25 kernels) and profile.md, and returns the numbers. `window`: "first:count" (train.profile), "" or None for
    none. `start`: the step the run starts after (a resumed run's); a window that does not begin after the run's
    first step (which compiles) is `skipped`."""

    def __init__(self, window: str | None, out: Path, start: int = 0) -> None:
        self.out = Path(out)
        span = tuple(map(int, window.split(":"))) if window else None
        self.skipped = span is not None and start >= span[0] - 1
        self.window = None if self.skipped else span
        self.prof: profile | None = None
        self.t0 = 0.0

    def _start(self) -> None:
        sync()
        # acc_events: one cycle either way; without it torch warns that a cycle's end clears the events
        self.prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu() else []),
                            acc_events=True)
        self.prof.start()
        self.t0 = time.perf_counter()

    def after_step(self, step: int) -> dict | None:
        if self.window is None:
            return None
        first, count = self.window
        if step == first - 1:
            self._start()
            return None
        if step != first + count - 1 or self.prof is None:
            return None
        sync()
        wall_us = (time.perf_counter() - self.t0) * 1e6
        self.prof.stop()
        self.out.mkdir(parents=True, exist_ok=True)
        trace = self.out / "trace.json"
        self.prof.export_chrome_trace(str(trace))
        self.prof = None
        summary = {"steps": [first, first + count - 1], **analyse(json.loads(trace.read_text()), wall_us, count, 25)}
        (self.out / "profile.json").write_text(json.dumps(summary, indent=1))
        (self.out / "profile.md").write_text(markdown(summary, f"Steps {first}–{first + count - 1}, profiled"))
        return summary
