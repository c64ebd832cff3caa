"""The chunk backend stage by stage on the GPU: each stage's bf16 error against its `_ref`, then each
stage's time, to localise a GPU-only error or find where the time goes.

    python scripts/debug_chunk_stages.py                  # check, then time at the kernel benchmark's GLA shapes
    python scripts/debug_chunk_stages.py --check-only
    python scripts/debug_chunk_stages.py --sweep          # forward stages over num_warps x num_stages
The sub-block backward kernels of [F] (ops/common/fused_chunk.py: dv, and dq dk db) are checked and
timed beside the stages they replace, and the fused scan's forward and backward (fused_scan.py,
fused_scan_bwd.py) beside chunk's; scripts/sweep_fused_scan.py sweeps the scan's launches.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ops.chunkwise.state import chunk_bwd_dh, chunk_bwd_dh_ref, chunk_fwd_h, chunk_fwd_h_ref
from ops.chunkwise.intra import chunk_intra_bwd, chunk_intra_bwd_ref, chunk_intra_fwd, chunk_intra_fwd_ref
from ops.chunkwise.output import (chunk_bwd_dA, chunk_bwd_dA_ref, chunk_bwd_dqkb, chunk_bwd_dqkb_ref, chunk_bwd_dv,
                                chunk_bwd_dv_ref, chunk_fwd_o, chunk_fwd_o_ref)
from ops.chunkwise.cumsum import chunk_cumsum
from ops.gla.sub_block_bwd import fused_chunk_bwd_dqk, fused_chunk_bwd_dv
from ops.gla.scan import fused_scan_fwd
from ops.gla.scan_bwd import fused_scan_bwd

C = 64


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def run_stages(B, T, H, K, V, scalar=False, decay="model") -> dict:
    """bf16 inputs and every stage's output, once. decay "model": GLA's logsigmoid(·)/16 per key dim;
    "strong": uniform in [−3, 0) per step (scalar) or [−3/8, 0) per key dim."""
    torch.manual_seed(0)
    q, k = (torch.randn(B, T, H, K, device="cuda").bfloat16() for _ in range(2))
    v, do = (torch.randn(B, T, H, V, device="cuda").bfloat16() for _ in range(2))
    S = 1 if scalar else K
    g = (torch.nn.functional.logsigmoid(torch.randn(B, T, H, S, device="cuda")) / 16 if decay == "model"
         else -torch.rand(B, T, H, S, device="cuda") * 3 / (1 if scalar else 8))
    x = dict(q=q, k=k, v=v, g=g, do=do, scale=K ** -0.5)
    x["b"] = chunk_cumsum(g, C)
    x["h"] = chunk_fwd_h(k, v, x["b"], None, False, C)[0]
    x["A"] = chunk_intra_fwd(q, k, x["b"], x["scale"], C)
    x["dh"] = chunk_bwd_dh(q, do, x["b"], None, False, x["scale"], C)[0]
    x["dA"] = chunk_bwd_dA(do, v, C)
    x["dqi"], x["dki"] = chunk_intra_bwd(q, k, x["b"], x["dA"], x["scale"], C)
    x["dq"], x["dk"], x["db"] = chunk_bwd_dqkb(q, k, v, x["b"], x["h"], x["dh"], do, x["dqi"], x["dki"], x["scale"], C)
    return x


def check(B, T, H, K, V, scalar=False):
    """Every stage against its `_ref` on the same inputs (not stopping at the first failure)."""
    x = run_stages(B, T, H, K, V, scalar, decay="strong")
    q, k, v, b, do, h, A, dh, dA, s = (x[n] for n in ("q", "k", "v", "b", "do", "h", "A", "dh", "dA", "scale"))
    errs = {"h": rel(h, chunk_fwd_h_ref(k, v, b, None, C)[0]), "A": rel(A, chunk_intra_fwd_ref(q, k, b, s, C)),
            "o": rel(chunk_fwd_o(q, v, b, h, A, s, C), chunk_fwd_o_ref(q, v, b, h, A, s, C)),
            "dh": rel(dh, chunk_bwd_dh_ref(q, do, b, None, s, C)[0]), "dA": rel(dA, chunk_bwd_dA_ref(do, v, C)),
            "dv": rel(chunk_bwd_dv(k, b, A, do, dh, C), chunk_bwd_dv_ref(k, b, A, do, dh, C))}
    if not scalar:                                      # the [F] scan: o without A, h or b in HBM
        errs["fused scan o"] = rel(fused_scan_fwd(q, k, v, x["g"], s, None, False, C, False)[0],
                                   chunk_fwd_o_ref(q, v, b, h, A, s, C))
    ref = chunk_intra_bwd_ref(q, k, b, dA, s, C)
    errs["intra dq"], errs["intra dk"] = rel(x["dqi"], ref[0]), rel(x["dki"], ref[1])
    for name, y in zip(("dq", "dk", "db"), chunk_bwd_dqkb_ref(q, k, v, b, h, dh, do, x["dqi"], x["dki"], s, C)):
        errs[name] = rel(x[name], y)
    if not scalar:                                      # the fused backward: no A, no dA in HBM
        A32 = chunk_intra_fwd_ref(q, k, b, s, C)
        errs["fused dv"] = rel(fused_chunk_bwd_dv(q, k, b, do, dh, s, C), chunk_bwd_dv_ref(k, b, A32, do, dh, C))
        want = chunk_bwd_dqkb_ref(q, k, v, b, h, dh, do, *chunk_intra_bwd_ref(q, k, b, chunk_bwd_dA_ref(do, v, C), s, C), s, C)
        for name, got, y in zip(("fused dq", "fused dk", "fused db"), fused_chunk_bwd_dqk(q, k, v, b, h, do, dh, s, C), want):
            errs[name] = rel(got, y)
    print(f"B{B} T{T} H{H} K{K} V{V} {'scalar' if scalar else 'gk'} bf16: "
          + " ".join(f"{n} {e:.1e}" for n, e in errs.items()), flush=True)


def timings(B, T, H, K, V):
    from triton.testing import do_bench

    x = run_stages(B, T, H, K, V)
    q, k, v, g, b, do, h, A, dh, dA, s = (x[n] for n in ("q", "k", "v", "g", "b", "do", "h", "A", "dh", "dA", "scale"))
    stages = {
        "fwd cumsum": lambda: chunk_cumsum(g, C),
        "fwd h": lambda: chunk_fwd_h(k, v, b, None, False, C),
        "fwd intra A": lambda: chunk_intra_fwd(q, k, b, s, C),
        "fwd o": lambda: chunk_fwd_o(q, v, b, h, A, s, C),
        "(fwd fused scan)": lambda: fused_scan_fwd(q, k, v, g, s, None, False, C, True),
        "bwd dh": lambda: chunk_bwd_dh(q, do, b, None, False, s, C),
        "bwd dA": lambda: chunk_bwd_dA(do, v, C),
        "bwd dv": lambda: chunk_bwd_dv(k, b, A, do, dh, C),
        "bwd intra dq dk": lambda: chunk_intra_bwd(q, k, b, dA, s, C),
        "bwd dq dk db": lambda: chunk_bwd_dqkb(q, k, v, b, h, dh, do, x["dqi"], x["dki"], s, C),
        "bwd dg cumsum": lambda: chunk_cumsum(x["db"], C, reverse=True),
        "(bwd fused dv)": lambda: fused_chunk_bwd_dv(q, k, b, do, dh, s, C),
        "(bwd fused dq dk db)": lambda: fused_chunk_bwd_dqk(q, k, v, b, h, do, dh, s, C),
        "(bwd fused scan)": lambda: fused_scan_bwd(q, k, v, b, h, do, dh, s, C),
    }
    # the fused plan: the scan, the dh pass, the scan's backward, dg's cumsum
    fused_plan = {"(fwd fused scan)", "bwd dh", "(bwd fused scan)", "bwd dg cumsum"}
    print(f"B{B} T{T} H{H} K{K} V{V} (bf16), do_bench median ms:")
    total = {"fwd": 0.0, "bwd": 0.0}
    fused = {"fwd": 0.0, "bwd": 0.0}
    for name, fn in stages.items():
        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
        if not name.startswith("("):                    # (…): an alternative, not part of chunk's sums
            total[name[:3]] += ms
        if name in fused_plan:
            fused[name.strip("(")[:3]] += ms
        print(f"  {name:<20} {ms:.3f}")
    for label, t in (("chunk", total), ("fused", fused)):
        print(f"  {label}: sum fwd {t['fwd']:.3f}, sum bwd {t['bwd']:.3f}, fwd+bwd {t['fwd'] + t['bwd']:.3f}", flush=True)


def sweep(B, T, H, K, V):
    """Each forward stage over num_warps x num_stages, checked against its default launch."""
    from triton.testing import do_bench

    x = run_stages(B, T, H, K, V)
    q, k, v, b, h, A, s = (x[n] for n in ("q", "k", "v", "b", "h", "A", "scale"))
    stages = {"h": lambda **kw: chunk_fwd_h(k, v, b, None, False, C, **kw)[0],
              "intra A": lambda **kw: chunk_intra_fwd(q, k, b, s, C, **kw),
              "o": lambda **kw: chunk_fwd_o(q, v, b, h, A, s, C, **kw)}
    print(f"B{B} T{T} H{H} K{K} V{V} (bf16) forward stages, median ms by num_warps x num_stages:")
    for name, fn in stages.items():
        ref, row = fn(), []
        for nw in (2, 4, 8):
            for ns in (1, 2, 3):
                err = rel(fn(num_warps=nw, num_stages=ns), ref)
                ms = do_bench(lambda: fn(num_warps=nw, num_stages=ns), warmup=25, rep=100, return_mode="median")
                row.append(f"w{nw}s{ns} {ms:.3f}" + ("" if err < 1e-2 else f" (WRONG {err:.1e})"))
        print(f"  {name:<8} default {do_bench(fn, warmup=25, rep=100, return_mode='median'):.3f} | " + ", ".join(row),
              flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-only", action="store_true")
    p.add_argument("--sweep", action="store_true", help="only the forward launch-config sweep")
    args = p.parse_args()
    if args.sweep:
        for shape in [(8, 2048, 4, 256, 512), (16, 2048, 12, 64, 64)]:
            sweep(*shape)
        return
    for shape in [(2, 256, 2, 64, 128), (1, 70, 1, 20, 140), (2, 256, 2, 64, 256), (2, 256, 2, 256, 512)]:
        for scalar in (False, True):
            check(*shape, scalar=scalar)
    if not args.check_only:
        for shape in [(16, 2048, 12, 64, 64), (8, 2048, 4, 256, 512)]:
            timings(*shape)


if __name__ == "__main__":
    main()
