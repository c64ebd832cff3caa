"""Source specs, and the hub path's arguments to `datasets` (no network needed)."""
from __future__ import annotations

import datasets
import pytest

from data.sources import Source, load_text, parse_source
from utils.errors import UserError


def test_parse_specs(tmp_path):
    assert parse_source("hf:Salesforce/wikitext:wikitext-103-raw-v1") == Source("hf", "Salesforce/wikitext", "wikitext-103-raw-v1")
    assert parse_source("hf:user/data") == Source("hf", "user/data", None)
    assert parse_source("synthetic") == Source("synthetic")
    assert parse_source(f"local:{tmp_path}") == parse_source(str(tmp_path)) == Source("local", str(tmp_path.resolve()))
    for bad in ("hf:", "hf:a:b:c", "local:/no/such/dir", "wikitext"):
        with pytest.raises(ValueError):
            parse_source(bad)


def test_hub_split_names_and_text_column(monkeypatch):
    calls = []

    def fake_load(name, config, split):
        calls.append((name, config, split))
        return datasets.Dataset.from_dict({"text": ["a\n"], "id": [0]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    ds = load_text(parse_source("hf:Salesforce/wikitext:wikitext-103-raw-v1"), "valid")
    assert calls == [("Salesforce/wikitext", "wikitext-103-raw-v1", "validation")]
    assert ds.column_names == ["text"]


def test_hub_failure_says_how_to_go_offline(monkeypatch):
    def offline(*a, **k):
        raise ConnectionError("unreachable")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError, match="ConnectionError: unreachable.*local directory"):   # one line, no traceback
        load_text(parse_source("hf:Salesforce/wikitext:wikitext-103-raw-v1"), "train")
