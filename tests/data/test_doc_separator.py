"""Document separators and packing: <|endoftext|> before each WikiText article (title rows) or each row of other
sources, in shards of their own; the flag off gives today's plain stream; packed batches split at the separators;
evaluation's word perplexity reads the plain stream; a packed training run goes end to end on `naive`."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from data.config import DataConfig, DataSourceError
from data.prepare import check_sources, prepare_split
from data.sampler import BatchSampler, cu_seqlens, separator_token
from data.shards import ShardError
from data.tokenizer import EOT, get_tokenizer

quiet = lambda *_: None  # noqa: E731
ARTICLES = [" \n", " = Alpha = \n", " \n", " Alpha is a letter . \n", " \n", " = = History = = \n", " \n",
            " It came first . \n", " \n", " = Beta = \n", " \n", " Beta follows . \n", " \n", " = C = \n",
            " Short . \n"]


def wikitext_dir(tmp_path):
    raw = tmp_path / "wikitext"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        (raw / f"wiki.{split}.raw").write_text("".join(ARTICLES))
    return raw


def cfg_for(tmp_path, source, bpe_file, **kw) -> DataConfig:
    return DataConfig(source=f"local:{source}", cache_dir=str(tmp_path / "cache"), tokenizer_file=str(bpe_file),
                      num_proc=1, **kw)


def test_wikitext_articles_get_a_separator_and_the_flag_keeps_the_plain_stream(tmp_path, bpe_file):
    raw = wikitext_dir(tmp_path)
    enc = get_tokenizer(str(bpe_file))
    plain = prepare_split(cfg_for(tmp_path, raw, bpe_file), "train", log=quiet)
    docs = prepare_split(cfg_for(tmp_path, raw, bpe_file, doc_separator=True), "train", log=quiet)
    expect_plain = [t for row in ARTICLES for t in enc.encode_ordinary(row)]
    assert plain.get(0, len(plain)).tolist() == expect_plain            # today's stream, byte for byte
    assert plain.folder.name == "train" and docs.folder.name == "train-docs"
    expect = [t for row in ARTICLES for t in ([EOT] if row.startswith(" = ") and not row.startswith(" = = ")
                                              else []) + enc.encode_ordinary(row)]
    got = docs.get(0, len(docs)).tolist()
    assert got == expect and got.count(EOT) == 3 == docs.meta["n_docs"]   # Alpha, Beta, C; no section
    assert docs.meta["doc_separator"] and not plain.meta["doc_separator"]
    assert {k: docs.meta[k] for k in ("n_words", "n_words_eol", "n_bytes")} == \
        {k: plain.meta[k] for k in ("n_words", "n_words_eol", "n_bytes")}  # the text's counts are unchanged
    again = prepare_split(cfg_for(tmp_path, raw, bpe_file, doc_separator=True), "train", log=pytest.fail)
    assert again.get(0, len(again)).tolist() == got                      # cached, not rebuilt


def test_other_local_sources_separate_rows(tmp_path, bpe_file):
    src = tmp_path / "rows"
    src.mkdir()
    rows = ["first document\n", "\n", "second one\n", "third\n"]
    for split in ("train", "valid", "test"):
        (src / f"{split}.txt").write_text("".join(rows))
    enc = get_tokenizer(str(bpe_file))
    store = prepare_split(cfg_for(tmp_path, src, bpe_file, doc_separator=True), "train", log=quiet)
    expect = [t for r in rows for t in ([EOT] if r.strip() else []) + enc.encode_ordinary(r)]
    assert store.get(0, len(store)).tolist() == expect


def test_packed_batches_split_at_separators(tmp_path, bpe_file):
    raw = wikitext_dir(tmp_path)
    store = prepare_split(cfg_for(tmp_path, raw, bpe_file, doc_separator=True), "train", log=quiet)
    sep = separator_token(store, True)
    x, _ = BatchSampler(store, 8, 3, seed=1).batch(0)
    cu = cu_seqlens(x, sep)
    flat = x.flatten()
    starts = sorted(set(range(0, x.numel(), 8)) | set(np.flatnonzero(flat.numpy() == EOT).tolist()))
    assert cu.dtype == torch.int32 and cu.tolist() == starts + [x.numel()]


def test_packing_needs_separators(tmp_path, bpe_file):
    raw = wikitext_dir(tmp_path)
    with pytest.raises(DataSourceError, match="--data.doc_separator=true"):
        check_sources(cfg_for(tmp_path, raw, bpe_file, varlen=True), ["train"])
    plain = prepare_split(cfg_for(tmp_path, raw, bpe_file), "train", log=quiet)
    with pytest.raises(ShardError, match="--data.doc_separator=true"):
        separator_token(plain, True)
    assert separator_token(plain, False) is None
    with pytest.raises(DataSourceError, match="no documents.*--data.doc_separator=false"):
        prepare_split(DataConfig(source="synthetic", cache_dir=str(tmp_path / "c"), doc_separator=True), "train")


def test_word_perplexity_reads_the_plain_stream(tmp_path, monkeypatch):
    import eval.perplexity as perplexity
    from config import Config

    seen = []

    def record(data, split, **kw):
        seen.append(data.doc_separator)
        raise RuntimeError("recorded")

    monkeypatch.setattr(perplexity, "prepare_split", record)
    cfg = Config()
    cfg.data.doc_separator = cfg.data.varlen = True
    with pytest.raises(RuntimeError, match="recorded"):
        perplexity.evaluate_split(None, cfg, "test", 16, 16, 1)
    assert seen == [False]


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_a_packed_run_trains_on_naive_and_chunk_and_gpt2_fused_is_refused(tmp_path, bpe_file):
    import train
    from config import ConfigError

    raw = wikitext_dir(tmp_path)
    args = ["--config", "configs/smoke.yaml", f"--train.out_dir={tmp_path / 'runs'}",
            f"--data.cache_dir={tmp_path / 'cache'}", f"--data.source=local:{raw}", f"--data.tokenizer_file={bpe_file}",
            "--data.doc_separator=true", "--data.varlen=true", "--data.seq_len=16", "--model.vocab_size=50304",
            "--model.d_model=32", "--model.n_layers=1", "--model.head_k_dim=8", "--model.head_v_dim=8",
            "--model.mlp_hidden=64", "--train.micro_batch_size=2", "--train.max_steps=2", "--train.log_interval=1",
            "--train.eval_interval=2", "--train.eval_batches=1", "--train.progress=false"]
    result = train.main(args)
    assert result["steps"] == 2 and np.isfinite(result["loss"]) and np.isfinite(result["val_loss"])
    from tests.helpers import reset_accelerate
    reset_accelerate()
    # train.py takes packing on chunk (one step: the model-level equality is tests/model/test_varlen.py's)
    chunk = train.main(args + ["--backend", "chunk", "--train.name=chunk", "--train.max_steps=1",
                               "--train.eval_interval=0", "--model.chunk_size=16"])   # documents start chunks
    assert chunk["steps"] == 1 and np.isfinite(chunk["loss"])
    with pytest.raises(ConfigError, match="data.varlen.*GPT-2's attention.*--backend naive or fla"):
        train.main(args + ["--backend", "fused", "--model.family=gpt2", "--train.name=gpt2"])
