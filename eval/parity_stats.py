"""The statistics of a parity test: is a backend's final validation loss the reference's, over seeds?

Pure functions on arrays of paired differences. For seeds s = 1..n, Δ_s = loss(backend, s) − loss(reference, s),
both runs trained from the same initial weights on the same data order, so the seed's own effect cancels.

  mean      Δ̄ = Σ Δ_s / n
  spread    sd = √(Σ (Δ_s − Δ̄)² / (n − 1))                     (undefined at n = 1)
  interval  Δ̄ ± t_{1−α/2, n−1} · sd / √n, α = 0.10              (90 %; infinite at n = 1)

  equivalent  the 90 % interval lies inside (−tol, +tol): the two one-sided tests H0: μ ≤ −tol and H0: μ ≥ +tol
              both reject at 5 % (TOST); and, when a floor was run (the same backend re-summed, its Δ_s the
              rounding-only drift of two correct runs), the spread is no larger than the floor's: the one-sided
              F-test of H0: var(Δ) ≤ var(floor), F = sd² / sd_floor² on (n − 1, m − 1) degrees of freedom, does not
              reject at 5 %. (Comparing the two sample sd's directly would fail a correct backend, one whose spread
              is the floor's, at every other try; at three seeds each, sd up to √19 = 4.4 × sd_floor passes.)
  different   the interval excludes 0 and is disjoint from the floor's interval (without a floor: excludes 0)
  undecided   otherwise, with the fewest seeds n' ≥ 2 that would decide at the observed means and spreads:
              equivalent once t_{0.95, n'−1} · sd / √n' < tol − |Δ̄| (and the F-test passes at n' seeds each),
              different once that half-width is below |Δ̄|
              and t_{0.95, n'−1} · (sd + sd_floor) / √n' < |Δ̄ − Δ̄_floor|
  TOST p      max(P(T ≥ (Δ̄ + tol)/se), P(T ≥ (tol − Δ̄)/se)), se = sd/√n: below 0.05 exactly when the interval
              lies inside ±tol

  paired window SE  for one seed, d_w = loss_w(backend) − loss_w(reference) over the W held-out windows:
                    SE = sd(d_w) / √W; windows for a target SE: ⌈W · (SE / target)²⌉
  final slope       least-squares slope of the validation loss over the last three evaluations (nats/step)

Student's t quantile comes from the regularized incomplete beta function (a continued fraction), so that
numpy is the only dependency.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike

CONFIDENCE = 0.90          # two-sided: each one-sided test at 5 %
WINDOW_SE_TARGET = 0.002   # nats: the per-comparison evaluation noise the report warns above


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b), x in [0, 1]."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with df degrees of freedom: 1 − ½ I_{df/(df+t²)}(df/2, ½) for t ≥ 0."""
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def f_sf(x: float, d1: float, d2: float) -> float:
    """P(F ≥ x) for Snedecor's F with (d1, d2) degrees of freedom: I_{d2/(d2 + d1·x)}(d2/2, d1/2), x ≥ 0."""
    return 1.0 if x <= 0 else betainc(d2 / 2, d1 / 2, d2 / (d2 + d1 * x))


def spread_exceeds(sd: float, n: int, floor_sd: float, m: int, alpha: float = 0.05) -> bool:
    """Whether the spread sd of n differences is significantly larger than floor_sd of m: the one-sided F-test of
    H0: var ≤ var_floor rejects at `alpha` (F = sd² / floor_sd², (n − 1, m − 1) degrees of freedom)."""
    if sd == 0:
        return False
    if floor_sd == 0:
        return True
    return f_sf((sd / floor_sd) ** 2, n - 1, m - 1) < alpha


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (df > 0; df = inf gives the normal's), by bisection on t_cdf."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo <= 1e-13 * hi:
            break
    return (lo + hi) / 2


def paired_interval(deltas: ArrayLike, confidence: float = CONFIDENCE) -> dict:
    """{n, mean, sd, lo, hi} of paired differences: the Student t interval, infinite (and sd nan) at n = 1."""
    d = np.asarray(deltas, dtype=np.float64)
    if d.ndim != 1 or d.size == 0 or not np.isfinite(d).all():
        raise ValueError(f"need one or more finite differences, got {deltas!r}")
    n, mean = d.size, float(d.mean())
    if n == 1:
        return {"n": 1, "mean": mean, "sd": math.nan, "lo": -math.inf, "hi": math.inf}
    sd = float(d.std(ddof=1))
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "lo": mean - half, "hi": mean + half}


def tost_pvalue(deltas: ArrayLike, tolerance: float) -> float:
    """The p-value of the two one-sided tests of H0: μ ≤ −tolerance and H0: μ ≥ +tolerance on paired differences:
    max(P(T ≥ (Δ̄ + tol)/se), P(T ≥ (tol − Δ̄)/se)), T ~ t_{n−1}, se = sd/√n. Below 0.05 exactly when the 90 %
    interval lies inside ±tolerance; 1 at one seed (no spread, nothing is shown); at sd = 0, 0 inside, 1 outside."""
    s = paired_interval(deltas)
    if s["n"] == 1:
        return 1.0
    if s["sd"] == 0:
        return 0.0 if abs(s["mean"]) < tolerance else 1.0
    se, df = s["sd"] / math.sqrt(s["n"]), s["n"] - 1
    return max(1 - t_cdf((s["mean"] + tolerance) / se, df), 1 - t_cdf((tolerance - s["mean"]) / se, df))


def _smallest_n(c: float, q: float, limit: int = 10**9) -> int | None:
    """The smallest n ≥ 2 with t_{q, n−1} / √n < c (the left side falls strictly with n), None beyond `limit`."""
    def fits(n: int) -> bool:
        return t_quantile(q, n - 1) / math.sqrt(n) < c

    if fits(2):
        return 2
    lo, hi = 2, 4
    while not fits(hi):
        if hi > limit:
            return None
        lo, hi = hi, 2 * hi
    while hi - lo > 1:              # fits(hi), not fits(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def seeds_to_decide(mean: float, sd: float, tolerance: float, floor_mean: float | None = None,
                    floor_sd: float | None = None, confidence: float = CONFIDENCE) -> tuple[int, str] | None:
    """The fewest seeds n ≥ 2 at which this mean and spread (and the floor's, both measured over n seeds) would
    decide, and the verdict they would give: (n, 'equivalent') when t_{1−α/2, n−1}·sd/√n < tolerance − |mean| (and
    the spread passes the F-test against floor_sd at n seeds each), (n, 'different') when the interval excludes 0 (t·sd/√n < |mean|) and misses the floor's
    (t·(sd + floor_sd)/√n < |mean − floor_mean|); equivalence first when both come at the same n. None when
    neither can (|mean| ≥ tolerance with the mean on the floor's, say) or the spread is unknown (one seed)."""
    if not math.isfinite(sd) or (floor_sd is not None and not math.isfinite(floor_sd)):
        return None
    q = 1 - (1 - confidence) / 2

    def needed(margin: float, spread: float) -> int | None:
        if margin <= 0:
            return None
        return 2 if spread == 0 else _smallest_n(margin / spread, q)

    equivalent = needed(tolerance - abs(mean), sd)
    if equivalent is not None and floor_sd is not None and spread_exceeds(sd, equivalent, floor_sd, equivalent):
        equivalent = None       # the F-test only grows stricter with more seeds
    different = needed(abs(mean), sd)
    if different is not None and floor_sd is not None:
        beyond = needed(abs(mean - floor_mean), sd + floor_sd)
        different = None if beyond is None else max(different, beyond)
    if equivalent is None and different is None:
        return None
    if different is None or (equivalent is not None and equivalent <= different):
        return equivalent, "equivalent"
    return different, "different"


def verdict(deltas: ArrayLike, tolerance: float, floor: ArrayLike | None = None, confidence: float = CONFIDENCE) -> dict:
    """The interval of `deltas` and its verdict against ±tolerance and, when given, the floor's differences.

    Returns paired_interval's keys plus: tost_p (tost_pvalue at this tolerance), inside (the interval within
    ±tolerance), excludes_zero, spread_ok (the spread not significantly above the floor's: spread_exceeds is
    False; None without a floor or with one seed),
    outside_floor (the intervals disjoint; None without a floor), verdict ('equivalent' | 'different' |
    'undecided'), seeds_to_decide (for an undecided one: seeds_to_decide's (n, verdict) or None) and reason."""
    s = paired_interval(deltas, confidence)
    f = paired_interval(floor, confidence) if floor is not None else None
    inside = -tolerance < s["lo"] and s["hi"] < tolerance
    excludes_zero = s["lo"] > 0 or s["hi"] < 0
    spread_ok = outside_floor = None
    if f is not None:
        if math.isfinite(s["sd"]) and math.isfinite(f["sd"]):
            spread_ok = not spread_exceeds(s["sd"], s["n"], f["sd"], f["n"])
        outside_floor = s["lo"] > f["hi"] or s["hi"] < f["lo"]
    need = None
    if inside and spread_ok is not False:
        v, reason = "equivalent", "interval inside ±tolerance" + ("" if f is not None else "; spread not checked "
                                                                  "(no floor)")
    elif excludes_zero and outside_floor is not False:
        v, reason = "different", "interval excludes 0" + (" and misses the floor's" if f is not None else
                                                          "; floor not checked (no floor)")
    else:
        v = "undecided"
        need = seeds_to_decide(s["mean"], s["sd"], tolerance, f["mean"] if f else None, f["sd"] if f else None,
                               confidence)
        if s["n"] == 1:
            reason = "one seed: no spread, the interval is infinite"
        elif need is None:
            reason = "no number of seeds decides at this mean and spread"
        else:
            reason = f"{need[0]} seeds would decide ({need[1]}) at this spread"
        if spread_ok is False:
            reason += f"; spread {s['sd']:.2g} exceeds the floor's {f['sd']:.2g} (F-test at 5 %)"
    return {**s, "tost_p": tost_pvalue(deltas, tolerance), "inside": inside, "excludes_zero": excludes_zero,
            "spread_ok": spread_ok, "outside_floor": outside_floor, "verdict": v, "seeds_to_decide": need,
            "reason": reason}


def paired_window_se(reference: ArrayLike, other: ArrayLike) -> float:
    """sd(d_w) / √W of the per-window loss differences d_w = other_w − reference_w (W ≥ 2 windows)."""
    d = np.asarray(other, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    if d.ndim != 1 or d.size < 2:
        raise ValueError(f"need two or more paired windows, got {d.size}")
    return float(d.std(ddof=1) / math.sqrt(d.size))


def windows_for_se(se: float, windows: int, target: float = WINDOW_SE_TARGET) -> int:
    """Windows that bring a paired SE measured over `windows` under `target`: ⌈W · (SE/target)²⌉ (SE ∝ 1/√W),
    one more when that lands exactly on the target."""
    need = math.ceil(windows * (se / target) ** 2)
    return need + 1 if se > 0 and se / math.sqrt(need / windows) >= target else need


def final_slope(steps: ArrayLike, losses: ArrayLike, last: int = 3) -> float:
    """Least-squares slope (loss per step) over the last `last` evaluations; nan with fewer than two."""
    x, y = np.asarray(steps, dtype=np.float64)[-last:], np.asarray(losses, dtype=np.float64)[-last:]
    if x.size < 2:
        return math.nan
    x = x - x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())
