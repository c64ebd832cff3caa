"""The fused GLA op (issue [F]) at every chunk size beside fla's chunk_gla, side by side in one process.

    python scripts/bench_chunk_sizes.py [--shapes mve,gla340m_layer] [--sizes 32,64,128,256] [--out DIR]

Per shape: fla's fwd and fwd+bwd, then fused at each chunk size C: its output and every input gradient
against the fp32 naive oracle on the same bf16 inputs (relative error ≤ 5e-3, else FAIL and not timed), the
do_bench medians, and the memory the op holds between forward and backward (what autograd saved, the output
excluded) with the analytical size of the kept states h. Up to C = 128 every kernel works on the whole chunk;
at C = 256 on 64-row sub-blocks, keeping a quarter of C = 64's states and recomputing the rest in the backward
(ops/gla/fused.py SUB_BLOCK), whose recompute (chunk_h.chunk_fwd_h_from) is also timed alone.
Writes <date>-<device>-chunk-sizes.{md,json,png} under --out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from scripts.bench_kernels import CASES, _gla_make, enable_fla_backward_timing, environment, rel

SHAPES = {c.name: c.dims for c in CASES if c.op == "gla"}


def median_ms(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def timed(fn, args, do) -> tuple[float, float]:
    return median_ms(lambda: fn(*args)), median_ms(lambda: torch.autograd.grad(fn(*args)[0], args, do))


def held_bytes(fn, args) -> int:
    """Bytes allocated by a forward with autograd recording, less its output: what the backward keeps."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = fn(*args)[0]
    held = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
    del out
    return held


def run_shape(name: str, sizes: list[int]) -> list[dict]:
    from ops.chunkwise.state import chunk_fwd_h_from
    from ops.chunkwise.cumsum import chunk_cumsum
    from ops.gla.fla import gla as fla_gla
    from ops.gla.fused import fused_chunk_gla, sub_block
    from ops.gla.naive import gla as naive_gla

    d = SHAPES[name]
    args, _ = _gla_make(d, "cuda")
    do = torch.randn(*args[2].shape, device="cuda", generator=torch.Generator("cuda").manual_seed(1)).bfloat16()
    ref_in = [x.detach().float().requires_grad_() for x in args]
    ref_out = naive_gla(*ref_in)[0]
    ref = [ref_out.detach()] + list(torch.autograd.grad(ref_out, ref_in, do.float()))
    del ref_out, ref_in
    rows = []
    variants = [("fla", None, fla_gla)] + [("fused", C, lambda q, k, v, g, C=C: fused_chunk_gla(
        q, k, v, g, q.shape[-1] ** -0.5, None, False, C)) for C in sizes]
    for backend, C, fn in variants:
        row = {"shape": name, "dims": d, "backend": backend, "C": C}
        out = fn(*args)[0]
        errs = [rel(out, ref[0])] + [rel(g, r) for g, r in zip(torch.autograd.grad(out, args, do), ref[1:])]
        del out
        row["max_rel_err"] = max(errs)
        if backend == "fused" and not all(e <= 5e-3 for e in errs):
            rows.append({**row, "status": "FAIL", "errs": errs})
            continue
        row["fwd_ms"], row["fwdbwd_ms"] = timed(fn, args, do)
        row["held_MB"] = held_bytes(fn, args) / 1e6
        if C:
            B, T, H, K, V = (d[x] for x in "BTHKV")
            row["h_MB"] = B * -(-T // C) * H * K * V * 2 / 1e6
            if C > sub_block(C):
                b = chunk_cumsum(args[3].detach(), sub_block(C))
                kept = torch.randn(B, -(-T // C), H, K, V, device="cuda").bfloat16()
                row["recompute_ms"] = median_ms(lambda: chunk_fwd_h_from(args[1], args[2], b, kept, sub_block(C), C))
        row["status"] = "ok"
        rows.append(row)
        print(f"{name:<14} {backend:<5} C={C or '':<4} err {row['max_rel_err']:.1e}  fwd {row['fwd_ms']:.3f}  "
              f"fwd+bwd {row['fwdbwd_ms']:.3f} ms  held {row['held_MB']:.0f} MB"
              + (f"  recompute {row['recompute_ms']:.3f} ms" if "recompute_ms" in row else ""), flush=True)
    return rows


def to_markdown(rows: list[dict], env: dict, command: str, notes: list[str]) -> str:
    peer = {r["shape"]: r for r in rows if r["backend"] == "fla" and r["status"] == "ok"}
    lines = [f"# Fused GLA by chunk size beside fla — {env['date']}, {env['device']}", "",
             f"Command: `{command}`  ", f"torch {env['torch']}, triton {env['triton']}, fla {env['fla']}; bf16 "
             "inputs, fp32 states; do_bench medians; errors: max over o and every gradient, relative to fp32 naive.",
             ""] + [f"- {n}" for n in notes] + ["",
             "| shape | backend | C | max rel err | fwd ms | fwd+bwd ms | fla/this fwd | fla/this fwd+bwd | "
             "held for bwd, MB | kept h, MB | h recompute ms |", "|" + "---|" * 11]
    for r in rows:
        dims = " ".join(f"{k}{v}" for k, v in r["dims"].items())
        if r["status"] != "ok":
            lines.append(f"| {r['shape']} ({dims}) | {r['backend']} | {r['C']} | FAIL {r['errs']} |" + " |" * 7)
            continue
        p = peer.get(r["shape"])
        sp = (f"{p['fwd_ms'] / r['fwd_ms']:.2f}×", f"{p['fwdbwd_ms'] / r['fwdbwd_ms']:.2f}×") if p else ("", "")
        lines.append(f"| {r['shape']} ({dims}) | {r['backend']} | {r['C'] or ''} | {r['max_rel_err']:.1e} | "
                     f"{r['fwd_ms']:.3f} | {r['fwdbwd_ms']:.3f} | {sp[0]} | {sp[1]} | {r['held_MB']:.0f} | "
                     f"{r.get('h_MB', float('nan')):.0f} | {r.get('recompute_ms', float('nan')):.3f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    shapes = list(dict.fromkeys(r["shape"] for r in ok))
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.5), squeeze=False)
    for ax, s in zip(axes[0], shapes):
        rs = [r for r in ok if r["shape"] == s]
        labels = [r["backend"] if r["C"] is None else f"C={r['C']}" for r in rs]
        x = range(len(rs))
        ax.bar([i - 0.2 for i in x], [r["fwd_ms"] for r in rs], 0.4, label="fwd")
        ax.bar([i + 0.2 for i in x], [r["fwdbwd_ms"] for r in rs], 0.4, label="fwd+bwd")
        ax.set_xticks(list(x), labels)
        ax.set(ylabel="ms (median)", title=s)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="mve,gla340m_layer", help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--sizes", default="32,64,128,256", help="comma-separated chunk sizes")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("error: this benchmark times GPU kernels; run it on a CUDA machine")
    notes = [n for n in [enable_fla_backward_timing()] if n]
    env = environment()
    stem = Path(args.out) / f"{env['date']}-{env['device'].replace(' ', '_')}-chunk-sizes"
    stem.parent.mkdir(parents=True, exist_ok=True)
    command = ("python scripts/bench_chunk_sizes.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    rows = []
    for name in args.shapes.split(","):
        rows += run_shape(name, [int(c) for c in args.sizes.split(",")])
        torch.cuda.empty_cache()
        stem.with_suffix(".md").write_text(to_markdown(rows, env, command, notes))    # a cut-off run keeps these
        stem.with_suffix(".json").write_text(json.dumps({"env": env, "command": command, "rows": rows}, indent=1))
        plot(rows, stem.with_suffix(".png"))
    print(stem.with_suffix(".md").read_text())
    return rows


if __name__ == "__main__":
    main()
