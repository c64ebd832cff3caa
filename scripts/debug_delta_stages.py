"""The gated delta rule's chunk backend stage by stage on the GPU: each stage's time at the kernel
benchmark's gated_delta shapes, beside fla's forward stages, to find where the time goes.

    python scripts/debug_delta_stages.py [--old-wy path/to/wy.py]   # --old-wy: also time an earlier wy_fwd
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from ops.chunkwise.intra import chunk_intra_bwd
from ops.chunkwise.output import chunk_bwd_dA, chunk_bwd_dqkb, chunk_fwd_o_scalar
from ops.chunkwise.cumsum import chunk_cumsum
from ops.gated_delta.delta_state import delta_h_bwd, delta_h_fwd
from ops.gated_delta.wy import wy_bwd, wy_fwd, wy_fwd_ref

C = 64


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def inputs(B, T, H, K, V):
    torch.manual_seed(0)
    q = torch.randn(B, T, H, K, device="cuda").bfloat16()
    k = F.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).bfloat16()
    v, do = (torch.randn(B, T, H, V, device="cuda").bfloat16() for _ in range(2))
    g = F.logsigmoid(torch.randn(B, T, H, device="cuda"))
    beta = torch.rand(B, T, H, device="cuda").bfloat16()
    return q, k, v, g, beta, do


def stages(B, T, H, K, V, old_wy=None) -> dict:
    q, k, v, g, beta, do = inputs(B, T, H, K, V)
    s = K ** -0.5
    b = chunk_cumsum(g.unsqueeze(-1), C)
    Ai, w, u = wy_fwd(k, v, b, beta, C)
    h, v_new, _ = delta_h_fwd(k, w, u, b, None, False, C)
    _, A = chunk_fwd_o_scalar(q, k, v_new, b, h, s, C)
    dA = chunk_bwd_dA(do, v_new, C)
    dqi, dki = chunk_intra_bwd(q, k, b, dA, s, C)
    dh, dv_new, _ = delta_h_bwd(q, k, w, b, A, do, None, False, s, C)
    dq, dk_o, db_o = chunk_bwd_dqkb(q, k, v_new, b, h, dh, do, dqi, dki, s, C)
    fns = {
        "fwd cumsum": lambda: chunk_cumsum(g.unsqueeze(-1), C),
        "fwd wy": lambda: wy_fwd(k, v, b, beta, C),
        "fwd h v_new": lambda: delta_h_fwd(k, w, u, b, None, False, C),
        "fwd o (and A)": lambda: chunk_fwd_o_scalar(q, k, v_new, b, h, s, C),
        "bwd dA": lambda: chunk_bwd_dA(do, v_new, C),
        "bwd intra dq dk": lambda: chunk_intra_bwd(q, k, b, dA, s, C),
        "bwd dh dv_new": lambda: delta_h_bwd(q, k, w, b, A, do, None, False, s, C),
        "bwd dq dk db": lambda: chunk_bwd_dqkb(q, k, v_new, b, h, dh, do, dqi, dki, s, C),
        "bwd wy": lambda: wy_bwd(k, v, b, beta, Ai, h, dv_new, dk_o, C),
        "bwd dg cumsum": lambda: chunk_cumsum(db_o, C, reverse=True),
    }
    if old_wy is not None:
        fns["(old fwd wy)"] = lambda: old_wy.wy_fwd(k, v, b, beta, C)
        errs = [rel(x, y) for x, y in zip(old_wy.wy_fwd(k, v, b, beta, C), (Ai, w, u))]
        print("  new vs old wy_fwd (Tm w u): " + " ".join(f"{e:.1e}" for e in errs))
    errs = [rel(x, y) for x, y in zip((Ai, w, u), wy_fwd_ref(k, v, b, beta, C))]
    print(f"B{B} T{T} H{H} K{K} V{V} bf16 wy_fwd vs fp64 ref (Tm w u): " + " ".join(f"{e:.1e}" for e in errs))
    for nw in (1, 2, 4, 8):
        errs = [rel(x, y) for x, y in zip(wy_fwd(k, v, b, beta, C, num_warps=nw), (Ai, w, u))]
        print(f"  wy_fwd num_warps={nw} vs default (Tm w u): " + " ".join(f"{e:.1e}" for e in errs))
        fns[f"(fwd wy, {nw} warps)"] = lambda nw=nw: wy_fwd(k, v, b, beta, C, num_warps=nw)
    o_ref, _ = chunk_fwd_o_scalar(q, k, v_new, b, h, s, C)
    for nw in (2, 4, 8):
        for ns in (1, 2, 3):
            o_l, _ = chunk_fwd_o_scalar(q, k, v_new, b, h, s, C, num_warps=nw, num_stages=ns)
            print(f"  fwd o num_warps={nw} num_stages={ns} vs default: {rel(o_l, o_ref):.1e}")
            fns[f"(fwd o, {nw}w {ns}s)"] = lambda nw=nw, ns=ns: chunk_fwd_o_scalar(q, k, v_new, b, h, s, C, num_warps=nw,
                                                                                     num_stages=ns)
    ref = wy_bwd(k, v, b, beta, Ai, h, dv_new, dk_o, C)
    for nw in (2, 8):
        errs = [rel(x, y) for x, y in zip(wy_bwd(k, v, b, beta, Ai, h, dv_new, dk_o, C, num_warps=nw), ref)]
        print(f"  wy_bwd num_warps={nw} vs default (dk dv dbeta db): " + " ".join(f"{e:.1e}" for e in errs))
        fns[f"(bwd wy, {nw} warps)"] = lambda nw=nw: wy_bwd(k, v, b, beta, Ai, h, dv_new, dk_o, C, num_warps=nw)
    try:
        fns.update(fla_stages(q, k, v, g, beta, s))
    except Exception as e:  # fla's internal API is not stable: its stages are context, not the check
        print(f"  (fla stages unavailable: {type(e).__name__}: {e})")
    return fns


def fla_stages(q, k, v, g, beta, s) -> dict:
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.chunkwise.output import chunk_fwd_o as fla_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    gc = chunk_local_cumsum(g, chunk_size=C, scale=RCP_LN2)
    w, u, _ = chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=gc, beta=beta, chunk_size=C)
    h, v_new, _ = chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=gc, initial_state=None, output_final_state=False,
                                               chunk_size=C)
    return {"fla fwd cumsum": lambda: chunk_local_cumsum(g, chunk_size=C, scale=RCP_LN2),
            "fla fwd kkt+solve+wy": lambda: chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=gc, beta=beta, chunk_size=C),
            "fla fwd h v_new": lambda: chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=gc, initial_state=None,
                                                                    output_final_state=False, chunk_size=C),
            "fla fwd o": lambda: fla_o(q=q, k=k, v=v_new, h=h, g=gc, scale=s, chunk_size=C)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old-wy", type=Path, help="a wy.py to time beside the current one")
    args = p.parse_args()
    old = None
    if args.old_wy:
        spec = importlib.util.spec_from_file_location("wy_old", args.old_wy)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    for shape in [(16, 2048, 16, 64, 64), (8, 2048, 8, 128, 128)]:
        fns = stages(*shape, old_wy=old)
        print(f"B{shape[0]} T{shape[1]} H{shape[2]} K{shape[3]} V{shape[4]} (bf16), do_bench median ms:")
        total = {}
        for name, fn in fns.items():
            ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
            if not name.startswith("("):
                key = " ".join(name.split()[:2 if name.startswith("fla") else 1])
                total[key] = total.get(key, 0.0) + ms
            print(f"  {name:<22} {ms:.3f}", flush=True)
        print("  sums: " + ", ".join(f"{n} {t:.3f}" for n, t in total.items()), flush=True)


if __name__ == "__main__":
    main()
