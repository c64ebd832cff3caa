"""eval/parity_stats.py and the verdict logic of eval/parity_report.py on hand-checkable numbers: the t quantiles,
intervals, two one-sided tests, the spread's F-test, the seeds that would decide, window standard errors and slopes."""
from __future__ import annotations

import math

import numpy as np
import pytest

from eval import parity_report as report
from eval import parity_stats as stats

T95 = {1: 6.313751514675, 2: 2.919985580354, 3: 2.353363434802, 4: 2.131846786327, 7: 1.894578605, 8: 1.859548038}


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 8, math.inf])
def test_t_quantile_matches_the_tables(df):
    t95 = T95.get(df, 1.644853626951)
    assert stats.t_quantile(0.95, df) == pytest.approx(t95, rel=1e-9)
    assert stats.t_quantile(0.05, df) == pytest.approx(-t95, rel=1e-9)
    # closed forms at 1 and 2 degrees of freedom, elsewhere in the distribution
    assert stats.t_quantile(0.8, 1) == pytest.approx(math.tan(math.pi * 0.3), rel=1e-10)
    assert stats.t_quantile(0.8, 2) == pytest.approx(0.6 / math.sqrt(2 * 0.8 * 0.2), rel=1e-10)


def test_the_interval_by_hand():
    # mean 0.001, deviations ±0.003 and 0: sd √(18e-6 / 2) = 0.003; half-width t_{.95,2} · 0.003 / √3
    s = stats.paired_interval([0.004, -0.002, 0.001])
    assert (s["n"], s["mean"], s["sd"]) == (3, pytest.approx(0.001), pytest.approx(0.003))
    assert (s["lo"], s["hi"]) == pytest.approx((0.001 - 0.0050575, 0.001 + 0.0050575), abs=1e-7)
    # two seeds: sd √2 · 0.001, se 0.001, half-width t_{.95,1} · 0.001
    s = stats.paired_interval([0.001, 0.003])
    assert (s["lo"], s["hi"]) == pytest.approx((0.002 - 0.0063138, 0.002 + 0.0063138), abs=1e-7)
    one = stats.paired_interval([0.0])
    assert math.isnan(one["sd"]) and (one["lo"], one["hi"]) == (-math.inf, math.inf)
    with pytest.raises(ValueError, match="finite"):
        stats.paired_interval([0.1, math.nan])


def test_tost_is_the_interval_inside_the_margin():
    # df 1: P(T ≥ t) = ½ − atan(t)/π; the upper test's t = (0.01 − 0.002)/0.001 = 8 dominates
    assert stats.tost_pvalue([0.001, 0.003], 0.01) == pytest.approx(0.5 - math.atan(8) / math.pi, rel=1e-9)
    hi = stats.paired_interval([0.001, 0.003])["hi"]
    # the margin exactly at the interval's end: p = 0.05 and not inside (both strict); a hair either side decides
    assert stats.tost_pvalue([0.001, 0.003], hi) == pytest.approx(0.05, rel=1e-8)
    assert not stats.verdict([0.001, 0.003], hi)["inside"]
    assert stats.verdict([0.001, 0.003], hi * (1 + 1e-9))["verdict"] == "equivalent"
    assert stats.verdict([0.001, 0.003], hi * (1 - 1e-9))["verdict"] == "undecided"
    rng = np.random.default_rng(0)
    for _ in range(40):
        d = rng.normal(rng.uniform(-0.01, 0.01), rng.uniform(1e-4, 1e-2), rng.integers(2, 6))
        assert stats.verdict(d, 0.01)["inside"] == (stats.tost_pvalue(d, 0.01) < 0.05)
    assert stats.tost_pvalue([0.0], 0.01) == 1.0 and stats.tost_pvalue([0.002, 0.002], 0.01) == 0.0


def test_verdicts():
    floor = [0.003, -0.004, 0.001]                    # sd 0.0036, interval ±0.006 around 0
    eq = stats.verdict([0.001, -0.002, 0.0005], 0.01, floor)
    assert eq["verdict"] == "equivalent" and eq["spread_ok"] and eq["tost_p"] < 0.05

    diff = stats.verdict([0.30, 0.35], 0.01, [1e-6, -1e-6])
    assert diff["verdict"] == "different" and diff["excludes_zero"] and diff["outside_floor"]
    # excludes zero but overlaps the floor's interval: not different
    near = stats.verdict([0.02, 0.021, 0.019], 0.01, [0.0, 0.04, 0.01])
    assert near["excludes_zero"] and not near["outside_floor"] and near["verdict"] == "undecided"
    # inside the margin but wider than the floor: not equivalent, and it holds 0, so not different; at this spread
    # only a difference could be shown, with many seeds (the mean is 1e-4 off the floor's)
    wide = stats.verdict([0.0012, -0.0010, 0.0001], 0.01, [1e-5, -1e-5, 0.0])
    assert wide["inside"] and wide["spread_ok"] is False and wide["verdict"] == "undecided"
    assert wide["seeds_to_decide"][1] == "different" and wide["seeds_to_decide"][0] > 100
    assert "exceeds the floor's" in wide["reason"]
    # one seed: an infinite interval decides nothing, and no spread says how many would
    one = stats.verdict([0.0], 0.01, floor=[0.001])
    assert one["verdict"] == "undecided" and one["seeds_to_decide"] is None and "one seed" in one["reason"]
    # without a floor the interval alone decides, and the result says the spread was not checked
    alone = stats.verdict([0.001, -0.002, 0.0005], 0.01)
    assert alone["verdict"] == "equivalent" and alone["spread_ok"] is None and "not checked" in alone["reason"]
    assert stats.verdict([0.30, 0.35], 0.01)["verdict"] == "different"


def test_the_spread_test_is_an_f_test():
    # F(2, 2): P(F ≥ x) = 1 / (1 + x), so 19 is its 95 % point; F(1, 1): 2/π · atan(1/√x)
    for x in (0.5, 3.0, 19.0, 400.0):
        assert stats.f_sf(x, 2, 2) == pytest.approx(1 / (1 + x), rel=1e-10)
        assert stats.f_sf(x, 1, 1) == pytest.approx(2 / math.pi * math.atan(1 / math.sqrt(x)), rel=1e-10)
    assert not stats.spread_exceeds(4.3, 3, 1.0, 3) and stats.spread_exceeds(4.4, 3, 1.0, 3)
    assert stats.spread_exceeds(1e-9, 3, 0.0, 3) and not stats.spread_exceeds(0.0, 3, 0.0, 3)
    # a correct backend's spread, 1.5× a floor's at three seeds each, is no reason to withhold the verdict
    v = stats.verdict([0.0006, -0.0006, 0.0], 0.01, [0.0004, -0.0004, 0.0])
    assert v["spread_ok"] and v["verdict"] == "equivalent"


def test_seeds_to_decide():
    # margin 0.006 at sd 0.0056: t·sd/√n is 2.3534·0.0056/2 = 0.00659 at n = 4, 2.1318·0.0056/√5 = 0.00534 at 5
    assert stats.seeds_to_decide(0.004, 0.0056, 0.01) == (5, "equivalent")
    assert T95[3] * 0.0056 / 2 >= 0.006 > T95[4] * 0.0056 / math.sqrt(5)
    # |mean| 0.02 > tol: t/√n < 0.02/0.03 first at n = 9 (1.8946/√8 = 0.670, 1.8595/3 = 0.620)
    assert stats.seeds_to_decide(0.02, 0.03, 0.01) == (9, "different")
    assert T95[7] / math.sqrt(8) >= 2 / 3 > T95[8] / 3
    # with a floor at 0 ± 0.003 the intervals must also part: t·0.006/√n < 0.02, 0.0268 at n = 2, 0.0101 at 3
    assert stats.seeds_to_decide(0.02, 0.003, 0.01, 0.0, 0.003) == (3, "different")
    # a spread above the floor's rules out equivalence, a mean on the floor's rules out a difference
    assert stats.seeds_to_decide(0.0, 0.001, 0.01, 0.0, 1e-5) is None
    # twice the floor's spread is no evidence of more noise at two seeds each (F = 4 < 161.4, F(1, 1)'s 95 %)
    assert stats.seeds_to_decide(0.0, 0.001, 0.01, 0.0, 0.0005) == (2, "equivalent")
    assert stats.seeds_to_decide(0.005, 1e-4, 0.01) == (2, "equivalent")      # both at n = 2: equivalence first
    assert stats.seeds_to_decide(0.0, 0.0, 0.01) == (2, "equivalent")
    assert stats.seeds_to_decide(0.0, math.nan, 0.01) is None
    v = stats.verdict([0.005, 0.009, -0.002], 0.01)       # mean 0.004, sd 0.00557: as above
    assert v["verdict"] == "undecided" and v["seeds_to_decide"] == (5, "equivalent")
    assert "5 seeds would decide (equivalent)" in v["reason"]


def test_window_standard_error_and_the_windows_that_bring_it_under():
    # differences 0.01, 0.03, 0.02, 0.04 over four windows: sd 0.0129, SE 0.00645; 0.002 needs ⌈4·(SE/0.002)²⌉ = 42
    ref = np.array([3.0, 2.0, 2.5, 1.0])
    se = stats.paired_window_se(ref, ref + [0.01, 0.03, 0.02, 0.04])
    assert se == pytest.approx(math.sqrt(5e-4 / 3) / 2)
    assert stats.windows_for_se(se, 4) == 42
    assert stats.windows_for_se(0.004, 100) == 401            # exactly 0.002 at 400 windows: one more
    assert stats.paired_window_se(ref, ref) == 0.0


def test_final_slope_is_the_least_squares_slope_of_the_last_three():
    assert stats.final_slope([5, 10, 15, 20], [9.0, 3.0, 2.5, 2.0]) == pytest.approx(-0.1)
    assert stats.final_slope([10, 20, 30], [3.0, 2.0, 2.5]) == pytest.approx(-0.025)
    assert math.isnan(stats.final_slope([20], [2.0]))


def test_exit_status():
    c = {"a": {"verdict": "equivalent"}, "f~": {"verdict": "different"}}
    assert report.exit_status(c, "f~") == 0                                   # the floor's row is no verdict
    assert report.exit_status({**c, "b": {"verdict": "undecided"}}, "f~") == 2
    assert report.exit_status({**c, "b": {"verdict": "undecided"}, "d": {"verdict": "different"}}, None) == 1
