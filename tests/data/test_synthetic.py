"""The synthetic Markov source knows its entropy rate, and its samples agree with it."""
from __future__ import annotations

import numpy as np

from data.config import SyntheticConfig
from data.synthetic import MarkovSource


def test_stationary_distribution_is_stationary():
    s = MarkovSource(SyntheticConfig(vocab_size=5, order=2, concentration=0.5, seed=3))
    pi, V = s.stationary, 5
    nxt = (pi[:, None] * s.P).reshape(V, V, V).sum(0).reshape(-1)
    assert np.allclose(nxt, pi, atol=1e-12) and np.isclose(pi.sum(), 1)


def test_empirical_conditional_entropy_matches_rate():
    cfg = SyntheticConfig(vocab_size=6, order=2, concentration=0.3, seed=1)
    s = MarkovSource(cfg)
    x = s.sample(400_000, stream=0)
    ctx = x[:-2] * 6 + x[1:-1]
    counts = np.zeros((36, 6))
    np.add.at(counts, (ctx, x[2:]), 1)
    p = counts / counts.sum(1, keepdims=True).clip(1)
    h = -(counts * np.log(np.where(p > 0, p, 1))).sum() / counts.sum()
    assert abs(h - s.entropy_rate) < 0.01


def test_deterministic_and_streams_differ():
    cfg = SyntheticConfig(vocab_size=8, order=1, seed=5)
    a, b = MarkovSource(cfg).sample(5000, stream=0), MarkovSource(cfg).sample(5000, stream=0)
    c = MarkovSource(cfg).sample(5000, stream=1)
    assert (a == b).all() and not (a == c).all() and a.min() >= 0 and a.max() < 8
