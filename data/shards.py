"""Token shards: uint16 memmaps plus a metadata JSON, built once per (source, split, tokenizer).

Layout of `<cache_dir>/<source slug>/<split>/`:
    meta.json            fingerprint (what was tokenized, how), token/word/byte counts, shard list
    shard_0000.bin ...   uint16 token ids, each with its size and sha256 in meta.json
A folder is built under a temporary name and renamed into place, so a crash never leaves a
half-written folder that looks complete. A fingerprint that differs from the request rebuilds;
a shard whose size or checksum disagrees with meta.json is an error naming the file.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from utils.errors import UserError, write_error

FORMAT_VERSION = 1
MAX_SHARD_TOKENS = 1 << 27  # 256 MB of uint16 per shard


class ShardError(UserError, RuntimeError):
    pass


CACHE_REMEDY = "make --data.cache_dir writable or free space on it, or choose another --data.cache_dir"


def _write(data: np.ndarray, path: Path) -> None:
    """One shard file (the one place shards are written, so a test can make it fail)."""
    data.tofile(path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


class ShardWriter:
    """Appends token arrays and cuts them into shards inside a staging folder."""

    def __init__(self, staging: Path, max_shard_tokens: int = MAX_SHARD_TOKENS, target: Path | None = None):
        self.dir, self.max = staging, max_shard_tokens
        self.target = target or staging        # the folder the staging one becomes, for error messages
        self.shards: list[dict] = []
        self._buf: list[np.ndarray] = []
        self._n = 0

    def append(self, ids: np.ndarray) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= 1 << 16):
            raise ShardError("token id outside uint16; shards hold vocabularies of at most 65536")
        self._buf.append(ids.astype(np.uint16, copy=False))
        self._n += ids.size
        while self._n >= self.max:
            self._flush(self.max)

    def _flush(self, n: int) -> None:
        data = np.concatenate(self._buf) if self._buf else np.empty(0, np.uint16)
        head, rest = data[:n], data[n:]
        path = self.dir / f"shard_{len(self.shards):04d}.bin"
        try:
            _write(head, path)
            digest = _sha256(path)
        except OSError as e:
            raise write_error(e, f"token shards in {self.target}", CACHE_REMEDY) from None
        self.shards.append({"file": path.name, "n_tokens": int(head.size), "sha256": digest})
        self._buf, self._n = [rest], rest.size

    def close(self) -> list[dict]:
        if self._n or not self.shards:
            self._flush(self._n)
        return self.shards


def build(folder: Path, fingerprint: dict, fill, max_shard_tokens: int = MAX_SHARD_TOKENS) -> dict:
    """Build shards in a staging folder with `fill(writer) -> extra meta`, then swap into place. A failed write
    (read-only or full cache, a file where a folder should be) is one WriteError naming the folder, and leaves
    no staging folder behind."""
    staging = folder.with_name(f"{folder.name}.building-{os.getpid()}")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    except OSError as e:
        raise write_error(e, f"token shards in {folder}", CACHE_REMEDY) from None
    try:
        writer = ShardWriter(staging, max_shard_tokens, target=folder)
        extra = fill(writer)
        shards = writer.close()
        meta = {"format": FORMAT_VERSION, "fingerprint": fingerprint, "dtype": "uint16",
                "n_tokens": sum(s["n_tokens"] for s in shards), "shards": shards, **extra}
        try:
            tmp = staging / "meta.json.tmp"
            tmp.write_text(json.dumps(meta, indent=1))
            os.replace(tmp, staging / "meta.json")
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(staging, folder)
        except OSError as e:
            raise write_error(e, f"token shards in {folder}", CACHE_REMEDY) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return meta


def read_meta(folder: Path) -> dict | None:
    p = folder / "meta.json"
    if not p.is_file():
        return None
    try:
        meta = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardError(f"{p} is not valid JSON ({e}); delete {folder} to rebuild it") from e
    if not isinstance(meta, dict):
        raise ShardError(f"{p} is not a shard index (a JSON object); delete {folder} to rebuild it")
    return meta


def _check_meta(meta: dict, folder: Path) -> None:
    """What TokenStore reads from meta.json is there: a list of shards with file, n_tokens and sha256."""
    shards = meta.get("shards")
    bad = ("has no 'shards' list" if not isinstance(shards, list) else
           "lists a shard without its file, n_tokens and sha256"
           if not all(isinstance(s, dict) and {"file", "n_tokens", "sha256"} <= s.keys() for s in shards) else
           "has no 'vocab_size'" if "vocab_size" not in meta else None)
    if bad:
        raise ShardError(f"{folder / 'meta.json'} {bad} (incomplete or edited); delete {folder} to rebuild it")


def is_current(meta: dict | None, fingerprint: dict) -> bool:
    return meta is not None and meta.get("format") == FORMAT_VERSION and meta.get("fingerprint") == fingerprint


class TokenStore:
    """A split's token stream over its shards, read-only; `get(start, n)` may cross shard ends."""

    def __init__(self, folder: Path, verify: bool = True):
        meta = read_meta(folder)
        if meta is None:
            raise ShardError(f"no prepared shards in {folder}")
        _check_meta(meta, folder)
        self.folder, self.meta = folder, meta
        self.arrays, self.offsets = [], [0]
        for s in meta["shards"]:
            path = folder / s["file"]
            expect = s["n_tokens"] * 2
            size = path.stat().st_size if path.is_file() else -1
            if size != expect:
                what = "missing" if size < 0 else f"truncated or overlong: {size} bytes, expected {expect}"
                raise ShardError(f"shard {path} is {what}; delete {folder} to rebuild it")
            if verify and _sha256(path) != s["sha256"]:
                raise ShardError(f"shard {path} is corrupt (sha256 differs from meta.json); "
                                 f"delete {folder} to rebuild it")
            self.arrays.append(np.memmap(path, dtype=np.uint16, mode="r") if expect else
                               np.empty(0, np.uint16))
            self.offsets.append(self.offsets[-1] + s["n_tokens"])
        self.n_tokens = self.offsets[-1]

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def __len__(self) -> int:
        return self.n_tokens

    def get(self, start: int, n: int) -> np.ndarray:
        """Tokens [start, start + n) as int64."""
        if start < 0 or start + n > self.n_tokens:
            raise IndexError(f"tokens [{start}, {start + n}) outside [0, {self.n_tokens})")
        i = int(np.searchsorted(self.offsets, start, side="right")) - 1
        parts = []
        while n > 0:
            lo = start - self.offsets[i]
            take = min(n, self.offsets[i + 1] - start)
            parts.append(self.arrays[i][lo:lo + take])
            start, n, i = start + take, n - take, i + 1
        return np.concatenate(parts).astype(np.int64) if len(parts) > 1 else parts[0].astype(np.int64)
