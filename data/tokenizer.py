r"""GPT-2 BPE through tiktoken, online or from a local ranks file.

Resolution order: an explicit file (`--data.tokenizer_file`), then `$CHUNKFUSE_GPT2_BPE`, then
tiktoken's own download of its `gpt2` encoding (built from OpenAI's vocab.bpe and encoder.json at
https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/). For offline use, save the ranks
file once on a machine with internet (one line per rank: the base64 token, a space, the rank):

    import base64, tiktoken
    ranks = tiktoken.get_encoding("gpt2")._mergeable_ranks
    with open("gpt2.tiktoken", "wb") as f:
        for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(tok) + b" %d\n" % rank)
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe

from utils.errors import UserError

ENV_VAR = "CHUNKFUSE_GPT2_BPE"
EOT = 50256
# tiktoken's GPT-2 pre-tokenization pattern (the `gpt2` encoding's pat_str), so a ranks file gives the same ids.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class TokenizerUnavailable(UserError, RuntimeError):
    pass


@lru_cache(maxsize=4)
def _from_file(path: str) -> tiktoken.Encoding:
    ranks = load_tiktoken_bpe(path)
    if len(ranks) != EOT:
        raise TokenizerUnavailable(f"{path}: expected {EOT} GPT-2 BPE ranks, found {len(ranks)}")
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=EOT + 1)


def resolve_tokenizer_file(path: str | None = None) -> str | None:
    path = path or os.environ.get(ENV_VAR) or None
    if path is not None and not Path(path).is_file():
        raise TokenizerUnavailable(f"GPT-2 BPE ranks file {path!r} does not exist")
    return path


def get_tokenizer(path: str | None = None) -> tiktoken.Encoding:
    """The GPT-2 encoding (50,257 tokens, `<|endoftext|>` = 50256)."""
    path = resolve_tokenizer_file(path)
    if path is not None:
        return _from_file(str(Path(path).resolve()))
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # network errors come in many types (requests, urllib3, ssl)
        raise TokenizerUnavailable(
            "could not download tiktoken's GPT-2 BPE ranks "
            f"({type(e).__name__}: {e}). Offline, give a local ranks file either with "
            f"--data.tokenizer_file=PATH or the environment variable {ENV_VAR}=PATH: a gpt2.tiktoken file, "
            "one line per rank (base64 token, space, rank), saved on a machine with internet from "
            "tiktoken.get_encoding('gpt2')._mergeable_ranks (tiktoken builds them from "
            "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe and encoder.json); "
            "data/tokenizer.py's docstring shows how."
        ) from e


def tokenizer_fingerprint(enc: tiktoken.Encoding) -> str:
    """Identifies the token ids an encoding produces (for shard metadata)."""
    h = hashlib.sha256(enc._pat_str.encode())
    for tok, rank in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1]):
        h.update(tok)
        h.update(rank.to_bytes(4, "little"))
    return f"{enc.name}:{enc.n_vocab}:{h.hexdigest()[:16]}"
