"""The WMMA attention kernel (issue [J]) beside torch SDPA, in one process: the small shape it targets
(B1 H8 S512 D64 fp16) and GPT-2's B8 H12 S2048 D64, causal and not.

    python scripts/bench_wmma.py

Each variant's output is checked against SDPA's default first (max and mean absolute error). Times are
do_bench medians: `eager` is what a caller sees (Python and launch included), `graph` replays a CUDA
graph of the call, the device time alone. The compiler's report (registers, spills, shared memory,
occupancy) heads the table. `wmma split=S` pins the kernel's key split (S groups of 4 warps per block);
`wmma (ours)` is the op as the model calls it, with plan_split's choice. `launch floor` times a kernel that
writes one element: what a single launch costs under the same timer. Writes
bench/results/<date>-<device>-wmma.{md,json,png}.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

SHAPES = [(1, 8, 512), (8, 12, 2048)]     # (B, H, S), D = 64


def variants():
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ops.attention import fused

    def sdpa(backend=None):
        def run(q, k, v, causal):
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    def wmma(split=None):         # the op takes [B, T, H, D]; SDPA's layout is [B, H, T, D]
        def run(q, k, v, causal):
            return fused.attention(q, k, v, causal) if split is None else fused.wmma_attention(q, k, v, causal, None, split)
        return run

    one = torch.empty(1, device="cuda")

    def floor(q, k, v, causal):
        return one.fill_(1.0)

    splits = {f"wmma split={s}": (wmma(s), "bthd") for s in fused.SPLITS}
    return {"wmma (ours)": (wmma(), "bthd"), **splits, "sdpa": (sdpa(), "bhtd"), "sdpa flash": (sdpa(SDPBackend.FLASH_ATTENTION), "bhtd"),
            "sdpa cudnn": (sdpa(SDPBackend.CUDNN_ATTENTION), "bhtd"),
            "sdpa efficient": (sdpa(SDPBackend.EFFICIENT_ATTENTION), "bhtd"), "launch floor": (floor, "bthd")}


def run_shape(B, H, S, causal) -> list[dict]:
    from triton.testing import do_bench, do_bench_cudagraph

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, S, H, 64, device="cuda", generator=g).half() for _ in range(3))
    layouts = {"bthd": (q, k, v), "bhtd": tuple(x.transpose(1, 2).contiguous() for x in (q, k, v))}
    rows, ref = [], None
    with torch.no_grad():
        for name, (fn, layout) in variants().items():
            row = {"B": B, "H": H, "S": S, "causal": causal, "variant": name}
            args = layouts[layout]
            try:
                out = fn(*args, causal)
                out = out if layout == "bthd" else out.transpose(1, 2)
                if ref is None and name == "sdpa":
                    ref = out.float()
                if name != "launch floor":
                    row["out"] = out.float()
                row["eager_us"] = 1e3 * do_bench(lambda: fn(*args, causal), warmup=25, rep=100, return_mode="median")
                row["graph_us"] = 1e3 * do_bench_cudagraph(lambda: fn(*args, causal), rep=100, return_mode="median")
                row["status"] = "ok"
            except Exception as e:      # an SDPA backend that does not support the shape says so
                row["status"] = f"{type(e).__name__}: {str(e)[:60]}"
            rows.append(row)
    for row in rows:
        out = row.pop("out", None)
        if out is not None and ref is not None:
            err = (out - ref).abs()
            row["max_abs"], row["mean_abs"] = err.max().item(), err.mean().item()
            row["finite"] = bool(torch.isfinite(out).all())
        print({k: v for k, v in row.items()}, flush=True)
    return rows


def to_markdown(rows, env, info, plan, command) -> str:
    lines = [f"# WMMA attention beside SDPA — {env['date']}, {env['device']}", "", f"Command: `{command}`  ",
             f"torch {env['torch']}; fp16, D = 64; do_bench medians in µs (eager: the call as a user makes it; "
             "graph: CUDA-graph replay, device time only); errors against SDPA's default backend.", "",
             "Compiler and occupancy of each wmma variant (nvcc -Xptxas -v, cudaOccupancy…):", "",
             *(f"- {'causal' if c else 'non-causal'}, split={s}: {i['registers']} registers/thread, {i['spill_bytes']} B "
               f"spilled, {i['smem_bytes']} B shared memory/block, {i['blocks_per_sm']} blocks ({i['warps_per_sm']} "
               f"warps)/SM" for (c, s), i in info.items()), "",
             "Split chosen by plan_split: " + ", ".join(f"B{B} H{H} S{S}: {plan[(B, H, S)]}" for B, H, S in SHAPES), "",
             "| B | H | S | causal | variant | eager µs | graph µs | ÷ sdpa (eager) | max abs err | mean abs err | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = next((x for x in rows if x["variant"] == "sdpa" and (x["B"], x["S"], x["causal"]) == (r["B"], r["S"], r["causal"])), {})
        ok = r["status"] == "ok"
        ratio = f"{r['eager_us'] / base['eager_us']:.2f}" if ok and base.get("status") == "ok" else ""
        f = (lambda k, fmt: format(r[k], fmt) if k in r else "")
        lines.append(f"| {r['B']} | {r['H']} | {r['S']} | {r['causal']} | {r['variant']} | {f('eager_us', '.1f')} | "
                     f"{f('graph_us', '.1f')} | {ratio} | {f('max_abs', '.1e')} | {f('mean_abs', '.1e')} | {r['status']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    from ops.attention import fused
    from scripts.bench_kernels import environment

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_wmma.py times CUDA kernels; run it on a GPU")
    env = environment()
    command = "python scripts/bench_wmma.py " + " ".join(argv if argv is not None else sys.argv[1:])
    info = {(c, s): fused.kernel_info(c, s) for c in (True, False) for s in fused.SPLITS}
    plan = {(B, H, S): fused.plan_split(B, H, S, True) for B, H, S in SHAPES}
    rows = [r for B, H, S in SHAPES for c in (False, True) for r in run_shape(B, H, S, c)]
    stem = Path(args.out) / f"{env['date']}-{env['device'].replace(' ', '_')}-wmma"
    stem.parent.mkdir(parents=True, exist_ok=True)
    md = to_markdown(rows, env, info, plan, command)
    stem.with_suffix(".md").write_text(md)
    stem.with_suffix(".json").write_text(json.dumps({"env": env, "kernel_info": {str(k): v for k, v in info.items()},
                                                     "plan": {str(k): v for k, v in plan.items()},
                                                     "rows": rows}, indent=1))
    plot(rows, stem.with_suffix(".png"))
    print(md)
    return rows


def plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    labels = sorted({(r["B"], r["H"], r["S"], r["causal"]) for r in ok})
    names = list(dict.fromkeys(r["variant"] for r in ok))
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        ys = [next((r["eager_us"] for r in ok if r["variant"] == name and (r["B"], r["H"], r["S"], r["causal"]) == lab), 0)
              for lab in labels]
        ax.bar([x + i * width for x in range(len(labels))], ys, width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))],
                  [f"B{b} H{h} S{s} {'causal' if c else 'full'}" for b, h, s, c in labels])
    ax.set_yscale("log")
    ax.set_ylabel("µs (eager median)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
