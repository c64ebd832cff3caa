"""Experiment (not yet measured): a block-row form of the intra-chunk score kernel, against the current
chunk_intra_fwd, for the ≤ 1.25× forward target at the GLA-340M layer shape ([C]).

    python scripts/exp_intra_fwd.py            # GPU: check both against the ref (fp32 and bf16), then time
    TRITON_INTERPRET=1 python scripts/exp_intra_fwd.py --check-only    # CPU, fp32

Why: at B16 T2048 H12 K=V=64 the current kernel takes 0.46 of the forward's 0.76 ms
(bench/results/2026-11-22-h100-chunk.md). Its grid is one program per 16×16 sub-block, 16 per chunk.
Six of them only write zeros. Each diagonal one runs 16 dependent row loads (one key row per
column), which makes it latency-bound. The candidate has one program per 16-row block row. It
loads q, k and b of its rows once, builds the diagonal block from a [16, 16, 16] broadcast per
16-wide key slice (no serial loads), and writes its zero blocks itself.
Prediction: the exp count is unchanged (the diagonal's 16·16·K per block dominates, ~0.1 ms of
MUFU time at the MVE shape), so this stage should drop from 0.46 to about 0.2 ms, and the forward
from 0.76 to about 0.5 ms (fla: 0.65 ms).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton
import triton.language as tl

from ops.chunkwise.intra import chunk_intra_fwd, chunk_intra_fwd_ref
from ops.triton_utils import load_rows, load_rows_t
from ops.chunkwise.cumsum import chunk_cumsum
from ops.triton_utils import dot_precision, tile


@triton.jit
def intra_fwd_rows_kernel(q, k, b, A, scale, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                          BK: tl.constexpr, BKD: tl.constexpr, PREC: tl.constexpr):
    """Per-key-dim decay. Program (chunk, block row I, batch·head) writes A[rows of I, all BT columns]."""
    i_t, i_i, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    r = i_t * BT + i_i * BC                                                    # first row of block I
    if r >= T:
        return
    o_c = tl.arange(0, BC)
    o_i = r + o_c
    m_i = o_i < T
    p_A = A + ((i_b * T + o_i[:, None]) * H + i_h) * BT + o_c[None, :]
    for i_j in range(0, i_i):                                                  # off-diagonal blocks J < I
        o_j = i_t * BT + i_j * BC + o_c
        m_j = o_j < T
        b_A = tl.zeros([BC, BC], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            b_q = load_rows(q, i_b, i_h, o_i, m_i, o_k, m_k, T, H, K).to(tl.float32)
            b_bi = load_rows(b, i_b, i_h, o_i, m_i, o_k, m_k, T, H, K)
            b_br = tl.load(b + ((i_b * T + r) * H + i_h) * K + o_k, mask=m_k, other=0.0)
            b_kt = load_rows_t(k, i_b, i_h, o_j, m_j, o_k, m_k, T, H, K).to(tl.float32)
            b_bjt = load_rows_t(b, i_b, i_h, o_j, m_j, o_k, m_k, T, H, K)
            b_qg = b_q * tl.exp(tl.where(m_i[:, None], b_bi - b_br[None, :], 0.0))
            b_A += tl.dot(b_qg, b_kt * tl.exp(b_br[:, None] - b_bjt), input_precision=PREC)
        tl.store(p_A + i_j * BC, (b_A * scale).to(A.dtype.element_ty), mask=m_i[:, None])
    b_A = tl.zeros([BC, BC], dtype=tl.float32)                                 # the diagonal block
    causal = ((o_c[:, None] >= o_c[None, :]) & m_i[:, None] & m_i[None, :])[:, :, None]
    for i_k in range(tl.cdiv(K, BKD)):
        o_k = i_k * BKD + tl.arange(0, BKD)
        m_k = o_k < K
        b_q = load_rows(q, i_b, i_h, o_i, m_i, o_k, m_k, T, H, K).to(tl.float32)
        b_k = load_rows(k, i_b, i_h, o_i, m_i, o_k, m_k, T, H, K).to(tl.float32)
        b_b = load_rows(b, i_b, i_h, o_i, m_i, o_k, m_k, T, H, K)
        e = tl.exp(tl.where(causal, b_b[:, None, :] - b_b[None, :, :], float("-inf")))     # [BC, BC, BKD]
        b_A += tl.sum(b_q[:, None, :] * b_k[None, :, :] * e, axis=2)
    tl.store(p_A + i_i * BC, (b_A * scale).to(A.dtype.element_ty), mask=m_i[:, None])
    for i_j in range(i_i + 1, BT // BC):                                       # blocks J > I are zero
        tl.store(p_A + i_j * BC, tl.zeros([BC, BC], dtype=A.dtype.element_ty), mask=m_i[:, None])


def intra_fwd_rows(q, k, b, scale: float, chunk_size: int, sub_chunk: int = 16, num_warps: int = 4) -> torch.Tensor:
    B, T, H, K = q.shape
    BC = min(sub_chunk, chunk_size)
    A = torch.empty(B, T, H, chunk_size, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(T, chunk_size), chunk_size // BC, B * H)
    intra_fwd_rows_kernel[grid](q, k, b, A, scale, T, H, K, chunk_size, BC, tile(K), 16, dot_precision(q),
                                num_warps=num_warps)
    return A


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check-only", action="store_true")
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = (torch.float32, torch.bfloat16) if dev == "cuda" else (torch.float32,)
    checks = [(2, 50, 2, 8, 16), (1, 70, 1, 20, 64), (1, 130, 2, 40, 32)] + \
        ([(2, 256, 2, 64, 64), (2, 256, 2, 256, 64), (1, 1000, 3, 60, 128)] if dev == "cuda" else [])
    for B, T, H, K, C in checks:
        for dtype in dtypes:
            for decay in (1 / 16, 3.0, 300.0):                                # model-like to extreme
                g = -torch.rand(B, T, H, K, device=dev) * decay
                q, k = (torch.randn(B, T, H, K, device=dev).to(dtype) for _ in range(2))
                b = chunk_cumsum(g, C)
                ref = chunk_intra_fwd_ref(q, k, b, K ** -0.5, C)
                got, cur = intra_fwd_rows(q, k, b, K ** -0.5, C), chunk_intra_fwd(q, k, b, K ** -0.5, C)
                print(f"B{B} T{T} H{H} K{K} C{C} {str(dtype)[6:]} decay {decay:g}: candidate {rel(got, ref):.1e}, "
                      f"current {rel(cur, ref):.1e}", flush=True)
    if args.check_only or dev != "cuda":
        return
    from triton.testing import do_bench

    for B, T, H, K in [(16, 2048, 12, 64), (8, 2048, 4, 256), (16, 2048, 16, 64)]:
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device=dev)) / 16
        q, k = (torch.randn(B, T, H, K, device=dev).bfloat16() for _ in range(2))
        b = chunk_cumsum(g, 64)
        t_cur = do_bench(lambda: chunk_intra_fwd(q, k, b, 0.125, 64), warmup=25, rep=100, return_mode="median")
        line = f"B{B} T{T} H{H} K{K}: current {t_cur:.3f} ms"
        for nw in (2, 4, 8):
            t = do_bench(lambda: intra_fwd_rows(q, k, b, 0.125, 64, num_warps=nw), warmup=25, rep=100,
                         return_mode="median")
            line += f" | candidate w{nw} {t:.3f} ms"
        print(line, flush=True)


if __name__ == "__main__":
    main()
