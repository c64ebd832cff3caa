"""The fused output kernel (ops/common/fused_chunk.py) against the two `chunk` stages it replaces,
chunk_intra_fwd then chunk_fwd_o (each tested against its reference and, through the op, naive):
ragged T, T < C, several K and V tiles, every chunk size, and decays from none to −50 per step."""
from __future__ import annotations

import pytest
import torch

from ops.common.chunk_h import chunk_fwd_h
from ops.common.chunk_intra import chunk_intra_fwd
from ops.common.chunk_o import chunk_fwd_o
from ops.common.cumsum import chunk_cumsum
from ops.common.fused_chunk import fused_chunk_fwd
from tests.helpers import rel_err

# B, T, H, K, V, C
CASES = [(2, 50, 2, 8, 6, 16), (1, 70, 1, 20, 140, 64), (1, 5, 1, 4, 4, 32), (1, 40, 1, 140, 12, 16),
         (1, 150, 1, 16, 16, 128)]
GATES = {"realistic": lambda s: -torch.rand(s) * 3 / 8, "none": lambda s: torch.zeros(s),
         "extreme": lambda s: -torch.rand(s) * 50, "mixed": lambda s: torch.where(torch.rand(s) < 0.5, -1e-4, -50.0)}


def run(case, gate, dtype, device):
    B, T, H, K, V, C = case
    torch.manual_seed(0)
    g = GATES[gate]((B, T, H, K)).to(device)
    q, k = (torch.randn(B, T, H, K, device=device).to(dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, device=device).to(dtype)
    h0 = torch.randn(B, H, K, V, device=device)
    b = chunk_cumsum(g, C)
    h, _ = chunk_fwd_h(k, v, b, h0, False, C)
    scale = K ** -0.5
    return fused_chunk_fwd(q, k, v, b, h, scale, C), chunk_fwd_o(q, v, b, h, chunk_intra_fwd(q, k, b, scale, C), scale, C)


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("gate", list(GATES))
def test_fused_output_equals_intra_then_output(case, gate, device, poison_empty):
    got, want = run(case, gate, torch.float32, device)
    assert got.dtype == want.dtype and torch.isfinite(got).all()
    assert rel_err(got, want) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 tensor-core paths need a CUDA GPU")
@pytest.mark.parametrize("case", [(16, 2048, 12, 64, 64, 64), (8, 2048, 4, 256, 512, 64), (2, 1000, 3, 60, 100, 64)],
                         ids=["mve", "340m", "odd"])
def test_fused_output_bf16_full_shapes(case):
    got, want = run(case, "realistic", torch.bfloat16, "cuda")
    assert rel_err(got, want) < 1e-2


def test_scalar_decay_is_refused():
    x = torch.zeros(1, 4, 1, 4)
    with pytest.raises(ValueError, match="scalar decay"):
        fused_chunk_fwd(x, x, x, torch.zeros(1, 4, 1, 1), torch.zeros(1, 1, 1, 4, 4), 1.0, 16)
