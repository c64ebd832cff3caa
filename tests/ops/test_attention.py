"""Plain softmax attention: the SDPA backend against the materialised oracle."""
from __future__ import annotations

import pytest
import torch

from ops.attention.naive import attention, attention_reference
from tests.helpers import rel_err


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(2, 37, 3, 16), (1, 1, 1, 8), (1, 128, 4, 64)])
def test_sdpa_matches_reference(shape, causal):
    q, k, v = (torch.randn(*shape) for _ in range(3))
    ref = attention_reference(q.double(), k.double(), v.double(), causal)
    assert rel_err(attention(q, k, v, causal), ref) < 1e-5


def test_large_logits_stay_finite():
    q, k, v = (torch.randn(1, 64, 2, 32) * 100 for _ in range(3))
    assert torch.isfinite(attention(q, k, v)).all() and torch.isfinite(attention_reference(q, k, v)).all()
