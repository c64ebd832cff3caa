"""Host time of proj_out's and proj_in's fused forward+backward at the 340M layer shapes: CPU time per step with the
GPU never waited on (20 steps back to back, one sync at the end), the GPU time of the same steps, and cProfile's
top functions of the fused output side."""
import cProfile
import pstats
import sys
import time
sys.path.insert(0, ".")
import torch  # noqa: E402
from ops.proj_out import fused, naive  # noqa: E402


def inputs_out(B=8, T=2048, H=4, V=256, d=1024):
    g = torch.Generator(device="cuda").manual_seed(0)
    o = torch.randn(B, T, H, V, device="cuda", generator=g).bfloat16().requires_grad_()
    r = torch.randn(B, T, H * V, device="cuda", generator=g).bfloat16().requires_grad_()
    nw = (1 + 0.3 * torch.randn(V, device="cuda", generator=g)).requires_grad_()
    w = (torch.randn(d, H * V, device="cuda", generator=g) / (H * V) ** 0.5).requires_grad_()
    res = torch.randn(B, T, d, device="cuda", generator=g).requires_grad_()
    return [o, r, nw, w, res], torch.randn(B, T, d, device="cuda", generator=g)


def stepper(fn, args, dy):
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = fn(*args)
        y.backward(dy)
        for x in args:
            x.grad = None
    return step


def issue_vs_gpu(step, n=20):
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    t1 = time.perf_counter()
    e1.record()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e3, e0.elapsed_time(e1) / n


args, dy = inputs_out()
for name, fn in (("unfused", naive.proj_out), ("fused", fused.proj_out)):
    cpu, gpu = issue_vs_gpu(stepper(fn, args, dy))
    print(f"out side GLA-340M {name}: CPU issue {cpu:.3f} ms/step, GPU (events, back to back) {gpu:.3f} ms/step")
step = stepper(fused.proj_out, args, dy)
pr = cProfile.Profile()
pr.enable()
for _ in range(50):
    step()
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
pstats.Stats(pr).sort_stats("cumulative").print_stats(30)
