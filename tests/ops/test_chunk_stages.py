"""Each Triton stage of the chunk backend (ops/common/) against the `_ref` beside it."""
from __future__ import annotations

import pytest
import torch

from ops.common.chunk_h import chunk_fwd_h, chunk_fwd_h_ref
from ops.common.chunk_intra import chunk_intra_fwd, chunk_intra_fwd_ref
from ops.common.cumsum import chunk_cumsum, chunk_cumsum_ref
from tests.helpers import rel_err

CASES = [(2, 50, 2, 8, 6, 16), (1, 70, 1, 20, 12, 64), (1, 5, 1, 4, 4, 32)]   # B, T, H, K, V, C


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("scalar", [False, True], ids=["gk", "scalar"])
def test_stages_match_refs(case, scalar, device, poison_empty):
    B, T, H, K, V, C = case
    g = -torch.rand(B, T, H, 1 if scalar else K, device=device) * 3
    for reverse in (False, True):
        assert rel_err(chunk_cumsum(g, C, reverse), chunk_cumsum_ref(g, C, reverse)) < 1e-6
    b = chunk_cumsum(g, C)
    q, k = (torch.randn(B, T, H, K, device=device) for _ in range(2))
    v, h0 = torch.randn(B, T, H, V, device=device), torch.randn(B, H, K, V, device=device)
    h, ht = chunk_fwd_h(k, v, b, h0, True, C)
    h_ref, ht_ref = chunk_fwd_h_ref(k, v, b, h0, C)
    assert rel_err(h, h_ref) < 1e-6 and rel_err(ht, ht_ref) < 1e-6
    assert rel_err(chunk_intra_fwd(q, k, b, 0.5, C), chunk_intra_fwd_ref(q, k, b, 0.5, C)) < 1e-6
