"""Data source specs and loading raw text splits through `datasets`.

Specs:
    hf:Salesforce/wikitext:wikitext-103-raw-v1   a Hugging Face hub dataset (name[:config]) with a text column
    local:DIR  or  DIR                           wiki.{train,valid,test}.raw (the layout of the official
                                                 archive wikitext-103-raw-v1.zip, unpacked) or
                                                 {train,valid,test}[.txt|.raw] files
    synthetic                                    data.synthetic.MarkovSource (no text, no tokenizer)
Splits are called train / valid / test everywhere; hub splits named `validation` are mapped.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from data.config import DataSourceError

SPLITS = ("train", "valid", "test")
_LOCAL_NAMES = {
    "train": ("wiki.train.raw", "train.txt", "train.raw", "train"),
    "valid": ("wiki.valid.raw", "valid.txt", "valid.raw", "validation.txt", "valid", "validation"),
    "test": ("wiki.test.raw", "test.txt", "test.raw", "test"),
}


@dataclass(frozen=True)
class Source:
    kind: str                  # "hf" | "local" | "synthetic"
    name: str = ""             # hub dataset name or absolute directory
    config: str | None = None  # hub config name

    @property
    def slug(self) -> str:
        """A folder name for this source's shards."""
        if self.kind == "synthetic":
            return "synthetic"
        base = self.name.strip("/").replace("/", "_") + (f"_{self.config}" if self.config else "")
        return f"{self.kind}_{base}"[-120:]


def parse_source(spec: str) -> Source:
    if spec == "synthetic":
        return Source("synthetic")
    if spec.startswith("hf:"):
        parts = spec[3:].split(":")
        if not parts[0] or len(parts) > 2:
            raise DataSourceError(f"bad hub source {spec!r}; expected hf:NAME or hf:NAME:CONFIG")
        return Source("hf", parts[0], parts[1] if len(parts) == 2 else None)
    path = spec[len("local:"):] if spec.startswith("local:") else spec
    if not path or not Path(path).is_dir():
        raise DataSourceError(f"data source {spec!r} is neither 'synthetic', 'hf:NAME[:CONFIG]' nor an "
                         "existing directory (local:DIR)")
    return Source("local", str(Path(path).resolve()))


def local_split_file(src: Source, split: str) -> Path:
    for name in _LOCAL_NAMES[split]:
        p = Path(src.name) / name
        if p.is_file():
            return p
    option = "--data.source" if split == "train" else "--data.eval_source"
    raise FileNotFoundError(f"no {split!r} split in {src.name}: looked for {', '.join(_LOCAL_NAMES[split])}; add "
                            f"one, or point {option} at a directory that has it")


# A WikiText article's title row: " = Title = " (sections are " = = Section = = ")
WIKITEXT_TITLE = re.compile(r" = [^=](?:.*[^=])? = \n?")


def is_wikitext(src: Source, split: str) -> bool:
    """Whether `split` of `src` is WikiText: local wiki.*.raw files or a hub dataset named wikitext."""
    if src.kind == "local":
        name = local_split_file(src, split).name
        return name.startswith("wiki.") and name.endswith(".raw")
    return src.kind == "hf" and "wikitext" in src.name.lower()


def wikitext_title(text: str) -> bool:
    return WIKITEXT_TITLE.fullmatch(text) is not None


def non_empty(text: str) -> bool:
    return bool(text.strip())


def document_starts(src: Source, split: str) -> Callable[[str], bool]:
    """row text → whether a document starts at that row: a WikiText article at its title row; for any other
    source each non-empty row is a document (a local file's line, a hub dataset's row). Module-level functions,
    so that tokenizer worker processes can pickle them."""
    return wikitext_title if is_wikitext(src, split) else non_empty


def text_fingerprint(src: Source, split: str) -> dict:
    """What identifies a split's raw text, for deciding whether shards are stale."""
    if src.kind == "local":
        p = local_split_file(src, split)
        st = p.stat()
        return {"file": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return {"dataset": src.name, "config": src.config, "split": split}


def load_text(src: Source, split: str):
    """The split as a `datasets.Dataset` with one line of raw text (newline kept) per row."""
    import datasets

    if src.kind == "local":
        path = local_split_file(src, split)
        return datasets.load_dataset("text", data_files={split: str(path)}, split=split,
                                     keep_linebreaks=True)
    if src.kind == "hf":
        hub_split = "validation" if split == "valid" else split
        try:
            ds = datasets.load_dataset(src.name, src.config, split=hub_split)
        except Exception as e:  # offline, a gated or misspelt name: datasets raises many types; one line says which
            raise DataSourceError(
                f"could not load {src.name!r} ({src.config}) split {hub_split!r} from the Hugging "
                f"Face hub: {type(e).__name__}: {e}. Offline, point --data.source (and "
                "--data.eval_source) at a local directory of text files instead (--data.source=local:DIR); "
                "for WikiText-103, DIR is the wikitext-103-raw folder that the official archive "
                "wikitext-103-raw-v1.zip unpacks to (wiki.train.raw, wiki.valid.raw, wiki.test.raw).") from e
        if "text" not in ds.column_names:
            raise DataSourceError(f"{src.name}: no 'text' column (columns: {ds.column_names})")
        return ds.select_columns(["text"])
    raise ValueError(f"source kind {src.kind!r} has no text")


def default_num_proc(n_rows: int, requested: int = 0) -> int:
    """Worker processes for tokenization: spawning only pays for large splits."""
    if requested > 0:
        return requested
    return max(1, min(os.cpu_count() or 1, n_rows // 50_000))
