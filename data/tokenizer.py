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


# sha256 of the standard gpt2.tiktoken (the docstring's snippet writes it byte for byte): a match needs no more
GPT2_FILE_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# sha256 of the parsed ranks (ranks_digest), whatever the file's line order or line endings
GPT2_RANKS_DIGEST = "3688d51d64f4f960692ec9745abe1ddb9699fb637fe608cceaf8917b0653b79b"
# texts and their GPT-2 ids (words, numbers, punctuation, accents, CJK, emoji, whitespace, contractions)
GPT2_KNOWN = {
    "Hello world": [15496, 995],
    " The quick brown fox jumps over the lazy dog.": [383, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13],
    "1234567890 3.14": [10163, 2231, 30924, 3829, 513, 13, 1415],
    "naïve café — 東京 🙂": [2616, 38776, 40304, 851, 10545, 251, 109, 12859, 105, 32485],
    "\n\n  indented\tcode()": [628, 220, 773, 4714, 197, 8189, 3419],
    "I'm we've they'll": [40, 1101, 356, 1053, 484, 1183],
}


class TokenizerUnavailable(UserError, RuntimeError):
    pass


def _not_gpt2(path: str, why: str) -> TokenizerUnavailable:
    return TokenizerUnavailable(
        f"{path} is not the GPT-2 BPE ranks file ({why}). Use the standard gpt2.tiktoken (sha256 "
        f"{GPT2_FILE_SHA256[:12]}...): save it on a machine with internet from "
        "tiktoken.get_encoding('gpt2')._mergeable_ranks as data/tokenizer.py's docstring shows, then pass it "
        f"with --data.tokenizer_file=PATH or {ENV_VAR}=PATH")


def ranks_digest(ranks: dict[bytes, int]) -> str:
    """sha256 over (rank, token) pairs in rank order: the same for any file that parses to these ranks."""
    h = hashlib.sha256()
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        h.update(rank.to_bytes(4, "little"))
        h.update(len(tok).to_bytes(2, "little"))
        h.update(tok)
    return h.hexdigest()


def _file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@lru_cache(maxsize=4)
def _from_file(path: str) -> tiktoken.Encoding:
    """The GPT-2 encoding from a ranks file, checked to be GPT-2's: the file's sha256, or else (a re-serialised
    file) the parsed ranks' digest and the ids of known texts. Anything else (a tokenizer trained elsewhere with
    the same number of ranks) is an error naming the file: it would train, silently, on other ids."""
    try:
        ranks = load_tiktoken_bpe(path)
    except (ValueError, UnicodeDecodeError) as e:        # binascii.Error is a ValueError
        raise _not_gpt2(path, f"not a ranks file: {type(e).__name__}: {e}") from None
    if len(ranks) != EOT:
        raise _not_gpt2(path, f"expected {EOT} GPT-2 BPE ranks, found {len(ranks)}")
    if len(set(ranks.values())) != EOT or set(ranks.values()) != set(range(EOT)):
        raise _not_gpt2(path, f"its ranks are not 0..{EOT - 1}, each once")
    enc = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=EOT + 1)
    if _file_sha256(path) == GPT2_FILE_SHA256:
        return enc
    for text, ids in GPT2_KNOWN.items():
        got = enc.encode_ordinary(text)
        if got != ids:
            raise _not_gpt2(path, f"{text!r} encodes to {got[:12]}, GPT-2 gives {ids}")
    if ranks_digest(ranks) != GPT2_RANKS_DIGEST:
        raise _not_gpt2(path, "its ranks differ from GPT-2's, though a few sample texts encode alike")
    return enc


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
