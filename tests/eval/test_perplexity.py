"""Perplexity: every target scored exactly once, numbers equal to a hand computation, and the
CLI end to end on a trained checkpoint."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from accelerate.state import AcceleratorState, GradientState

import train
from eval.perplexity import evaluate_split, load_model, main, score_tokens, window_plan
from data.tokenizer import get_tokenizer
from model import build_model
from model.config import ModelConfig
from tests.test_train import tiny


@pytest.mark.parametrize("n, T, S", [(1, 4, 4), (10, 4, 4), (11, 4, 2), (50, 8, 3), (7, 16, 5), (33, 5, 1)])
def test_window_plan_scores_each_target_once(n, T, S):
    scored = []
    for start, end, first in window_plan(n, T, S):
        assert start <= first < end <= start + T
        scored += range(first, end)
    assert scored == list(range(n))


def context_start(i: int, T: int, S: int) -> int:
    """Independent closed form: input i is scored by the first window (starts 0, S, 2S, ...)
    whose end passes i."""
    return 0 if i < T else (math.floor((i - T) / S) + 1) * S


@pytest.mark.parametrize("T, S", [(8, 8), (8, 3), (5, 1)])
def test_matches_hand_computation(T, S):
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=23, d_model=16, n_layers=2, n_heads=2, head_k_dim=4,
                                    head_v_dim=8, mlp_hidden=32)).eval()
    tokens = torch.randint(0, 23, (41,))
    total, n = score_tokens(model, tokens, T, S, batch_size=3)
    hand = 0.0
    with torch.no_grad():
        for i in range(tokens.numel() - 1):          # input i predicts token i + 1
            s = context_start(i, T, S)
            logits, _ = model(tokens[s:i + 1][None])
            hand -= F.log_softmax(logits[0, -1].double(), -1)[tokens[i + 1]].item()
    assert n == 40 and total == pytest.approx(hand, rel=1e-6)


def test_cli_on_a_trained_checkpoint(tmp_path):
    train.main(tiny(tmp_path, "ppl", "--train.max_steps=4"))
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    out = tmp_path / "eval.json"
    res = main(["--ckpt", str(tmp_path / "runs" / "ppl"), "--split", "valid", "--stride", "16",
                "--out", str(out), f"--data.cache_dir={tmp_path / 'cache'}"])
    assert json.loads(out.read_text()) == res
    assert res["tokens_scored"] == 1999 and res["token_ppl"] == pytest.approx(math.exp(res["loss"]))
    assert res["word_ppl"] is None and res["word_ppl_whitespace"] is None and res["entropy_rate"] > 0  # no words


def test_word_ppl_and_bits_per_byte(tmp_path, bpe_file):
    raw = tmp_path / "raw"
    raw.mkdir()
    text = " = Heading = \n \n The quick brown fox jumps over the lazy dog .\n Another line , 42 .\n"
    for split in ("train", "valid", "test"):
        (raw / f"wiki.{split}.raw").write_text(text)
    train.main(tiny(tmp_path, "w", "--train.max_steps=2", "--train.eval_batches=0", "--train.eval_interval=0")
               + [f"--data.source=local:{raw}", f"--data.tokenizer_file={bpe_file}", "--model.vocab_size=50257",
                  "--data.seq_len=8", "--train.micro_batch_size=2"])
    model, cfg, _ = load_model(tmp_path / "runs" / "w")
    res = evaluate_split(model, cfg, "test", 8, 8, 4, progress=False)
    ws_words, nbytes = len(text.split()), len(text.encode())
    words = ws_words + text.count("\n")                                 # one end-of-line token per line
    assert (res["words"], res["words_whitespace"], res["bytes"]) == (words, ws_words, nbytes)
    assert res["tokens_scored"] == len(get_tokenizer(str(bpe_file)).encode_ordinary(text))  # all, via <|endoftext|>
    assert res["word_ppl"] == pytest.approx(math.exp(res["nll_sum"] / words))
    assert res["word_ppl_whitespace"] == pytest.approx(math.exp(res["nll_sum"] / ws_words))
    assert res["bits_per_byte"] == pytest.approx(res["nll_sum"] / math.log(2) / nbytes)
