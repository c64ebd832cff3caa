"""The analytical data-movement model (ops/common/movement.py): byte counts by hand at a small
shape, what each loop order re-reads, the on-chip budgets, and the grid-utilisation stretch."""
from __future__ import annotations

import pytest

from ops.common.movement import H100, Shape, Tiles, choose, chunk_plan, fused_plan


def test_chunk_bytes_by_hand():
    s = Shape(B=1, T=128, H=1, K=16, V=32, C=64)            # 2 chunks, bf16, per-key decay
    qk, v, b, h, A = 128 * 16 * 2, 128 * 32 * 2, 128 * 16 * 4, 2 * 16 * 32 * 2, 128 * 64 * 2
    expect = 2 * b + (qk + v + b + h) + (2 * qk + b + A) + (qk + b + h + A + 2 * v)
    assert chunk_plan(s).total_bytes == expect


def test_fused_saves_the_A_round_trip_and_one_q_read():
    s = Shape(B=2, T=1000, H=3, K=64, V=64)
    c, f = chunk_plan(s), fused_plan(s, Tiles(64, 64), H100)
    tok = 2 * 1000 * 3
    assert c.total_bytes - f.total_bytes == 2 * tok * 64 * 2 + tok * 64 * 2 + tok * 64 * 4   # A out + in, q, b


@pytest.mark.parametrize("v_inner", [False, True])
def test_v_tiles_reread_q_k_b_unless_v_inner(v_inner):
    s = Shape(B=1, T=256, H=2, K=64, V=256)
    one = fused_plan(s, Tiles(64, 256), H100).kernels[-1].bytes
    four = fused_plan(s, Tiles(64, 64, v_inner), H100).kernels[-1].bytes
    extra = 3 * (2 * 256 * 2 * 64 * 2 + 256 * 2 * 64 * 4)             # q, k, b read 3 more times
    assert four - one == (0 if v_inner else extra)


def test_budgets_reject_what_does_not_fit():
    s = Shape(B=1, T=1024, H=1, K=128, V=128, C=128)
    p = fused_plan(s, Tiles(128, 128, v_inner=True, num_warps=4), H100)
    assert not p.feasible and "registers" in p.why        # all of S̃, O and the decayed q: 512 fp32 per thread
    assert fused_plan(s, Tiles(64, 128, v_inner=True, num_warps=8, num_stages=1), H100).feasible        # 192
    assert not fused_plan(s, Tiles(128, 128, num_warps=4, num_stages=1), H100).feasible                 # 400
    assert fused_plan(s, Tiles(128, 128, num_warps=8, num_stages=1), H100).feasible   # S̃ 16 columns at a time: 200
    big = fused_plan(Shape(1, 1024, 1, 128, 128), Tiles(128, 128, num_warps=8, num_stages=3), H100)
    assert not big.feasible and "shared memory" in big.why


def test_choice_is_feasible_aligned_and_cheapest():
    s = Shape(B=8, T=2048, H=4, K=256, V=512)
    best, plans = choose(s)
    assert best.feasible and best.tiles.BK % 16 == 0 and best.tiles.BV % 16 == 0
    assert all(best.floor_s(H100) <= p.floor_s(H100) for p in plans if p.feasible)
    assert best.floor_s(H100) < chunk_plan(s).floor_s(H100)


def test_short_grid_stretches_the_state_pass():
    s = Shape(B=1, T=32768, H=4, K=128, V=128)
    states = chunk_plan(s).kernels[1]
    assert states.programs == 16
    assert states.floor_s(H100) == pytest.approx(states.bytes / H100.hbm_bytes_per_s * 132 / 16)
