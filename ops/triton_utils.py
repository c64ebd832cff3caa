"""Triton helpers shared by every kernel folder under ops/.

Host side: ceiling division and powers of two (`cdiv`, `next_power_of_2`), head-dim tiles (`tile`), the dot
precision an input dtype takes (`dot_precision`), the SM count (`sm_count`), and the checks a Triton backend makes
before launching (`check_triton_device`, `check_dtypes`); `sum_partials`, the sum of per-program partial sums that
backward kernels write for a weight's gradient.
Kernel side (`@triton.jit`, inlined into their callers): addressing of contiguous time-major [B, T, H, D]
tensors, the layout of every activation here. Row t of head h in batch b starts at ((b·T + t)·H + h)·D.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

# What the Triton backends compute in: bf16 and fp16 run on the tensor cores with fp32 accumulation, fp32 stays
# exact (no TF32). float64 has no tensor-core dot in Triton; the naive backend takes it.
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for host code. triton.cdiv is the same for kernels, but its constexpr-function wrapper costs
    microseconds a call on the host, and an operator's launch path makes tens of these calls."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ≥ n (1 for n ≤ 1), for host code (triton.next_power_of_2's value; see cdiv)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def tile(D: int) -> int:
    """A head-dim tile: the next power of two, at least 16 (tl.dot's minimum), at most 64."""
    return min(64, max(16, next_power_of_2(D)))


def dot_precision(x: torch.Tensor) -> str:
    """fp32 inputs stay exact ("ieee", no TF32); bf16 operands use the tensor cores either way."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """The device's SMs; the H100's 132 under the interpreter, so CPU tests take the GPU's launch plans."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def check_triton_device(op: str, backend: str) -> None:
    """Triton kernels run on a CUDA GPU, or on the CPU under TRITON_INTERPRET=1 (tests). op and backend are
    what the user asked for, so that the error names them (one check serves every Triton op and backend)."""
    from ops import BackendError

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        # triton reads the variable when it is imported, so the remedy is the user's to apply, not ours
        raise BackendError(f"op {op!r}, backend {backend!r}: its Triton kernels need a CUDA GPU. On this machine use "
                           "--backend naive; for slow CPU testing, put TRITON_INTERPRET=1 in front of the command "
                           "(TRITON_INTERPRET=1 python ...)")


def check_dtypes(op: str, backend: str, *tensors: torch.Tensor | None,
                 allowed: tuple[torch.dtype, ...] = TRITON_DTYPES) -> None:
    """A BackendError naming the op, the backend and the dtypes it takes, for any floating input outside
    `allowed` (float64 reaches Triton as a CompilationError otherwise)."""
    bad = sorted({str(t.dtype) for t in tensors if t is not None and t.is_floating_point() and t.dtype not in allowed})
    if bad:
        from ops import BackendError

        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise BackendError(f"op {op!r}, backend {backend!r}: inputs in {', '.join(bad)} are not supported; it takes "
                           f"{names}. Cast the inputs, or use --backend naive (it computes in fp64 for fp64 inputs)")


@triton.jit
def row_offsets(i_b, i_h, rows, T, H: tl.constexpr, D: tl.constexpr):
    """Offsets of `rows` (time indices, any shape) of head i_h in batch i_b of a [B, T, H, D] tensor: add the
    column index to reach an element."""
    return ((i_b * T + rows) * H + i_h) * D


@triton.jit
def load_rows(x, i_b, i_h, rows, m_rows, cols, m_cols, T, H: tl.constexpr, D: tl.constexpr):
    """The tile x[i_b, rows, i_h, cols] of a [B, T, H, D] tensor, [rows, cols]; masked elements load 0."""
    return tl.load(x + row_offsets(i_b, i_h, rows[:, None], T, H, D) + cols[None, :],
                   mask=m_rows[:, None] & m_cols[None, :], other=0.0)


@triton.jit
def load_rows_t(x, i_b, i_h, rows, m_rows, cols, m_cols, T, H: tl.constexpr, D: tl.constexpr):
    """The tile x[rows, cols] transposed, [cols, rows], loaded in that layout: a dot's right operand
    without a tl.trans in between (Triton < 3.7.1 miscompiles some tl.trans feeding tl.dot on Hopper)."""
    return tl.load(x + row_offsets(i_b, i_h, rows[None, :], T, H, D) + cols[:, None],
                   mask=m_rows[None, :] & m_cols[:, None], other=0.0)


@triton.jit
def store_rows(x, value, i_b, i_h, rows, m_rows, cols, m_cols, T, H: tl.constexpr, D: tl.constexpr):
    """value [rows, cols] into x[i_b, rows, i_h, cols] of a [B, T, H, D] tensor, cast to x's dtype."""
    tl.store(x + row_offsets(i_b, i_h, rows[:, None], T, H, D) + cols[None, :], value.to(x.dtype.element_ty),
             mask=m_rows[:, None] & m_cols[None, :])


# elements a program of sum_partials loads at once: every row of its column tile (up to SUM_ROWS), so that all its
# loads are in flight together (aten's dim-0 sum walks the rows: 2.5–7 µs a call in a CUDA graph on an H200, against
# 1.5–2.8 µs here at the partials' shapes of the projection chains' backward)
SUM_TILE, SUM_ROWS = 4096, 1024


@triton.jit
def sum_partials_kernel(x, out, P, N, BP: tl.constexpr, BN: tl.constexpr):
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    acc = tl.zeros([BN], tl.float32)
    for p0 in range(0, P, BP):
        rows = p0 + tl.arange(0, BP)
        acc += tl.sum(tl.load(x + rows[:, None] * N + cols[None, :], mask=(rows[:, None] < P) & (cols[None, :] < N),
                              other=0.0).to(tl.float32), axis=0)
    tl.store(out + cols, acc.to(out.dtype.element_ty), mask=cols < N)


def sum_partials(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Σ over dim 0 of x [P, ...] (the per-program partial sums of a gradient, fp32) → [...] in dtype (x's by
    default), accumulated in fp32: one launch whose programs each load all P rows of a column tile at once
    (SUM_ROWS at a time). The summation order is fixed, so the result is deterministic."""
    x = x.contiguous()
    P, N = x.shape[0], x[0].numel()
    if P * N >= 2 ** 31:
        raise ValueError(f"sum_partials: {P} × {N} elements need 64-bit offsets; the partials' producer should "
                         "write fewer rows")
    out = torch.empty(x.shape[1:], device=x.device, dtype=dtype or x.dtype)
    bp = min(next_power_of_2(P), SUM_ROWS)
    bn = max(8, min(next_power_of_2(N), SUM_TILE // bp))
    sum_partials_kernel[(cdiv(N, bn),)](x, out, P, N, bp, bn, num_warps=4)
    return out
