"""WikiText-103 word perplexity by the published convention (each line's words plus one end-of-line token), the
whitespace count beside it, and the GPT-2 paper's detokenised scoring (eval/perplexity.py --detokenize)."""
from __future__ import annotations

import json
import math

import datasets
import pytest
import torch

from config import Config, ConfigError
from data.config import DataConfig
from data.prepare import prepare_split
from data.tokenizer import EOT, get_tokenizer
from eval import perplexity
from eval.perplexity import WIKITEXT_DETOKENIZE, evaluate_split, wikitext_detokenize
from tests.conftest import WIKITEXT_EVAL

# a WikiText-like split: a heading, empty lines, a last line without its newline (still a line)
FIXTURE = " = Title = \n \n The game 's first @-@ person view ( FPV ) . \n \n = = Reception = = \n Sold 1 @,@ 000 ."
FIXTURE_WORDS = 3 + 0 + 11 + 0 + 5 + 5                     # whitespace words, line by line
FIXTURE_LINES = 6


def quiet(*_):
    pass


def wiki_dir(tmp_path, text: str = FIXTURE):
    raw = tmp_path / "raw"
    raw.mkdir(exist_ok=True)
    (raw / "wiki.test.raw").write_text(text)
    return raw


@pytest.mark.skipif(not (WIKITEXT_EVAL / "wiki.test.raw").is_file(),
                    reason=f"needs the WikiText-103 eval files at {WIKITEXT_EVAL} (../shared beside this checkout)")
@pytest.mark.parametrize("split, words, whitespace", [("test", 245_569, 241_211), ("valid", 217_646, 213_886)])
def test_counts_on_the_real_splits(split, words, whitespace, tmp_path, bpe_file):
    cfg = DataConfig(source=str(WIKITEXT_EVAL), cache_dir=str(tmp_path), tokenizer_file=str(bpe_file))
    store = prepare_split(cfg, split, log=quiet)
    assert (store.meta["n_words_eol"], store.meta["n_words"]) == (words, whitespace)


def test_counts_on_a_fixture(tmp_path, bpe_file):
    cfg = DataConfig(source=str(wiki_dir(tmp_path)), cache_dir=str(tmp_path / "cache"), tokenizer_file=str(bpe_file))
    store = prepare_split(cfg, "test", log=quiet)
    assert (store.meta["n_words_eol"], store.meta["n_words"]) == (FIXTURE_WORDS + FIXTURE_LINES, FIXTURE_WORDS)
    detok = prepare_split(cfg, "test", log=quiet, rewrite=WIKITEXT_DETOKENIZE)
    assert detok.folder.name == "test-detok" and store.folder.name == "test"     # both kept, side by side
    assert {k: detok.meta[k] for k in ("n_words", "n_words_eol", "n_bytes")} == \
        {k: store.meta[k] for k in ("n_words", "n_words_eol", "n_bytes")}          # counts of the original lines
    assert len(detok) < len(store)


def test_hub_rows_count_one_line_each(tmp_path, bpe_file, monkeypatch):
    """The hub's wikitext gives one row per line, an empty line as ''."""
    rows = ["", " = T = \n", "", " a b .\n"]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict({"text": rows}))
    cfg = DataConfig(cache_dir=str(tmp_path), tokenizer_file=str(bpe_file))
    meta = prepare_split(cfg, "test", log=quiet).meta
    assert (meta["n_words_eol"], meta["n_words"]) == (10, 6)


def test_shards_without_the_line_count_are_rebuilt(tmp_path, bpe_file):
    cfg = DataConfig(source=str(wiki_dir(tmp_path)), cache_dir=str(tmp_path / "cache"), tokenizer_file=str(bpe_file))
    folder = prepare_split(cfg, "test", log=quiet).folder
    meta = json.loads((folder / "meta.json").read_text())
    del meta["n_words_eol"], meta["fingerprint"]["meta"]                # as an older prepare step wrote it
    (folder / "meta.json").write_text(json.dumps(meta))
    logs = []
    assert prepare_split(cfg, "test", log=logs.append).meta["n_words_eol"] == FIXTURE_WORDS + FIXTURE_LINES
    assert any("rebuilding" in line for line in logs)


@pytest.mark.parametrize("raw, detok", [
    (" 1 @-@ 2 , 3 @,@ 000 and 4 @.@ 5 \n", "1-2, 3,000 and 4.5\n"),
    (" a : b ; c . d ! e ? f , g \n", "a: b; c. d! e? f, g\n"),
    (" ( a ) [ b ] { c } \n", "(a) [b] {c}\n"),
    (' he said " hello there " twice \n', 'he said "hello there" twice\n'),
    (" it 's we 've do n't I 'm you 'll they 're she 'd \n", "it's we've don't I'm you'll they're she'd\n"),
    (" the ' dead ' and 'dead \n", "the ' dead ' and 'dead\n"),            # a quote mark, not a contraction
    (" = Title = \n", "= Title =\n"),
    (" = = A = = \n = = = B = = = \n = = = = C = = = = \n", "== A ==\n=== B ===\n==== C ====\n"),
    (" \n", "\n"),
    ("", ""),
    (' " a \n b " \n', '" a\nb "\n'),                                       # quotes pair within a line only
])
def test_detokenize_rules(raw, detok):
    assert wikitext_detokenize(raw) == detok


def test_detokenize_line_by_line_equals_whole_text():
    text = FIXTURE + "\n" + ' " x " \n ( y ) . \n'
    assert "".join(wikitext_detokenize(line) for line in text.splitlines(keepends=True)) == wikitext_detokenize(text)


class Stub(torch.nn.Module):
    """Stands for a model: evaluate_split asks it only for its device; score_tokens is stubbed."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))


@pytest.mark.parametrize("detokenize", [False, True])
def test_result_carries_both_word_perplexities(detokenize, tmp_path, bpe_file, monkeypatch):
    scored = []

    def score(model, tokens, seq_len, stride, batch_size, progress):
        scored.append(tokens.tolist())
        return 123.0, tokens.numel() - 1

    monkeypatch.setattr(perplexity, "score_tokens", score)
    cfg = Config()
    cfg.data = DataConfig(source=str(wiki_dir(tmp_path)), cache_dir=str(tmp_path / "cache"),
                          tokenizer_file=str(bpe_file))
    res = evaluate_split(Stub(), cfg, "test", 8, 8, 2, progress=False, detokenize=detokenize)
    words, whitespace = FIXTURE_WORDS + FIXTURE_LINES, FIXTURE_WORDS
    assert (res["words"], res["words_whitespace"], res["detokenize"]) == (words, whitespace, detokenize)
    assert res["word_ppl"] == pytest.approx(math.exp(123.0 / words))
    assert res["word_ppl_whitespace"] == pytest.approx(math.exp(123.0 / whitespace))
    text = "".join(map(wikitext_detokenize, FIXTURE.splitlines(keepends=True))) if detokenize else FIXTURE
    assert scored == [[EOT, *get_tokenizer(str(bpe_file)).encode_ordinary(text)]]


def test_detokenize_needs_wikitext(tmp_path):
    cfg = Config()
    (tmp_path / "test.txt").write_text("plain text\n")
    for source in ("synthetic", str(tmp_path)):
        cfg.data = DataConfig(source=source, cache_dir=str(tmp_path / "cache"))
        with pytest.raises(ConfigError, match="is not WikiText"):
            evaluate_split(Stub(), cfg, "test", 8, 8, 2, progress=False, detokenize=True)
    assert perplexity.is_wikitext(DataConfig(source="hf:Salesforce/wikitext:wikitext-103-raw-v1"), "test")
    assert perplexity.is_wikitext(DataConfig(source=str(wiki_dir(tmp_path))), "test")


def test_cli_flag_and_default_name(tmp_path, bpe_file, monkeypatch):
    """--detokenize reaches the scoring, and its result gets a name of its own beside the standard one."""
    cfg = Config()
    cfg.data = DataConfig(source=str(wiki_dir(tmp_path)), cache_dir=str(tmp_path / "cache"),
                          tokenizer_file=str(bpe_file), seq_len=8)
    ckpt = tmp_path / "run" / "checkpoints" / "step_1"
    monkeypatch.setattr(perplexity, "load_model", lambda *a, **k: (Stub(), cfg, ckpt))
    monkeypatch.setattr(perplexity, "score_tokens", lambda model, tokens, *a: (50.0, tokens.numel() - 1))
    plain = perplexity.main(["--ckpt", "x"])
    detok = perplexity.main(["--ckpt", "x", "--detokenize"])
    assert json.loads((tmp_path / "run" / "eval" / "step_1_test_8_8.json").read_text()) == plain
    assert json.loads((tmp_path / "run" / "eval" / "step_1_test_8_8_detok.json").read_text()) == detok
    assert (plain["detokenize"], detok["detokenize"]) == (False, True)
    assert detok["words"] == plain["words"] and detok["tokens_scored"] < plain["tokens_scored"]
