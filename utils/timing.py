"""The one timing helper every benchmark uses.

    ms = bench_ms(fn)                        # median of fn() in ms: triton.testing.do_bench on a GPU
    ms = graph_ms(fn)                        # the same call replayed as a CUDA graph: device time alone
    s = step_seconds(step, steps=10)         # wall seconds per whole step between two synchronizations
    prof = profile_steps(step); device_ms(prof, 5); kernel_table(prof)   # torch.profiler's per-kernel times
    mb = peak_mb(fn)                         # peak memory fn() allocates above what was allocated before
    clock = IntervalClock(device); m = clock.mark(); ...; s = clock.seconds(m)   # train.py's log intervals
    values = HostCopy(t); ...; values.tolist()       # a step's numbers read later without waiting for later work

On a GPU, bench_ms is `do_bench(fn, warmup, rep, grad_to_none, return_mode="median")`: warm-up and repeats
are given in ms of running time, and do_bench flushes the L2 cache before each call. Without a GPU (CI, the
Triton interpreter) it takes the median of time.perf_counter over the same budget (one call where one call
exceeds it): the numbers mean nothing there, but every code path of a benchmark runs.

A step that calls .backward() accumulates into the leaves' .grad; reset_grads (or bench_ms's grad_to_none)
sets them to None between steps, as zero_grad(set_to_none=True) does, so that no accumulation kernel is
timed. Steps built on torch.autograd.grad need no reset.
"""
from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterable

import torch

CPU_MAX_CALLS = 1000     # bounds the CPU timer's call count when one call is far below the budget


def on_gpu() -> bool:
    return torch.cuda.is_available()


def sync() -> None:
    """Wait for the GPU's queued work (nothing to wait for on the CPU)."""
    if on_gpu():
        torch.cuda.synchronize()


def reset_grads(tensors: Iterable[torch.Tensor] | torch.nn.Module | None) -> None:
    """Set .grad to None on every tensor (or every parameter of a module)."""
    if tensors is None:
        return
    for t in tensors.parameters() if isinstance(tensors, torch.nn.Module) else tensors:
        t.grad = None


def bench_ms(fn: Callable[[], object], warmup: float = 25, rep: float = 100,
             grad_to_none: Iterable[torch.Tensor] | None = None) -> float:
    """Median ms of fn(): warm-up for `warmup` ms of calls, then `rep` ms of timed calls (do_bench's protocol).
    grad_to_none: tensors whose .grad is reset before each call."""
    grad_to_none = list(grad_to_none) if grad_to_none is not None else None
    if on_gpu():
        from triton.testing import do_bench

        return do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="median")

    def call() -> float:
        reset_grads(grad_to_none)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    estimate = max(call(), 1e-6)
    if estimate >= warmup + rep:             # one call already fills the budget (the interpreter's kernels)
        return estimate
    for _ in range(min(int(warmup / estimate), CPU_MAX_CALLS)):
        call()
    return statistics.median(call() for _ in range(max(1, min(int(rep / estimate), CPU_MAX_CALLS))))


def graph_ms(fn: Callable[[], object], rep: float = 100) -> float | None:
    """Median ms of fn() replayed as a CUDA graph: the device's time without the host's launch gaps (None
    without a GPU). As triton.testing.do_bench_cudagraph: a warm-up call, an estimate from 5 calls, then one
    graph of the calls that fill `rep` ms, replayed 10 times. Warm-up and capture run on a fresh stream of their
    own, so that a capture that fails (raising RuntimeError) leaves no later capture broken, as a failure on
    torch's shared capture stream does."""
    if not on_gpu():
        return None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        fn()
        start.record()
        for _ in range(5):
            fn()
        end.record()
        end.synchronize()
        n = max(1, int(rep / max(start.elapsed_time(end) / 5, 1e-3)))
        graph = torch.cuda.CUDAGraph()
        gc.disable()                             # no collection (and no frees) in the middle of the capture
        try:
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(n):
                    fn()
        finally:
            gc.enable()
        times = []
        for _ in range(10):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / n)
    torch.cuda.current_stream().wait_stream(stream)
    return statistics.median(times)


def step_seconds(step: Callable[[], object], steps: int, warmup: int = 0) -> float:
    """Wall seconds per step: `warmup` untimed steps, then `steps` steps between two synchronizations (for whole
    training steps, whose host work is part of what is measured)."""
    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) / max(steps, 1)


def profile_steps(step: Callable[[], object], steps: int = 5, warmup: int = 3) -> torch.profiler.profile:
    """torch.profiler over `steps` calls of step() after `warmup` untimed ones: CUDA kernels on a GPU, CPU
    operators without one (pass steps=1, warmup=0 there: the interpreter's numbers mean nothing, see bench_ms)."""
    for _ in range(warmup):
        step()
    sync()
    activity = torch.profiler.ProfilerActivity.CUDA if on_gpu() else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        for _ in range(steps):
            step()
        sync()
    return prof


def device_ms(prof: torch.profiler.profile, steps: int) -> float:
    """Summed self time per step in ms of every event profile_steps recorded: the kernels' device time on a GPU
    (what the wall time holds besides launch gaps), the operators' CPU time without one."""
    attr = "self_device_time_total" if on_gpu() else "self_cpu_time_total"
    return sum(getattr(e, attr) for e in prof.key_averages()) / steps / 1e3


def kernel_table(prof: torch.profiler.profile, rows: int = 15) -> str:
    """torch.profiler's table of the most expensive kernels (operators without a GPU)."""
    key = "cuda_time_total" if on_gpu() else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=70)


def peak_mb(fn: Callable[[], object]) -> float | None:
    """Peak memory in MB that fn() allocates above what was allocated before it (its inputs are not counted);
    None without a GPU, where the caching allocator's statistics do not exist (fn is not called there)."""
    if not on_gpu():
        return None
    sync()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    sync()
    return (torch.cuda.max_memory_allocated() - base) / 1e6


class IntervalClock:
    """Seconds between consecutive marks, for a training loop's log rows. On a GPU a mark is a CUDA event recorded
    in the stream, so the host need not wait at a mark: `seconds(mark)` waits only until the GPU has reached it (the
    loop reads it once the next step is queued, so the GPU never idles for the read). On a CPU a mark is the wall
    clock. Each `seconds` measures from the previous mark read (the clock's creation for the first)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.last = self.mark()

    def mark(self) -> torch.cuda.Event | float:
        if not self.cuda:
            return time.time()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, mark: torch.cuda.Event | float) -> float:
        if self.cuda:
            mark.synchronize()
            s = self.last.elapsed_time(mark) / 1e3
        else:
            s = mark - self.last
        self.last = mark
        return s


class HostCopy:
    """A tensor's values copied to the host when made, read later. On a GPU the copy into pinned memory is queued on
    the current stream at once and an event recorded after it; `tolist()` waits for that event alone. A plain
    `.item()` or `.tolist()` queues its copy when called, behind all the work queued by then: a training loop that
    reads a step's loss once the next step is queued would wait for that whole next step, and the GPU would idle
    while the host launches the one after. On a CPU it holds the values."""

    def __init__(self, t: torch.Tensor) -> None:
        t = t.detach()
        self.event = None
        if t.device.type == "cuda":
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.host.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = t.clone()

    def tolist(self) -> list | float | int | bool:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()
