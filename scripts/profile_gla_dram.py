"""Measured DRAM traffic of the GLA op under Nsight Compute beside the data-movement model's count (issue [F]):
for each backend and shape, the forward (with the backward's stores) and the backward, every kernel of the
phase summed (ncu flushes the caches before each kernel, as the model assumes nothing stays in L2).

    python scripts/profile_gla_dram.py [--backends chunk,fused] [--shapes mve,gla340m_layer] [--out DIR]

needs `ncu` on PATH; each phase runs in its own `ncu --profile-from-start off` process, which profiles only
the launches between cudaProfilerStart and Stop, after two warm-up steps.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHAPES = {"mve": (16, 2048, 12, 64, 64), "gla340m_layer": (8, 2048, 4, 256, 512)}
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")


def run_phase(backend: str, shape: str, phase: str) -> None:
    """The profiled process: inputs as bench_kernels makes them, two warm-up steps, then one phase."""
    import torch

    from ops import get_op

    B, T, H, K, V = SHAPES[shape]
    torch.manual_seed(0)
    q, k = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    v = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16).requires_grad_()
    gk = (torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device="cuda")) / 16).requires_grad_()
    op, do = get_op("gla", backend), torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        op(q, k, v, gk)[0].backward(do)
    for x in (q, k, v, gk):
        x.grad = None             # else autograd adds into .grad: 0.75 GB of elementwise traffic at MVE, not the op's
    torch.cuda.synchronize()
    cudart = torch.cuda.cudart()
    if phase == "fwd":
        cudart.cudaProfilerStart()
        o, _ = op(q, k, v, gk)
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()
    else:
        o, _ = op(q, k, v, gk)
        torch.cuda.synchronize()
        cudart.cudaProfilerStart()
        o.backward(do)
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()


def measure(backend: str, shape: str, phase: str) -> dict:
    cmd = ["ncu", "--profile-from-start", "off", "--metrics", ",".join(METRICS), "--csv", "--print-units", "base",
           sys.executable, __file__, "--run", backend, shape, phase]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    rows = [r for r in csv.DictReader(io.StringIO(out.stdout[out.stdout.find('"ID"'):])) if r.get("Metric Name")]
    if not rows:
        raise SystemExit(f"ncu returned no metrics for {backend} {shape} {phase}:\n"
                         f"{out.stdout[-2000:]}{out.stderr[-2000:]}")
    total = {m: sum(float(r["Metric Value"].replace(",", "")) for r in rows if r["Metric Name"] == m) for m in METRICS}
    kernels = sorted({r["Kernel Name"].split("(")[0] for r in rows})
    return {"read_MB": total[METRICS[0]] / 1e6, "write_MB": total[METRICS[1]] / 1e6,
            "kernel_ms": total[METRICS[2]] / 1e6, "launches": len({r["ID"] for r in rows}), "kernels": kernels}


def model_mb(backend: str, shape: str, phase: str) -> float:
    """The data-movement model's bytes for what the op runs there (ops/common/movement.py)."""
    from ops.gla.movement import (Shape, chunk_bwd_plan, chunk_plan, fused_bwd_plan, fused_plan, kernel_tiles,
                                     scan_pays, H100)

    B, T, H, K, V = SHAPES[shape]
    s = Shape(B, T, H, K, V)
    if phase == "bwd":
        return (fused_bwd_plan(s) if backend == "fused" else chunk_bwd_plan(s)).total_bytes / 1e6
    if backend == "fused" and scan_pays(B, T, H, K, V, 64, 2):
        return fused_plan(s, kernel_tiles(B, T, H, K, V, 64, 2), H100).total_bytes / 1e6
    return chunk_plan(s).total_bytes / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", nargs=3, metavar=("BACKEND", "SHAPE", "PHASE"), help=argparse.SUPPRESS)
    p.add_argument("--backends", default="chunk,fused")
    p.add_argument("--shapes", default="mve,gla340m_layer")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = p.parse_args()
    if args.run:
        return run_phase(*args.run)
    if shutil.which("ncu") is None:
        raise SystemExit("error: ncu (Nsight Compute) is not on PATH; this script measures DRAM bytes with it")
    rows = []
    print("| shape | backend | phase | launches | DRAM read MB | write MB | total MB | model MB | kernel ms |\n"
          "|---|---|---|---|---|---|---|---|---|", flush=True)
    for shape in args.shapes.split(","):
        for backend in args.backends.split(","):
            for phase in ("fwd", "bwd"):
                r = measure(backend, shape, phase) | {"shape": shape, "backend": backend, "phase": phase,
                                                       "model_MB": model_mb(backend, shape, phase)}
                rows.append(r)
                print(f"| {shape} | {backend} | {phase} | {r['launches']} | {r['read_MB']:.0f} | {r['write_MB']:.0f} | "
                      f"{r['read_MB'] + r['write_MB']:.0f} | {r['model_MB']:.0f} | {r['kernel_ms']:.3f} |", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gla-dram.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
