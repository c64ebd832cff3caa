"""Deterministic batches: a pure function of (seed, step, micro-step, rank).

The token stream is cut into non-overlapping windows of seq_len + 1 tokens (inputs and shifted
targets). Each epoch visits every window once in an order drawn from (seed, epoch). Optimizer
step `s` consumes global rows [s·G, (s+1)·G) of that endless sequence, G = micro_batch · accum ·
world; rank r's micro-step m takes rows (m·world + r)·micro_batch + [0, micro_batch). Validation
takes the first eval_batches·micro_batch windows, split across ranks.

With a `bos` token (data.bos) every window starts with it: the input is bos followed by the window's first
seq_len − 1 tokens and the targets are its seq_len tokens, so no position starts from an empty recurrent state
in the middle of a document, and the window's first token is predicted as a document start.

With packed documents (data.varlen) the windows are the same, and `cu_seqlens(x, eot)` gives the model their
document boundaries: a document starts at each row's first token and at every <|endoftext|> input (the separator
data.doc_separator writes before each document acts as its first token, so it predicts the document's first word
from an empty state, and the previous document's last token still predicts the separator).

Consequences: the same rows in the same order for every backend (parity), resuming at step s needs
no sampler state, and a global batch is the same set of rows whatever the world size.
"""
from __future__ import annotations

import numpy as np
import torch

from data.shards import ShardError, TokenStore


class BatchSampler:
    def __init__(self, store: TokenStore, seq_len: int, micro_batch: int, grad_accum: int = 1,
                 world_size: int = 1, rank: int = 0, seed: int = 0, bos: int | None = None):
        self.store, self.T, self.bos = store, seq_len, bos
        self.n_windows = (len(store) - 1) // seq_len
        if self.n_windows < 1:
            raise ShardError(f"{store.folder}: {len(store)} tokens is too few for seq_len {seq_len}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of {world_size}")
        self.mb, self.accum, self.world, self.rank, self.seed = micro_batch, grad_accum, world_size, rank, seed
        self._perm_epoch, self._perm = -1, None

    @property
    def global_batch(self) -> int:
        return self.mb * self.accum * self.world

    def _window(self, row: int) -> int:
        epoch, pos = divmod(row, self.n_windows)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
            self._perm_epoch = epoch
        return int(self._perm[pos])

    def rows(self, step: int, micro: int) -> list[int]:
        base = step * self.global_batch + (micro * self.world + self.rank) * self.mb
        return list(range(base, base + self.mb))

    def windows(self, step: int, micro: int) -> list[int]:
        return [self._window(r) for r in self.rows(step, micro)]

    def batch(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each int64 [micro_batch, seq_len]."""
        return windows_to_batch(self.store, self.windows(step, micro), self.T, self.bos)

    def epoch_of(self, step: int) -> float:
        return step * self.global_batch / self.n_windows


def windows_to_batch(store: TokenStore, windows: list[int], T: int,
                     bos: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), int64 [len(windows), T]: window w is stream tokens [w·T, w·T + T]; with `bos`, the
    inputs are bos then tokens [w·T, w·T + T − 1) and the targets tokens [w·T, w·T + T)."""
    buf = np.stack([store.get(w * T, T + 1) for w in windows])
    t = torch.from_numpy(buf)
    if bos is not None:
        return torch.cat([torch.full_like(t[:, :1], bos), t[:, :T - 1]], 1), t[:, :T].contiguous()
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def cu_seqlens(x: torch.Tensor, eot: int) -> torch.Tensor:
    """Document offsets of a batch x int64 [B, T] in fla's convention: int32 (N + 1,), rising from 0 to B·T over
    the flattened [1, B·T] stream, with a start at every row's first token and every position where x is eot."""
    B, T = x.shape
    start = x == eot                                                               # [B, T]
    start[:, 0] = True
    idx = start.flatten().nonzero().flatten()
    return torch.cat([idx, idx.new_tensor([B * T])]).to(torch.int32)


def separator_token(store: TokenStore, varlen: bool) -> int | None:
    """The document separator packed training splits at (data.varlen), checked to be in the shards' stream."""
    if not varlen:
        return None
    if not store.meta.get("doc_separator"):
        raise ShardError(f"data.varlen packs documents at their <|endoftext|> separators, and {store.folder} has "
                         "none; add --data.doc_separator=true")
    return int(store.meta["eot"])


def bos_token(store: TokenStore, enabled: bool) -> int | None:
    """The token that starts every window when data.bos is on: the tokenizer's <|endoftext|>."""
    if not enabled:
        return None
    eot = store.meta.get("eot")
    if eot is None:
        raise ShardError(f"data.bos needs an end-of-text token, and {store.folder} has none (synthetic data); "
                         "pass --data.bos=false")
    return int(eot)


def eval_windows(store: TokenStore, seq_len: int, micro_batch: int, n_batches: int) -> int:
    """Windows validation scores: n_batches·micro_batch, or all the split holds if that is fewer."""
    return min(n_batches * micro_batch, (len(store) - 1) // seq_len)


def eval_batches(store: TokenStore, seq_len: int, micro_batch: int, n_batches: int,
                 world_size: int = 1, rank: int = 0, bos: int | None = None):
    """The first n_batches·micro_batch windows in stream order, this rank's share, batched: the same
    windows whatever the world size, so validation losses compare across GPU counts."""
    mine = list(range(rank, eval_windows(store, seq_len, micro_batch, n_batches), world_size))
    for i in range(0, len(mine), micro_batch):
        yield windows_to_batch(store, mine[i:i + micro_batch], seq_len, bos)


def max_eval_batches(store: TokenStore, seq_len: int, micro_batch: int, n_batches: int, world_size: int = 1) -> int:
    """The most batches eval_batches gives any rank (rank 0's share is never smaller than another's)."""
    share = len(range(0, eval_windows(store, seq_len, micro_batch, n_batches), world_size))
    return -(-share // micro_batch)
