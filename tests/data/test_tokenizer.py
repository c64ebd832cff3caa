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


def fake_ranks_file(path):
    """A ranks file of the right length (50,256) that is not GPT-2's: every byte, then byte pairs in order."""
    import base64

    toks = [bytes([b]) for b in range(256)] + [bytes([a, b]) for a in range(256) for b in range(256)]
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for r, t in enumerate(toks[:EOT])))
    return path


def test_a_fake_ranks_file_of_the_right_length_is_refused(tmp_path):
    fake = fake_ranks_file(tmp_path / "fake.tiktoken")
    with pytest.raises(TokenizerUnavailable) as e:
        get_tokenizer(str(fake))
    msg = str(e.value)
    assert msg.startswith(f"{fake} is not the GPT-2 BPE ranks file ('Hello world' encodes to [")
    assert "GPT-2 gives [15496, 995]" in msg and "docstring" in msg and "--data.tokenizer_file" in msg
    assert "\n" not in msg


def test_a_file_that_is_not_a_ranks_file_is_refused(tmp_path):
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("this is not base64 ranks\n" * 10)
    with pytest.raises(TokenizerUnavailable, match=f"{bad} is not the GPT-2 BPE ranks file"):
        get_tokenizer(str(bad))


def test_a_reserialised_gpt2_file_passes(bpe_file, tmp_path):
    """Other line order and line endings: other bytes (another sha256), the same ranks."""
    import random

    lines = bpe_file.read_bytes().splitlines()
    random.Random(0).shuffle(lines)
    copy = tmp_path / "gpt2-shuffled.tiktoken"
    copy.write_bytes(b"\r\n".join(lines) + b"\r\n")
    enc = get_tokenizer(str(copy))
    assert enc.encode("Hello world") == [15496, 995] and enc.n_vocab == 50257


def test_a_gpt2_file_with_two_ranks_swapped_is_refused(bpe_file, tmp_path):
    """The sample texts may encode alike; the ranks' digest still differs."""
    lines = bpe_file.read_bytes().splitlines()
    a, b = lines[50000].split(), lines[50001].split()
    lines[50000], lines[50001] = a[0] + b" " + b[1], b[0] + b" " + a[1]
    edited = tmp_path / "gpt2-edited.tiktoken"
    edited.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TokenizerUnavailable, match=f"{edited} is not the GPT-2 BPE ranks file"):
        get_tokenizer(str(edited))
