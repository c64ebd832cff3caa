"""The sub-block backward kernels (ops/gla/sub_block_bwd.py) against the `chunk` stages each replaces
(every one tested against its reference and, through the op, naive): dv against chunk_bwd_dv given A,
and dq, dk, db against
chunk_bwd_dA + chunk_intra_bwd + chunk_bwd_dqkb. Ragged T, T < C, several K and V tiles, every
chunk size, and decays from none to −50 per step. The whole op is tested in test_gla.py."""
from __future__ import annotations

import pytest
import torch

from ops.chunkwise.state import chunk_bwd_dh, chunk_fwd_h
from ops.chunkwise import intra, output
from ops.chunkwise.cumsum import chunk_cumsum, chunk_residual
from ops.gla.sub_block_bwd import fused_chunk_bwd_dqk, fused_chunk_bwd_dv
from tests.helpers import rel_err

# B, T, H, K, V, C
CASES = [(2, 50, 1, 8, 6, 16), (1, 70, 1, 20, 140, 64), (1, 5, 1, 4, 4, 32), (1, 40, 1, 140, 12, 16),
         (1, 150, 1, 16, 16, 128)]
GATES = {"realistic": lambda s: -torch.rand(s) * 3 / 8, "none": lambda s: torch.zeros(s),
         "extreme": lambda s: -torch.rand(s) * 50, "mixed": lambda s: torch.where(torch.rand(s) < 0.5, -1e-4, -50.0)}


def make(case, gate, dtype, device):
    B, T, H, K, V, C = case
    torch.manual_seed(0)
    g = GATES[gate]((B, T, H, K)).to(device)
    q, k = (torch.randn(B, T, H, K, device=device).to(dtype) for _ in range(2))
    v, do = (torch.randn(B, T, H, V, device=device).to(dtype) for _ in range(2))
    b = chunk_cumsum(g, C)
    h, _ = chunk_fwd_h(k, v, b, torch.randn(B, H, K, V, device=device), False, C)
    dh, _ = chunk_bwd_dh(q, do, b, torch.randn(B, H, K, V, device=device), False, K ** -0.5, C)
    return q, k, v, b, h, do, dh, K ** -0.5, C


def stage(name: str, C: int):
    """chunk's Triton stage (C ≤ 128: the `fused` op, which alone runs these kernels, offers no more)."""
    return getattr(intra if "intra" in name else output, name)


def dv_pair(q, k, v, b, h, do, dh, scale, C):
    A = stage("chunk_intra_fwd", C)(q, k, b, scale, C)
    return fused_chunk_bwd_dv(q, k, b, do, dh, scale, C), stage("chunk_bwd_dv", C)(k, b, A, do, dh, C)


def dqk_pair(q, k, v, b, h, do, dh, scale, C):
    dA = stage("chunk_bwd_dA", C)(do, v, C)
    res = torch.zeros_like(b)                           # b taken as exact: its residual is 0
    dq_intra, dk_intra = stage("chunk_intra_bwd", C)(q, k, b, res, dA, scale, C)
    return (fused_chunk_bwd_dqk(q, k, v, b, res, h, do, dh, scale, C),
            stage("chunk_bwd_dqkb", C)(q, k, v, b, res, h, dh, do, dA, dq_intra, dk_intra, scale, C))


# The kernels have no branch on the decay's value (min_range < 0 takes every chunk), so the gates only change the
# numbers: each runs once at a shape of its own, and all of them at T < C, where the masks cover most of the chunk.
CELLS = [(CASES[0], "mixed"), (CASES[1], "extreme"), (CASES[3], "realistic"), (CASES[4], "none"),
         *((CASES[2], gate) for gate in GATES)]


@pytest.mark.parametrize("case,gate", CELLS, ids=str)
def test_fused_kernels_equal_the_chunk_stages(case, gate, device, poison_empty):
    inputs = make(case, gate, torch.float32, device)
    got, want = dv_pair(*inputs)
    assert got.dtype == want.dtype and rel_err(got, want) < 1e-5, "dv"
    for name, x, y in zip(("dq", "dk", "db"), *dqk_pair(*inputs)):
        assert x.dtype == y.dtype and torch.isfinite(x).all() and rel_err(x, y) < 1e-5, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 tensor-core paths need a CUDA GPU")
@pytest.mark.parametrize("case", [(16, 2048, 12, 64, 64, 64), (8, 2048, 4, 256, 512, 64), (2, 1000, 3, 60, 100, 64),
                                  (2, 1000, 3, 64, 64, 32), (2, 1000, 3, 64, 64, 128)],
                         ids=["mve", "340m", "odd", "C32", "C128"])
def test_fused_kernels_bf16_full_shapes(case):
    """bf16 on the GPU: the stages agree to bf16 rounding (both accumulate in fp32, in different orders)."""
    inputs = make(case, "realistic", torch.bfloat16, "cuda")
    assert rel_err(*dv_pair(*inputs)) < 1e-2, "dv"
    for name, x, y in zip(("dq", "dk", "db"), *dqk_pair(*inputs)):
        assert rel_err(x, y) < 1e-2, name


def test_min_range_leaves_the_tame_chunks_alone(device):
    """With min_range the kernels write only the chunks whose decay exceeds it: here none of the
    realistic ones (−Σ g ≤ 3/8 · 16 per chunk), so `out` keeps what it held."""
    q, k, v, b, h, do, dh, scale, C = make((2, 50, 2, 8, 6, 16), "realistic", torch.float32, device)
    dv = torch.full_like(v, 7.0)
    dq, dk, db = torch.full_like(q, 7.0), torch.full_like(k, 7.0), torch.full_like(b, 7.0)
    fused_chunk_bwd_dv(q, k, b, do, dh, scale, C, min_range=6.0, out=dv)
    fused_chunk_bwd_dqk(q, k, v, b, torch.zeros_like(b), h, do, dh, scale, C, min_range=6.0, out=(dq, dk, db))
    assert all((x == 7.0).all() for x in (dv, dq, dk, db))
    fused_chunk_bwd_dv(q, k, b, do, dh, scale, C, min_range=0.0, out=dv)       # every chunk decays a little
    assert rel_err(dv, dv_pair(q, k, v, b, h, do, dh, scale, C)[1]) < 1e-5


def test_dv_kernel_writes_the_residual_where_a_chunk_needs_it(device):
    """Given g and res, the dv kernel writes b's residual as chunk_residual forms it in every chunk whose decay
    exceeds RESIDUAL_FROM, whatever min_range, and leaves the weaker chunks alone."""
    B, T, H, K, V, C = 1, 80, 2, 20, 6, 16
    q, k, v, _, h, do, dh, scale, _ = make((B, T, H, K, V, C), "realistic", torch.float32, device)
    # chunks 0 and 2 decay by about 50 per step, chunks 1 and 4 hardly, chunk 3 by 2 per step (32 a chunk)
    per_chunk = torch.tensor([-50.3, -1e-3, -49.7, -2.0, -1e-4], device=device)
    g = per_chunk.repeat_interleave(C)[None, :, None, None] * (1 + 0.1 * torch.rand(B, T, H, K, device=device))
    b = chunk_cumsum(g, C)
    want = chunk_residual(g, b, C)
    strong = (torch.arange(T, device=device) // C).remainder(2) == 0
    strong[3 * C:] = False
    for min_range in (-1.0, 64.0, 500.0):
        res = torch.full_like(b, 7.0)
        fused_chunk_bwd_dv(q, k, b, do, dh, scale, C, min_range=min_range, out=torch.empty_like(v), g=g, res=res)
        assert (res[:, strong] - want[:, strong]).abs().max() < 1e-6, min_range      # r itself is ~ulp(|b|) ~ 1e-4
        assert (res[:, ~strong] == 7.0).all(), min_range
    with pytest.raises(ValueError, match="g and res"):
        fused_chunk_bwd_dv(q, k, b, do, dh, scale, C, g=g)
