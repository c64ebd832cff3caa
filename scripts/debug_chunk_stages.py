"""The chunk backend stage by stage on the GPU: each stage's bf16 error against its `_ref`, then each
stage's time, to localise a GPU-only error or find where the time goes.

    python scripts/debug_chunk_stages.py                  # check, then time at the kernel benchmark's GLA shapes
    python scripts/debug_chunk_stages.py --check-only
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ops.common.chunk_h import chunk_bwd_dh, chunk_bwd_dh_ref, chunk_fwd_h, chunk_fwd_h_ref
from ops.common.chunk_intra import chunk_intra_bwd, chunk_intra_bwd_ref, chunk_intra_fwd, chunk_intra_fwd_ref
from ops.common.chunk_o import (chunk_bwd_dA, chunk_bwd_dA_ref, chunk_bwd_dqkb, chunk_bwd_dqkb_ref, chunk_bwd_dv,
                                chunk_bwd_dv_ref, chunk_fwd_o, chunk_fwd_o_ref)
from ops.common.cumsum import chunk_cumsum

C = 64


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def inputs(B, T, H, K, V, dtype=torch.bfloat16):
    torch.manual_seed(0)
    q, k = (torch.randn(B, T, H, K, device="cuda").to(dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, device="cuda").to(dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device="cuda")) / 16
    do = torch.randn(B, T, H, V, device="cuda").to(dtype)
    return q, k, v, g, do


def check(B, T, H, K, V, scalar=False):
    """Every stage against its `_ref` on the same inputs (not stopping at the first failure)."""
    torch.manual_seed(0)
    q, k = (torch.randn(B, T, H, K, device="cuda").bfloat16() for _ in range(2))
    v, do = (torch.randn(B, T, H, V, device="cuda").bfloat16() for _ in range(2))
    g = -torch.rand(B, T, H, 1 if scalar else K, device="cuda") * 3 / (1 if scalar else 8)
    scale = K ** -0.5
    b = chunk_cumsum(g, C)
    h, _ = chunk_fwd_h(k, v, b, None, False, C)
    A = chunk_intra_fwd(q, k, b, scale, C)
    dh, _ = chunk_bwd_dh(q, do, b, None, False, scale, C)
    dA = chunk_bwd_dA(do, v, C)
    dqi, dki = chunk_intra_bwd(q, k, b, dA, scale, C)
    errs = {"h": rel(h, chunk_fwd_h_ref(k, v, b, None, C)[0]), "A": rel(A, chunk_intra_fwd_ref(q, k, b, scale, C)),
            "o": rel(chunk_fwd_o(q, v, b, h, A, scale, C), chunk_fwd_o_ref(q, v, b, h, A, scale, C)),
            "dh": rel(dh, chunk_bwd_dh_ref(q, do, b, None, scale, C)[0]), "dA": rel(dA, chunk_bwd_dA_ref(do, v, C)),
            "dv": rel(chunk_bwd_dv(k, b, A, do, dh, C), chunk_bwd_dv_ref(k, b, A, do, dh, C))}
    ref = chunk_intra_bwd_ref(q, k, b, dA, scale, C)
    errs["intra dq"], errs["intra dk"] = rel(dqi, ref[0]), rel(dki, ref[1])
    got = chunk_bwd_dqkb(q, k, v, b, h, dh, do, dqi, dki, scale, C)
    for name, x, y in zip(("dq", "dk", "db"), got, chunk_bwd_dqkb_ref(q, k, v, b, h, dh, do, dqi, dki, scale, C)):
        errs[name] = rel(x, y)
    print(f"B{B} T{T} H{H} K{K} V{V} {'scalar' if scalar else 'gk'} bf16: "
          + " ".join(f"{n} {e:.1e}" for n, e in errs.items()), flush=True)


def timings(B, T, H, K, V):
    from triton.testing import do_bench

    q, k, v, g, do = inputs(B, T, H, K, V)
    scale = K ** -0.5
    b = chunk_cumsum(g, C)
    h, _ = chunk_fwd_h(k, v, b, None, False, C)
    A = chunk_intra_fwd(q, k, b, scale, C)
    dh, _ = chunk_bwd_dh(q, do, b, None, False, scale, C)
    dA = chunk_bwd_dA(do, v, C)
    dqi, dki = chunk_intra_bwd(q, k, b, dA, scale, C)
    _, _, db = chunk_bwd_dqkb(q, k, v, b, h, dh, do, dqi, dki, scale, C)
    stages = {
        "fwd cumsum": lambda: chunk_cumsum(g, C),
        "fwd h": lambda: chunk_fwd_h(k, v, b, None, False, C),
        "fwd intra A": lambda: chunk_intra_fwd(q, k, b, scale, C),
        "fwd o": lambda: chunk_fwd_o(q, v, b, h, A, scale, C),
        "bwd dh": lambda: chunk_bwd_dh(q, do, b, None, False, scale, C),
        "bwd dA": lambda: chunk_bwd_dA(do, v, C),
        "bwd dv": lambda: chunk_bwd_dv(k, b, A, do, dh, C),
        "bwd intra dq dk": lambda: chunk_intra_bwd(q, k, b, dA, scale, C),
        "bwd dq dk db": lambda: chunk_bwd_dqkb(q, k, v, b, h, dh, do, dqi, dki, scale, C),
        "bwd dg cumsum": lambda: chunk_cumsum(db, C, reverse=True),
    }
    print(f"B{B} T{T} H{H} K{K} V{V} (bf16), do_bench median ms:")
    total = {"fwd": 0.0, "bwd": 0.0}
    for name, fn in stages.items():
        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
        total[name[:3]] += ms
        print(f"  {name:<16} {ms:.3f}")
    print(f"  sum fwd {total['fwd']:.3f}, sum bwd {total['bwd']:.3f}, fwd+bwd {total['fwd'] + total['bwd']:.3f}",
          flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-only", action="store_true")
    args = p.parse_args()
    for shape in [(2, 256, 2, 64, 128), (1, 70, 1, 20, 140), (2, 256, 2, 64, 256), (2, 256, 2, 256, 512)]:
        for scalar in (False, True):
            check(*shape, scalar=scalar)
    if not args.check_only:
        for shape in [(16, 2048, 12, 64, 64), (8, 2048, 4, 256, 512)]:
            timings(*shape)


if __name__ == "__main__":
    main()
