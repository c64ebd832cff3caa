"""The prepare step: turn a source's split into token shards once, then reuse them.

    store = prepare_split(cfg.data, "train")        # builds on first use, verifies afterwards
    python -m data.prepare --config configs/gla_125m.yaml   # all three splits ahead of a run

A text split's meta.json counts its raw text: `n_bytes` (UTF-8), `n_words` (whitespace-separated words) and
`n_words_eol` (each row's words plus one end-of-line token: WikiText-103's published word count, one row being
one line of the file, empty lines included). A TextRewrite (a detokenizer) changes the text that is tokenized,
not these counts, and its shards live in a folder of their own.

With data.doc_separator, `<|endoftext|>` is written before each document (data.sources.document_starts: a
WikiText article at its title row ` = Title = `, any other source each non-empty row), so the stream reads
EOT doc EOT doc ...: every document is predicted to end with EOT, and packed training (data.varlen) restarts the
model's state at each EOT. Those shards live in `<split>-docs` beside the plain ones, which stay as they were;
evaluation's published-convention perplexity always reads the plain stream.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.config import DataConfig, DataSourceError
from data.shards import TokenStore, build, is_current, read_meta
from data.sources import (SPLITS, Source, default_num_proc, document_starts, load_text, local_split_file,
                          parse_source, text_fingerprint)
from data.synthetic import MarkovSource
from data.tokenizer import EOT, get_tokenizer, tokenizer_fingerprint

# What meta.json records of a text split; part of the fingerprint, so folders written before a change are rebuilt
TEXT_META_VERSION = 2
# The document-separator rules (data.sources.document_starts); in the fingerprint of separated splits only, so
# plain folders stay valid and changed rules rebuild the separated ones
SEPARATOR_VERSION = "eot-before-doc:1"


@dataclass(frozen=True)
class TextRewrite:
    """A rewrite of each row's text before tokenization. `name` suffixes the split's cache folder
    (`<split>-<name>`, beside the plain one); `key` identifies the rules, so that changed rules rebuild it."""
    name: str
    key: str
    fn: Callable[[str], str]


def source_for(cfg: DataConfig, split: str) -> Source:
    spec = cfg.source if split == "train" or not cfg.eval_source else cfg.eval_source
    return parse_source(spec)


def check_sources(cfg: DataConfig, splits: list[str] | tuple[str, ...]) -> None:
    """Every split of `splits` can be found before any is tokenized: each source spec parses, and a local
    directory holds a file for each split it is to give (a hub dataset's splits are known only once loaded).
    Otherwise a missing valid split would be reported only after the train split's tokenization."""
    if cfg.varlen and not cfg.doc_separator:
        raise DataSourceError("data.varlen packs documents at their <|endoftext|> separators: add "
                              "--data.doc_separator=true (or leave --data.varlen=false)")
    for split in splits:
        if split not in SPLITS:
            raise DataSourceError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        src = source_for(cfg, split)
        if src.kind == "local":
            local_split_file(src, split)


def shard_folder(cfg: DataConfig, src: Source, split: str, rewrite: TextRewrite | None = None) -> Path:
    """`<cache_dir>/<source>/<split>[-<rewrite>][-docs]`: each stream in its own folder."""
    name = split + (f"-{rewrite.name}" if rewrite else "") + ("-docs" if separated(cfg, src) else "")
    return Path(cfg.cache_dir) / src.slug / name


def separated(cfg: DataConfig, src: Source) -> bool:
    """Whether this source's splits get document separators (text sources with data.doc_separator)."""
    return cfg.doc_separator and src.kind != "synthetic"


def _synthetic(cfg: DataConfig, split: str, folder: Path, log) -> dict:
    s = cfg.synthetic
    fingerprint = {"kind": "synthetic", "vocab_size": s.vocab_size, "order": s.order,
                   "concentration": s.concentration, "seed": s.seed, "split": split,
                   "n_tokens": s.train_tokens if split == "train" else s.eval_tokens}
    meta = read_meta(folder)
    if is_current(meta, fingerprint):
        return meta
    log(f"[data] generating synthetic {split} split ({fingerprint['n_tokens']:,} tokens) in {folder}")
    src = MarkovSource(s)

    def fill(writer):
        writer.append(src.sample(fingerprint["n_tokens"], stream=SPLITS.index(split)))
        return {"vocab_size": s.vocab_size, "entropy_rate": src.entropy_rate,
                "n_words": None, "n_words_eol": None, "n_bytes": None}

    return build(folder, fingerprint, fill)


def _text(cfg: DataConfig, src: Source, split: str, folder: Path, log, rewrite: TextRewrite | None) -> dict:
    text = text_fingerprint(src, split)  # a missing split file fails here, before any download
    enc = get_tokenizer(cfg.tokenizer_file or None)
    sep = separated(cfg, src)
    fingerprint = {"kind": src.kind, "text": text, "tokenizer": tokenizer_fingerprint(enc),
                   "meta": TEXT_META_VERSION, **({"rewrite": rewrite.key} if rewrite else {}),
                   **({"doc_separator": SEPARATOR_VERSION} if sep else {})}
    meta = read_meta(folder)
    if is_current(meta, fingerprint):
        return meta
    if meta is not None:
        log(f"[data] {folder}: metadata does not match this source/tokenizer/format; rebuilding")
    ds = load_text(src, split)
    num_proc = default_num_proc(len(ds), cfg.num_proc)
    log(f"[data] tokenizing {src.slug}/{split}: {len(ds):,} rows with {num_proc} process(es)")

    starts = document_starts(src, split) if sep else None

    def tokenize(batch):
        texts = batch["text"]
        words = [len(t.split()) for t in texts]
        encoded = [rewrite.fn(t) for t in texts] if rewrite else texts
        ids = enc.encode_ordinary_batch(encoded, num_threads=1)
        docs = [int(starts(t)) if sep else 0 for t in texts]
        ids = [[EOT] + i if d else i for i, d in zip(ids, docs)]
        return {"ids": ids, "n_words": words, "n_words_eol": [w + 1 for w in words],
                "n_bytes": [len(t.encode("utf-8")) for t in texts], "n_docs": docs}

    tok = ds.map(tokenize, batched=True, batch_size=1000, num_proc=num_proc if num_proc > 1 else None,
                 remove_columns=ds.column_names, desc=f"tokenize {split}", load_from_cache_file=False,
                 new_fingerprint=hashlib.sha256(json.dumps(fingerprint).encode()).hexdigest()[:16])

    def fill(writer):
        counts = dict.fromkeys(("n_words", "n_words_eol", "n_bytes", "n_docs"), 0)
        for tbl in tok.with_format("arrow").iter(batch_size=65_536):
            writer.append(tbl.column("ids").combine_chunks().flatten().to_numpy())
            for k in counts:
                counts[k] += int(np.asarray(tbl.column(k)).sum())
        return {"vocab_size": enc.n_vocab, "eot": EOT, "doc_separator": sep, **counts}

    return build(folder, fingerprint, fill)


def prepare_split(cfg: DataConfig, split: str, log=print, rewrite: TextRewrite | None = None) -> TokenStore:
    """Shards for `split` (train/valid/test), built if missing or stale, opened and verified; `rewrite`, for a
    text source, rewrites each row before it is tokenized (its counts stay those of the original row)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    src = source_for(cfg, split)
    folder = shard_folder(cfg, src, split, rewrite)
    if src.kind == "synthetic":
        if rewrite:
            raise DataSourceError(f"synthetic data has no text to rewrite ({rewrite.name})")
        if cfg.doc_separator or cfg.varlen:
            raise DataSourceError("synthetic data is one endless stream with no documents: data.doc_separator and "
                                  "data.varlen need a text source; pass --data.doc_separator=false "
                                  "--data.varlen=false")
        _synthetic(cfg, split, folder, log)
    else:
        _text(cfg, src, split, folder, log, rewrite)
    return TokenStore(folder, verify=cfg.verify)


def main(argv: list[str] | None = None) -> None:
    import argparse

    from config import load_config, parser_flags

    p = argparse.ArgumentParser(description="Tokenize a config's data splits into shards.")
    p.add_argument("--config", required=True)
    p.add_argument("--splits", default="train,valid,test")
    args, rest = p.parse_known_args(argv)
    cfg = load_config(args.config, rest, parser_flags(p))
    splits = [s for s in args.splits.split(",") if s]
    check_sources(cfg.data, splits)
    for split in splits:
        store = prepare_split(cfg.data, split)
        print(f"{split}: {store.n_tokens:,} tokens in {store.folder}")


if __name__ == "__main__":
    from utils.cli import run_cli

    run_cli(main)
