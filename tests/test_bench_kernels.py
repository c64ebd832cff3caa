"""The kernel benchmark's report (the timing itself needs a GPU): table, ratios, FAIL rows, plot."""
from __future__ import annotations

from scripts.bench_kernels import CASES, plot, to_markdown


def test_report_formats_ratios_failures_and_plot(tmp_path):
    dims = {"B": 1, "T": 8, "H": 1, "K": 4, "V": 4}
    base = {"op": "gla", "shape": "mve", "dims": dims, "status": "ok", "fwd_tflops": 1.0, "fwd_gbs": 2.0,
            "fwd_floor_ms": 0.1, "fwdbwd_floor_ms": 0.3}
    rows = [{**base, "backend": "naive", "check": "reference", "fwd_ms": 4.0, "fwdbwd_ms": 12.0},
            {**base, "backend": "chunk", "check": "ok (1.0e-03)", "fwd_ms": 0.5, "fwdbwd_ms": 2.0, "plan_floor_ms": (0.25, 0.9)},
            {**base, "backend": "fla", "check": "ok (2.0e-03)", "fwd_ms": 0.6, "fwdbwd_ms": 2.6},
            {"op": "gla", "shape": "mve", "dims": dims, "backend": "fused", "status": "FAIL", "errs": [0.5, float("nan")]}]
    md = to_markdown(rows, {"date": "2026-11-22", "device": "X", "torch": "t", "triton": "tr", "fla": "f"}, "cmd", [])
    assert "| 1.20× | 1.30× |" in md                     # fla/chunk fwd and fwd+bwd
    assert "FAIL: errors 5.0e-01, nan" in md
    assert "0.100 / 0.300; plan 0.250 / 0.900 |" in md
    plot(rows, tmp_path / "k.png")
    assert (tmp_path / "k.png").stat().st_size > 1000


def test_every_case_has_a_backend_to_compare():
    from ops import list_backends

    for case in CASES:
        assert "naive" in list_backends(case.op) and len(list_backends(case.op)) > 1, case.name


def test_plan_floors_for_our_own_kernels_only():
    """The model's floors at the MVE shape (ops/common/movement.py prints them): fused below chunk,
    forward and forward+backward; no plan for fla's kernels."""
    from scripts.bench_kernels import plan_floor_ms

    mve = next(c for c in CASES if c.op == "gla" and c.name == "mve")
    chunk, fused = plan_floor_ms(mve, "chunk"), plan_floor_ms(mve, "fused")
    assert 0.3 < chunk[0] < 0.4 and 0.1 < fused[0] < chunk[0] / 2 and fused[1] < chunk[1] / 2    # the scan: 0.15 ms
    assert plan_floor_ms(mve, "fla") is None
