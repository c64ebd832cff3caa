"""Which CPU op launches each CUDA kernel of Mamba-2's output side (fused and unfused), B8 T2048 d1024 d_inner2048."""
import sys
sys.path.insert(0, ".")
import torch  # noqa: E402
from scripts.bench_proj_families import mamba2_out_case  # noqa: E402

case = mamba2_out_case()
inputs = [x.requires_grad_() for x in case["inputs"]]
with torch.autocast("cuda", dtype=torch.bfloat16):
    y = case["variants"]["unfused"](*[x.detach() for x in inputs])
dy = torch.randn_like(y)
for label in ("fused", "unfused"):
    fn = case["variants"][label]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fn(*inputs)
        out.backward(dy)
        for x in inputs:
            x.grad = None
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                                record_shapes=True) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    print(f"== {label}: ops by self CUDA time over 3 steps")
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cuda_time_total", row_limit=22,
                                                               max_name_column_width=40, max_shapes_column_width=80))
    evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
    print(f"kernel sum per step: {sum(e.time_range.end - e.time_range.start for e in evs) / 3:.1f} µs")
