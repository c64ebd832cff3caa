"""Data-source settings; data/sources.py documents the source specs."""
from __future__ import annotations

from dataclasses import dataclass, field

from utils.errors import UserError


class DataSourceError(UserError, ValueError):
    """A data source that cannot be read as given (printed without a traceback)."""


@dataclass
class SyntheticConfig:
    vocab_size: int = 64
    order: int = 2                     # tokens of context that determine the next-token law
    concentration: float = 0.1         # Dirichlet α of each context's next-token law (lower: peakier)
    seed: int = 0                      # seeds the transition table; sample streams derive from it
    train_tokens: int = 2_000_000
    eval_tokens: int = 200_000


@dataclass
class DataConfig:
    source: str = "hf:Salesforce/wikitext:wikitext-103-raw-v1"   # hf:NAME[:CONFIG] | local:DIR | DIR | synthetic
    eval_source: str = ""              # source of valid/test splits; "" → same as `source`
    cache_dir: str = "data_cache"      # token shards live here, one folder per source and split
    tokenizer_file: str = ""           # GPT-2 BPE ranks for offline use (else $CHUNKFUSE_GPT2_BPE, else download)
    seq_len: int = 1024
    bos: bool = False                  # start every window with <|endoftext|> (no state starts mid-document)
    doc_separator: bool = False        # <|endoftext|> before each document (WikiText: article; else a row); false:
                                       # the plain stream, as published WikiText numbers use (shards of their own)
    varlen: bool = False               # pack documents: the model restarts its state at each <|endoftext|> of a
                                       # window (cu_seqlens; needs doc_separator; GPT-2's on naive only)
    num_proc: int = 0                  # tokenizer processes; 0 → one per core
    verify: bool = True                # sha256-check shards when opening them
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
