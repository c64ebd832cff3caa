"""The sampler is a pure function of (seed, step, micro, rank): deterministic, resumable,
sharded without overlap, and invariant to how a global batch is split across ranks."""
from __future__ import annotations

import pytest

from data.config import DataConfig, SyntheticConfig
from data.prepare import prepare_split
from data.sampler import BatchSampler, bos_token, eval_batches, max_eval_batches
from data.shards import ShardError


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    cfg = DataConfig(source="synthetic", cache_dir=str(tmp_path_factory.mktemp("cache")),
                     synthetic=SyntheticConfig(vocab_size=50, train_tokens=20_001, eval_tokens=2_000))
    return prepare_split(cfg, "train", log=lambda *_: None)


def test_deterministic(store):
    a, b = BatchSampler(store, 16, 4, seed=7), BatchSampler(store, 16, 4, seed=7)
    for step in (0, 3, 500):
        xa, ya = a.batch(step)
        xb, yb = b.batch(step)
        assert (xa == xb).all() and (ya == yb).all()
    assert not (a.batch(0)[0] == BatchSampler(store, 16, 4, seed=8).batch(0)[0]).all()


def test_targets_are_shifted_inputs(store):
    x, y = BatchSampler(store, 16, 4).batch(2)
    w = BatchSampler(store, 16, 4).windows(2, 0)[0]
    assert (x[0, 1:] == y[0, :-1]).all()
    assert (x[0].numpy() == store.get(w * 16, 16)).all()


def test_bos_starts_every_window_and_every_token_is_a_target(store):
    plain, bos = BatchSampler(store, 16, 4, seed=3), BatchSampler(store, 16, 4, seed=3, bos=49)
    for step in (0, 7):
        (x, _), (xb, yb) = plain.batch(step), bos.batch(step)
        w = bos.windows(step, 0)
        assert w == plain.windows(step, 0)                                  # the same windows, in the same order
        assert (xb[:, 0] == 49).all() and (xb[:, 1:] == yb[:, :-1]).all()
        assert (yb[0].numpy() == store.get(w[0] * 16, 16)).all() and (yb == x).all()   # targets: the window's tokens
    xe, ye = next(eval_batches(store, 16, 4, 1, bos=49))
    assert (xe[:, 0] == 49).all() and (ye == next(eval_batches(store, 16, 4, 1))[0]).all()


def test_bos_needs_an_end_of_text_token(store):
    assert bos_token(store, False) is None
    with pytest.raises(ShardError, match="data.bos needs an end-of-text token.*--data.bos=false"):
        bos_token(store, True)
    store.meta["eot"] = 7
    try:
        assert bos_token(store, True) == 7
    finally:
        del store.meta["eot"]


def test_ranks_partition_the_global_batch(store):
    world, accum, mb = 4, 2, 3
    samplers = [BatchSampler(store, 16, mb, accum, world, r, seed=1) for r in range(world)]
    single = BatchSampler(store, 16, mb * world * accum, 1, 1, 0, seed=1)
    for step in (0, 5):
        got = sorted(w for s in samplers for m in range(accum) for w in s.windows(step, m))
        assert got == sorted(single.windows(step, 0))
        assert len(set(got)) == len(got)


def test_resume_needs_no_state(store):
    cont = BatchSampler(store, 16, 4, 2, seed=3)
    seen = [cont.windows(s, m) for s in range(30) for m in range(2)]
    fresh = BatchSampler(store, 16, 4, 2, seed=3)
    assert [fresh.windows(s, m) for s in range(17, 30) for m in range(2)] == seen[34:]


def test_each_epoch_visits_every_window_once(store):
    s = BatchSampler(store, 16, 1, seed=0)
    n = s.n_windows
    first = [s.windows(i, 0)[0] for i in range(n)]
    second = [s.windows(i, 0)[0] for i in range(n, 2 * n)]
    assert sorted(first) == list(range(n)) == sorted(second) and first != second


def test_eval_batches_split_across_ranks(store):
    one = [x for x, _ in eval_batches(store, 16, 2, 3)]
    two = [x for r in range(2) for x, _ in eval_batches(store, 16, 2, 3, world_size=2, rank=r)]
    three = [x for r in range(3) for x, _ in eval_batches(store, 16, 2, 3, world_size=3, rank=r)]
    rows = lambda bs: sorted(tuple(r.tolist()) for b in bs for r in b)  # noqa: E731
    assert len(rows(one)) == 6 and rows(one) == rows(two) == rows(three)
    for world in (1, 2, 3, 4):                                   # rank 0 has the most batches
        got = [len(list(eval_batches(store, 16, 2, 3, world_size=world, rank=k))) for k in range(world)]
        assert max_eval_batches(store, 16, 2, 3, world) == max(got) == got[0]
