"""Launch sweep of the fused GLA kernels (ops/common/fused_scan.py, fused_scan_bwd.py) beside the `chunk`
stages they replace, on the GPU: every configuration is checked against the default launch's output
first (a miscompiled configuration shows as FAIL, not as a time), then timed with do_bench.

    python scripts/sweep_fused_scan.py [--shapes mve,gla340m_layer] [--out DIR]

Prints one table per shape (ms, median) and writes it to DIR/sweep_fused_scan.md.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from triton.testing import do_bench

from ops.chunkwise.state import chunk_bwd_dh, chunk_fwd_h
from ops.chunkwise.intra import chunk_intra_bwd, chunk_intra_fwd
from ops.chunkwise.output import chunk_bwd_dA, chunk_bwd_dqkb, chunk_bwd_dv, chunk_fwd_o
from ops.chunkwise.cumsum import chunk_cumsum
from ops.gla.scan import fused_scan_fwd
from ops.gla.movement import kernel_tiles
from ops.gla.scan_bwd import fused_scan_bwd

# the seeds' MVE; issue [F]'s "GLA-340M layer"; configs/gla_340m.yaml's own layer (K = 128, V = 256)
SHAPES = {"mve": (16, 2048, 12, 64, 64), "gla340m_layer": (8, 2048, 4, 256, 512),
          "gla340m_model": (8, 2048, 4, 128, 256)}


def inputs(B, T, H, K, V):
    torch.manual_seed(0)
    q, k = (torch.randn(B, T, H, K, device="cuda").bfloat16() for _ in range(2))
    v, do = (torch.randn(B, T, H, V, device="cuda").bfloat16() for _ in range(2))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device="cuda")) / 16
    return q, k, v, g, do


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def errors(q, k, v, g, do) -> list[str]:
    """Relative error of o and every gradient, `chunk` and `fused` against naive in fp32 on the same inputs."""
    from ops import get_op

    def run(backend, dtype):
        x = [t.detach().to(dtype if i < 3 else torch.float32).requires_grad_() for i, t in enumerate((q, k, v, g))]
        o, _ = get_op("gla", backend)(*x)
        (o.float() * do.float()).sum().backward()
        return [o] + [t.grad for t in x]

    ref = run("naive", torch.float32)
    rows = ["| backend | o | dq | dk | dv | dg |", "|---|---|---|---|---|---|"]
    for backend in ("chunk", "fused"):
        errs = [f"{rel(x, y):.1e}" for x, y in zip(run(backend, q.dtype), ref)]
        rows.append(f"| {backend} | " + " | ".join(errs) + " |")
    return rows + [""]


def sweep(name: str, C: int = 64) -> list[str]:
    B, T, H, K, V = SHAPES[name]
    q, k, v, g, do = inputs(B, T, H, K, V)
    s = K ** -0.5
    rows = [f"### {name}: B{B} T{T} H{H} K{K} V{V} C{C}; model's forward tiles {kernel_tiles(B, T, H, K, V, C, 2)}", ""]
    rows += errors(q, k, v, g, do) + ["| kernel | launch | ms | vs default |", "|---|---|---|---|"]
    print("\n".join(rows), flush=True)

    def chunk_fwd():
        b = chunk_cumsum(g, C)
        h, _ = chunk_fwd_h(k, v, b, None, False, C)
        return chunk_fwd_o(q, v, b, h, chunk_intra_fwd(q, k, b, s, C), s, C)

    o_ref, _, b, h = fused_scan_fwd(q, k, v, g, s, None, False, C, True)
    dh, _ = chunk_bwd_dh(q, do, b, None, False, s, C)
    A = chunk_intra_fwd(q, k, b, s, C)

    def chunk_bwd():
        dA = chunk_bwd_dA(do, v, C)
        dv = chunk_bwd_dv(k, b, A, do, dh, C)
        dqi, dki = chunk_intra_bwd(q, k, b, dA, s, C)
        return chunk_bwd_dqkb(q, k, v, b, h, dh, do, dqi, dki, s, C), dv

    rows.append(f"| chunk fwd (cumsum, h, A, o) | | {do_bench(chunk_fwd):.3f} | |")
    rows.append(f"| chunk bwd (dA, dv, intra, dqkb; no dh) | | {do_bench(chunk_bwd):.3f} | |")
    rows.append(f"| dh pass (both) | | {do_bench(lambda: chunk_bwd_dh(q, do, b, None, False, s, C)):.3f} | |")
    rows.append(f"| reverse cumsum of db (both) | | {do_bench(lambda: chunk_cumsum(b, C, reverse=True)):.3f} | |")
    print("\n".join(rows[-4:]), flush=True)
    ref_b = fused_scan_bwd(q, k, v, b, h, do, dh, s, C)
    torch.cuda.synchronize()

    wide = K > 64
    variants = {
        "fwd scan": (lambda **kw: fused_scan_fwd(q, k, v, g, s, None, False, C, True, **kw)[0], o_ref,
                     [dict(BV=bv, num_warps=w) for bv in ((64, 128) if wide else (64,)) for w in (4, 8)]),  # MIN_BV
        "bwd": (lambda **kw: fused_scan_bwd(q, k, v, b, h, do, dh, s, C, **kw), ref_b,
                # BK 64 with BV 32 at K = 128 hit an illegal memory access (call 4): not swept, it ends the process
                [dict(BK=bk, BV=bv, num_warps=w, num_stages=st) for bk in ((32, 64) if wide else (64,))
                 for bv in ((64,) if wide else (32, 64)) for w in (4, 8) for st in (1, 2)]),
    }
    for kind, (fn, ref, launches) in variants.items():
        base = do_bench(lambda: fn())
        rows.append(f"| fused {kind} | default | {base:.3f} | 1.00 |")
        print(rows[-1], flush=True)
        for launch in launches:
            try:
                out = fn(**launch)
                torch.cuda.synchronize()
                errs = [rel(x, y) for x, y in zip(out if kind == "bwd" else [out], ref if kind == "bwd" else [ref])]
                if max(errs) > 1e-2:
                    rows.append(f"| fused {kind} | {launch} | FAIL (rel {max(errs):.1e}) | |")
                    continue
                t = do_bench(lambda: fn(**launch))
                rows.append(f"| fused {kind} | {launch} | {t:.3f} | {base / t:.2f} |")
            except Exception as e:                                   # out of resources: report, go on
                rows.append(f"| fused {kind} | {launch} | {type(e).__name__} | |")
            print(rows[-1], flush=True)
    return rows + [""]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="mve,gla340m_model,gla340m_layer")
    p.add_argument("--one", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default=".")
    args = p.parse_args()
    if args.one:                      # one shape per process: an illegal memory access ends only its own
        sweep(args.one)
        return
    lines = [f"# fused_scan launch sweep, {torch.cuda.get_device_name()}", ""]
    for name in args.shapes.split(","):
        run = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True)
        out = [line for line in run.stdout.splitlines() if line.startswith(("|", "#"))]
        if run.returncode:
            out.append(f"(process ended with {run.returncode}: {run.stderr.strip().splitlines()[-1:]})")
        print("\n".join(out), flush=True)
        lines += out + [""]
    Path(args.out, "sweep_fused_scan.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
