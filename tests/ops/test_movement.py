"""The analytical data-movement model (ops/gla/movement.py): byte counts by hand at a small
shape, what each loop order re-reads, the on-chip budgets, and the grid-utilisation stretch."""
from __future__ import annotations

import pytest

from ops.gla.movement import H100, MIN_BV, Shape, Tiles, choose, chunk_plan, fused_plan, kernel_tiles


def test_chunk_bytes_by_hand():
    s = Shape(B=1, T=128, H=1, K=16, V=32, C=64)            # 2 chunks, bf16, per-key decay
    qk, v, b, h, A = 128 * 16 * 2, 128 * 32 * 2, 128 * 16 * 4, 2 * 16 * 32 * 2, 128 * 64 * 2
    expect = 2 * b + (qk + v + b + h) + (2 * qk + b + A) + (qk + b + h + A + 2 * v)
    assert chunk_plan(s).total_bytes == expect


def test_scan_bytes_by_hand():
    """The scan reads q, k, g once per V tile and v once; writes o, and for the backward b and h."""
    s = Shape(B=2, T=1000, H=3, K=64, V=128)               # 16 chunks
    tok = 2 * 1000 * 3
    once = 2 * tok * 64 * 2 + tok * 64 * 4                  # q, k (bf16), g (fp32)
    vo, bh = 2 * tok * 128 * 2, tok * 64 * 4 + 2 * 16 * 3 * 64 * 128 * 2
    assert fused_plan(s, Tiles(64, 128), H100).total_bytes == once + vo + bh
    assert fused_plan(s, Tiles(64, 64), H100).total_bytes == 2 * once + vo + bh
    assert fused_plan(s, Tiles(64, 64), H100, save=False).total_bytes == 2 * once + vo


def test_scan_moves_less_than_chunk_at_the_mve_shape():
    s = Shape(16, 2048, 12, 64, 64)
    assert fused_plan(s, Tiles(64, 64), H100).total_bytes < chunk_plan(s).total_bytes / 2


def test_register_budget_sets_the_warps():
    """The state [K, BV], the scores [C, C], o and the decayed q, k in fp32 registers: 4 warps hold them
    at K = 64 (the H100 sweep's best), K = 128 needs 8 (4 measured 1.3x slower), K = 512 fits nothing."""
    assert fused_plan(Shape(1, 1024, 1, 64, 64), Tiles(64, 64, num_warps=4), H100).feasible
    p = fused_plan(Shape(1, 1024, 1, 128, 256), Tiles(128, 64, num_warps=4), H100)
    assert not p.feasible and "registers" in p.why
    assert fused_plan(Shape(1, 1024, 1, 128, 256), Tiles(128, 64, num_warps=8), H100).feasible
    assert choose(Shape(1, 1024, 1, 512, 64))[0] is None


def test_choice_matches_the_sweeps():
    """The H100 sweeps' best V tile and warps."""
    for s, (bv, warps) in ((Shape(16, 2048, 12, 64, 64), (64, 4)), (Shape(8, 2048, 4, 128, 256), (64, 8))):
        best, plans = choose(s)
        assert (best.tiles.BV, best.tiles.num_warps) == (bv, warps)
        assert all(best.floor_s(H100) <= p.floor_s(H100) for p in plans if p.feasible)


def test_short_grid_stretches_the_state_pass():
    s = Shape(B=1, T=32768, H=4, K=128, V=128)
    states = chunk_plan(s).kernels[1]
    assert states.programs == 16
    assert states.floor_s(H100) == pytest.approx(states.bytes / H100.hbm_bytes_per_s * 132 / 16)


@pytest.mark.parametrize("B", [1, 2, 4, 6, 8, 16])
@pytest.mark.parametrize("K, V", [(64, 64), (128, 256), (16, 6)])
def test_no_v_tile_below_the_hopper_minimum(B, K, V):
    """Small batches (evaluation) once got BV 32, which miscompiles on the H100 without the backward's stores."""
    t = kernel_tiles(B, 2048, 12, K, V, 64, 2)
    assert t is not None and t.BV >= MIN_BV
