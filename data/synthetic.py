"""A seeded stationary Markov source with a known entropy rate: a no-download training source.

Tokens follow an order-`k` Markov chain over `V` symbols: the law of the next token depends on the
previous `k` tokens and is drawn once from Dirichlet(α). The chain is started from its stationary
distribution, so every position is distributed alike and the best achievable loss per token is
the entropy rate  H = Σ_s π(s) · H(P(·|s))  (nats), which a model can only reach by using context
(for k ≥ 2, through its token mixer).
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from data.config import DataSourceError, SyntheticConfig


class MarkovSource:
    def __init__(self, cfg: SyntheticConfig):
        if cfg.order < 1 or cfg.vocab_size < 2:
            raise DataSourceError("synthetic source needs order ≥ 1 and vocab_size ≥ 2")
        if cfg.vocab_size ** cfg.order > 2 ** 22:
            raise DataSourceError(f"synthetic source: {cfg.vocab_size}^{cfg.order} contexts is too many")
        self.cfg = cfg
        self.V, self.k = cfg.vocab_size, cfg.order
        rng = np.random.default_rng([cfg.seed, 0])
        # P[s, t]: probability of token t after context s (s = base-V number of the last k tokens)
        self.P = rng.dirichlet(np.full(self.V, cfg.concentration), size=self.V ** self.k)
        self.P = np.maximum(self.P, 1e-12)
        self.P /= self.P.sum(1, keepdims=True)

    @cached_property
    def stationary(self) -> np.ndarray:
        """π over contexts, by power iteration: π'(s') = Σ_s π(s) P(s → s')."""
        n = self.V ** self.k
        pi = np.full(n, 1.0 / n)
        for _ in range(10_000):
            # context s = (t_1..t_k) moves to (t_2..t_k, t) with probability P[s, t]
            flow = (pi[:, None] * self.P).reshape(self.V, n // self.V, self.V)  # [t_1, t_2..t_k, t]
            new = flow.sum(0).reshape(n)
            if np.abs(new - pi).sum() < 1e-13:
                return new
            pi = new
        raise RuntimeError("synthetic source: stationary distribution did not converge")

    @cached_property
    def entropy_rate(self) -> float:
        """Nats per token."""
        h = -(self.P * np.log(self.P)).sum(1)
        return float(self.stationary @ h)

    def sample(self, n_tokens: int, stream: int, n_chains: int = 1024) -> np.ndarray:
        """`n_tokens` tokens as `n_chains` independent stationary chains laid end to end.

        `stream` selects an independent sample (train, valid, test use different streams).
        A chain boundary is one token out of n_tokens/n_chains without its true context.
        """
        rng = np.random.default_rng([self.cfg.seed, 1, stream])
        n_chains = max(1, min(n_chains, n_tokens // (4 * self.k)))
        length = -(-n_tokens // n_chains)
        n = self.V ** self.k
        cdf = np.cumsum(self.P, 1)
        cdf[:, -1] = 1.0
        state = rng.choice(n, size=n_chains, p=self.stationary)            # [chains]
        out = np.empty((n_chains, self.k + length), dtype=np.int64)
        for i in range(self.k):                                             # unpack the first context
            out[:, i] = (state // self.V ** (self.k - 1 - i)) % self.V
        for t in range(length):
            u = rng.random(n_chains)[:, None]
            nxt = (cdf[state] < u).sum(1)                                   # inverse-CDF sampling
            out[:, self.k + t] = nxt
            state = (state * self.V + nxt) % n
        return out.reshape(-1)[:n_tokens]
