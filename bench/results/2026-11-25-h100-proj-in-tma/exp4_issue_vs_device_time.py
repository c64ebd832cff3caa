import os, sys, time
sys.path.insert(0, os.getcwd())
import torch
from scripts.bench_proj import make_inputs_in
from ops.proj_in import fused, naive

B, T, d, H, K, V, L = 8, 4096, 2048, 16, 128, 128, 16
inputs = make_inputs_in(B, T, d, H, K, V, L)
with torch.autocast("cuda", dtype=torch.bfloat16):
    dys = [torch.randn_like(y) for y in naive.proj_in(*[x.detach() for x in inputs], H, 16.0)]

def step(fn):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ys = fn(*inputs, H, 16.0)
    torch.autograd.backward(ys, dys)
    for x in inputs:
        x.grad = None

for name, fn in (("unfused", naive.proj_in), ("fused", fused.proj_in)):
    for _ in range(5):
        step(fn)
    torch.cuda.synchronize()
    # CPU time per step with the GPU kept busy (no syncs), then GPU time per step via events
    n = 20
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    e0.record()
    for _ in range(n):
        step(fn)
    e1.record()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"{name}: CPU issue {1e3 * (t1 - t0) / n:.3f} ms/step; GPU (events, back to back) {e0.elapsed_time(e1) / n:.3f} ms/step; wall {1e3 * (t2 - t0) / n:.3f}")
    # one step at a time, synced: the do_bench situation
    ts = []
    for _ in range(20):
        torch.cuda.synchronize()
        e0.record(); step(fn); e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    print(f"{name}: single synced step, median {ts[len(ts) // 2]:.3f} ms")
    # CPU profile of one step
    import cProfile, pstats, io
    pr = cProfile.Profile(); torch.cuda.synchronize(); pr.enable(); step(fn); pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12); print(s.getvalue()[-2500:])
