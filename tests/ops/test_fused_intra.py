"""The fused forward's intra-chunk scores (ops/gla/fused_intra.py) against chunk_intra's reference: the
factorised path, the exact one (forced, and where the decay demands it), both in one sequence, every chunk
size, several key tiles, padded last chunks; bf16 full shapes on the GPU beside chunk's kernel."""
from __future__ import annotations

import pytest
import torch

from ops.chunkwise.intra import chunk_intra_fwd, chunk_intra_fwd_ref
from ops.chunkwise.cumsum import chunk_cumsum_ref
from ops.gla.fused_intra import fused_intra_fwd
from ops.gla.scan import MAX_RANGE
from tests.helpers import rel_err


def inputs(B, T, H, K, C, device, wild_every=0, dtype=torch.float32, seed=0):
    """q, k and b = chunk-local cumsum of GLA-like decays (logsigmoid/16); with wild_every, every such
    chunk gets steps of −3, summing past MAX_RANGE."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g) for _ in range(2))
    gk = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=g)) / 16
    if wild_every:
        wild = ((torch.arange(T) // C) % wild_every == wild_every - 1).view(1, T, 1, 1)
        gk = torch.where(wild, torch.full_like(gk, -3.0), gk)
    b = chunk_cumsum_ref(gk, C).contiguous()             # as chunk_cumsum leaves it
    return q.to(device, dtype), k.to(device, dtype), b.to(device)


@pytest.mark.parametrize("max_range", [MAX_RANGE, -1.0], ids=["factorised", "exact"])
@pytest.mark.parametrize("shape,C", [((2, 150, 2, 8), 32), ((2, 150, 2, 8), 64), ((1, 5, 1, 4), 16),
                                     ((1, 5, 1, 4), 128), ((1, 200, 1, 80), 16), ((1, 200, 1, 80), 128)],
                         ids=lambda x: "B{}T{}H{}K{}".format(*x) if isinstance(x, tuple) else str(x))
def test_matches_reference(shape, max_range, C, device, poison_empty):
    """K = 80 spans two key tiles; T = 5 is shorter than every chunk; 150 and 200 leave a padded last chunk. Every
    chunk size runs on two of the shapes, the smallest and the largest on the two-tile one."""
    q, k, b = inputs(*shape, C, device)
    got = fused_intra_fwd(q, k, b, 0.3, C, max_range=max_range)
    ref = chunk_intra_fwd_ref(q.double(), k.double(), b.double(), 0.3, C)
    assert rel_err(got, ref) < 1e-5


def test_tame_and_wild_chunks_in_one_sequence(device, poison_empty):
    q, k, b = inputs(1, 300, 2, 24, 32, device, wild_every=2)
    assert (-b[:, 31::32] > MAX_RANGE).any() and (-b[:, 31::32] <= MAX_RANGE).any()    # both paths
    got = fused_intra_fwd(q, k, b, 0.3, 32)
    assert rel_err(got, chunk_intra_fwd_ref(q.double(), k.double(), b.double(), 0.3, 32)) < 1e-5


def test_extreme_decay_stays_finite(device, poison_empty):
    """Steps of −50: every chunk exact, exp never positive, scores decay to 0 rather than overflow."""
    q, k, _ = inputs(1, 70, 1, 8, 16, device)
    b = chunk_cumsum_ref(torch.full((1, 70, 1, 8), -50.0), 16).to(device)
    got = fused_intra_fwd(q, k, b, 1.0, 16)
    assert torch.isfinite(got).all()
    assert rel_err(got, chunk_intra_fwd_ref(q.double(), k.double(), b.double(), 1.0, 16)) < 1e-5


def test_scalar_decay_is_refused():
    x = torch.zeros(1, 4, 1, 8)
    with pytest.raises(ValueError, match="per-key decay"):
        fused_intra_fwd(x, x, torch.zeros(1, 4, 1, 1), 1.0, 16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="full shapes need a CUDA GPU")
@pytest.mark.parametrize("shape", [(16, 2048, 12, 64), (8, 2048, 4, 256), (2, 1000, 3, 60)], ids=["mve", "k256", "odd"])
def test_bf16_full_shapes_as_chunk(shape):
    """bf16 inputs: the error against the fp64 reference no larger than chunk's own kernel's (+ 10 %)."""
    q, k, b = inputs(*shape, 64, "cuda", dtype=torch.bfloat16)
    ref = chunk_intra_fwd_ref(q.double(), k.double(), b.double(), shape[-1] ** -0.5, 64)
    ours = rel_err(fused_intra_fwd(q, k, b, shape[-1] ** -0.5, 64), ref)
    theirs = rel_err(chunk_intra_fwd(q, k, b, shape[-1] ** -0.5, 64), ref)
    assert ours <= 1.1 * theirs + 1e-6, (ours, theirs)
