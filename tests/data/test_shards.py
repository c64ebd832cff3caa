"""Token shards: built once and reused, rebuilt when the source changes, and a truncated or
corrupt shard is an error that names the file."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from data.config import DataConfig, SyntheticConfig
from data.prepare import prepare_split
from data.shards import ShardError, TokenStore, build
from data.tokenizer import get_tokenizer

quiet = lambda *_: None  # noqa: E731


def synthetic_cfg(tmp_path, **kw) -> DataConfig:
    return DataConfig(source="synthetic", cache_dir=str(tmp_path / "cache"),
                      synthetic=SyntheticConfig(vocab_size=30, train_tokens=5000, eval_tokens=700, **kw))


def test_prepare_is_idempotent(tmp_path):
    cfg = synthetic_cfg(tmp_path)
    logs = []
    a = prepare_split(cfg, "train", log=logs.append)
    shard = a.folder / a.meta["shards"][0]["file"]
    stamp = (shard.stat().st_ino, shard.stat().st_mtime_ns)
    b = prepare_split(cfg, "train", log=logs.append)
    assert len(logs) == 1 and (shard.stat().st_ino, shard.stat().st_mtime_ns) == stamp
    assert (a.get(0, len(a)) == b.get(0, len(b))).all() and len(a) == 5000
    assert a.meta["entropy_rate"] > 0 and a.vocab_size == 30


def test_changed_source_rebuilds(tmp_path):
    a = prepare_split(synthetic_cfg(tmp_path), "train", log=quiet).get(0, 5000)
    b = prepare_split(synthetic_cfg(tmp_path, seed=1), "train", log=quiet).get(0, 5000)
    assert not (a == b).all()


def test_truncated_shard_is_an_error_naming_it(tmp_path):
    store = prepare_split(synthetic_cfg(tmp_path), "valid", log=quiet)
    shard = store.folder / "shard_0000.bin"
    with open(shard, "r+b") as f:
        f.truncate(100)
    with pytest.raises(ShardError, match=f"{shard}.*truncated"):
        prepare_split(synthetic_cfg(tmp_path), "valid", log=quiet)


def test_corrupt_shard_is_an_error_naming_it(tmp_path):
    store = prepare_split(synthetic_cfg(tmp_path), "valid", log=quiet)
    shard = store.folder / "shard_0000.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=f"{shard}.*corrupt"):
        prepare_split(synthetic_cfg(tmp_path), "valid", log=quiet)


def test_interrupted_build_leaves_no_folder(tmp_path):
    folder = tmp_path / "x" / "train"

    def fail(writer):
        writer.append(np.arange(10))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build(folder, {"k": 1}, fail)
    assert not folder.exists() and os.listdir(folder.parent) == []


def test_reads_cross_shard_boundaries(tmp_path):
    folder = tmp_path / "s"
    tokens = np.random.default_rng(0).integers(0, 60000, 1000)

    def fill(writer):
        for part in np.array_split(tokens, 7):
            writer.append(part)
        return {"vocab_size": 60000}

    meta = build(folder, {"k": 2}, fill, max_shard_tokens=128)
    assert len(meta["shards"]) == 8
    store = TokenStore(folder)
    assert (store.get(0, 1000) == tokens).all() and (store.get(120, 300) == tokens[120:420]).all()


def test_local_text_directory(tmp_path, bpe_file):
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = {"train": " = Title = \n \n Some words here .\n", "valid": " A valid line , with 3 numbers .\n",
             "test": " The test split .\n \n Two lines .\n"}
    for split, text in lines.items():
        (raw / f"wiki.{split}.raw").write_text(text)
    cfg = DataConfig(source=f"local:{raw}", cache_dir=str(tmp_path / "cache"), tokenizer_file=str(bpe_file))
    enc = get_tokenizer(str(bpe_file))
    for split, text in lines.items():
        store = prepare_split(cfg, split, log=quiet)
        assert store.get(0, len(store)).tolist() == enc.encode_ordinary(text)
        assert store.meta["n_words"] == len(text.split())
        assert store.meta["n_words_eol"] == len(text.split()) + text.count("\n")      # one end-of-line per line
        assert store.meta["n_bytes"] == len(text.encode())
    # editing the raw text invalidates the shards
    (raw / "wiki.test.raw").write_text(" Changed .\n")
    assert prepare_split(cfg, "test", log=quiet).get(0, 2).tolist() == enc.encode_ordinary(" Changed .\n")[:2]
    meta = json.loads((store.folder / "meta.json").read_text())
    assert meta["fingerprint"]["tokenizer"].startswith("gpt2:50257:")


def test_missing_split_file_is_named(tmp_path):
    (tmp_path / "train.txt").write_text("x\n")
    cfg = DataConfig(source=str(tmp_path), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="no 'valid' split in .*wiki.valid.raw"):
        prepare_split(cfg, "valid", log=quiet)
