"""GPT-2 BPE through tiktoken: known ids, round trips, and the offline error's advice."""
from __future__ import annotations

import pytest
import tiktoken

from data.tokenizer import ENV_VAR, EOT, TokenizerUnavailable, get_tokenizer


def test_known_ids_and_round_trip(bpe_file):
    enc = get_tokenizer(str(bpe_file))
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257 and enc.eot_token == EOT
    text = " = Valkyria Chronicles III = \n Senjō no Valkyria 3 : <unk> Chronicles ( Japanese : 戦場のヴァルキュリア3 )\n"
    assert enc.decode(enc.encode_ordinary(text)) == text
    assert enc.encode("<|endoftext|>", allowed_special="all") == [EOT]


def test_environment_variable(bpe_file, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(bpe_file))
    assert get_tokenizer().encode("Hello world") == [15496, 995]


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(TokenizerUnavailable, match="does not exist"):
        get_tokenizer(str(tmp_path / "nope.tiktoken"))


def test_offline_error_names_both_ways_out(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(TokenizerUnavailable, match=f"--data.tokenizer_file=PATH.*{ENV_VAR}=PATH"):
        get_tokenizer()
