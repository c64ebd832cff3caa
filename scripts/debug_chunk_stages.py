"""Localise a GPU-only chunk-backend error: every backward stage against a PyTorch reference, per
shape, dtype and num_warps. Prints max relative error per stage.

    python scripts/debug_chunk_stages.py
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ops.common.chunk_h import chunk_bwd_dh, chunk_fwd_h
from ops.common.chunk_intra import chunk_intra_bwd, chunk_intra_bwd_ref, chunk_intra_fwd
from ops.common.chunk_o import chunk_bwd_dA, chunk_bwd_dqkb, chunk_bwd_dv, chunk_fwd_o
from ops.common.cumsum import chunk_cumsum
from ops.gla.naive import gla


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    dev, C = "cuda", 64
    for (B, T, H, K, V) in [(2, 256, 2, 64, 256), (2, 256, 2, 256, 512)]:
        for dtype in (torch.bfloat16,):
            torch.manual_seed(0)
            q, k = (torch.randn(B, T, H, K, device=dev).to(dtype) for _ in range(2))
            v = torch.randn(B, T, H, V, device=dev).to(dtype)
            g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device=dev)) / 16
            do = torch.randn(B, T, H, V, device=dev).to(dtype)
            scale = K ** -0.5
            b = chunk_cumsum(g, C)
            h, _ = chunk_fwd_h(k, v, b, None, False, C)
            A = chunk_intra_fwd(q, k, b, scale, C)
            dh, _ = chunk_bwd_dh(q, do, b, None, False, scale, C)
            dA = chunk_bwd_dA(do, v, C)
            ref_in = [t.float().requires_grad_() for t in (q, k, v, g)]
            o_ref, _ = gla(*ref_in, scale=scale)
            dq_r, dk_r, dv_r, dg_r = torch.autograd.grad(o_ref, ref_in, do.float())
            o = chunk_fwd_o(q, v, b, h, A, scale, C)
            line = [f"B{B} T{T} H{H} K{K} V{V} {str(dtype)[6:]}: o {rel(o, o_ref):.1e}"]
            for nw, ns in ((4, 1), (4, 2), (4, 3), (8, 1)):
                dqi, dki = chunk_intra_bwd(q, k, b, dA, scale, C, num_warps=nw)
                dqi_r, dki_r = chunk_intra_bwd_ref(q, k, b, dA, scale, C)
                dv = chunk_bwd_dv(k, b, A, do, dh, C, num_warps=nw)
                dq, dk, db = chunk_bwd_dqkb(q, k, v, b, h, dh, do, dqi, dki, scale, C, num_warps=nw, num_stages=ns)
                dg = chunk_cumsum(db, C, reverse=True)
                line.append(f"| w{nw}s{ns}: intra dq {rel(dqi, dqi_r):.1e} dk {rel(dki, dki_r):.1e} dv {rel(dv, dv_r):.1e} "
                            f"dq {rel(dq, dq_r):.1e} dk {rel(dk, dk_r):.1e} dg {rel(dg, dg_r):.1e}")
            print(" ".join(line), flush=True)


if __name__ == "__main__":
    main()
