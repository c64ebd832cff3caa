"""The GEMM main loop the projection kernels share (ops/proj_in, ops/proj_out; `_ref`: a @ w.T).

A plain K loop of tl.dot on pointer-loaded tiles (`dot_rows`), so Triton's pipeliner streams both operands through
shared memory (num_stages deep), in a grouped launch order; or the same loop on tensor descriptors (`dot_desc`),
which Hopper loads by TMA. Each kernel keeps its own epilogue; `launch_gemm` starts any of them over an [M, N]
output. `padded_rows` stacks the weights of a cuBLAS GEMM whose output a chain's operator reads (gdn_proj_in,
mamba2_proj_in).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from ops.triton_utils import cdiv

# Under TRITON_INTERPRET=1 (CPU tests): small fixed tiles, so test sizes give several programs, ragged edges
# in rows, columns and K, and column tiles that straddle the projections' slice boundaries.
INTERPRET_TILES = dict(BM=16, BN=16, BK=16, GROUP=2)
# A GEMM output read by an operator has a width that is a multiple of COLUMNS (128 bytes in bf16): at an unaligned
# width Inductor copied it before the operator and its gradient after it, a pass each way (48 µs at gdn_340m's 3,088
# columns, 35 µs at mamba2_370m's 2,336, on an H200), more than the GEMM spends on the zero columns.
COLUMNS = 64


def padded_rows(weights: list[torch.Tensor]) -> torch.Tensor:
    """The weights' rows stacked, [N, d], then zero rows up to a multiple of COLUMNS: the GEMM's extra output
    columns are 0, and so is the gradient the operator writes there."""
    w = weights[0]
    return torch.cat([*weights, w.new_zeros(-sum(x.shape[0] for x in weights) % COLUMNS, w.shape[1])])


def launch_gemm(tuned: Callable, kernel: Callable, M: int, N: int, args: tuple, on: torch.Tensor, **meta) -> None:
    """One program per [BM, BN] tile of an [M, N] output: `tuned` (the autotuned kernel) on a GPU, `kernel`
    with INTERPRET_TILES under the interpreter. on: a tensor whose device decides."""
    if on.is_cuda:
        tuned[lambda m: (cdiv(M, m["BM"]) * cdiv(N, m["BN"]),)](*args, **meta)
    else:
        t = INTERPRET_TILES
        kernel[(cdiv(M, t["BM"]) * cdiv(N, t["BN"]),)](*args, **meta, **t)


@triton.jit
def grouped_tile(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    """(pid_m, pid_n) of this program: GROUP row tiles run together and share each column tile's W slice in L2."""
    return tile_of(tl.program_id(0), M, N, BM, BN, GROUP)


@triton.jit
def tile_of(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    """(pid_m, pid_n) of tile number `pid` in grouped order (grouped_tile's; a persistent kernel's loop index)."""
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP * num_n
    first_m = (pid // per_group) * GROUP
    size_m = tl.minimum(num_m - first_m, GROUP)
    return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m


@triton.jit
def dot_rows(acc, a, w, ra, cb, K, PREC: tl.constexpr, BK: tl.constexpr):
    """acc[BM, BN] += a[ra, :K] · w[cb, :K]ᵀ for row-major a [M, K] and w [N, K]. ra, cb: the tile's rows
    and columns, already wrapped onto valid ones at the edges (their results are never stored), so the
    loads need only the K mask, which keeps them pipelineable at full width."""
    kk = tl.arange(0, BK)
    a_ptr = a + ra[:, None] * K + kk[None, :]                                               # [BM, BK]
    w_ptr = w + cb[None, :] * K + kk[:, None]                                               # [BK, BN] = wᵀ tile
    for k0 in range(0, K, BK):
        mk = kk < K - k0
        acc = tl.dot(tl.load(a_ptr, mask=mk[None, :], other=0.0), tl.load(w_ptr, mask=mk[:, None], other=0.0),
                     acc, input_precision=PREC)
        a_ptr += BK
        w_ptr += BK
    return acc


@triton.jit
def dot_desc(acc, a, w, KW, k_row, m0, n0, PREC: tl.constexpr, BK: tl.constexpr):
    """acc[BM, BN] += a[m0 : m0 + BM, :KW] · w[k_row : k_row + KW, n0 : n0 + BN] through tensor descriptors
    (TMA on Hopper): a's block [BM, BK], w's [BK, BN]. A ragged last step reads w's rows past k_row + KW, but
    a's descriptor zero-fills its columns past KW, so they add nothing; edges of the tensors are zero-filled."""
    for k0 in range(0, KW, BK):
        acc = tl.dot(a.load([m0, k0]), w.load([k_row + k0, n0]), acc, input_precision=PREC)
    return acc
