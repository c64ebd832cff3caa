"""eval/generate.py's sampling through the decode cache: seeded draws repeat, the top-k and top-p cuts keep exactly
the tokens they should, rows stop at the end-of-text token, the cached sampler draws what the uncached one draws,
and a streamed sample prints its text as it comes."""
from __future__ import annotations

import io

import torch

from eval.generate import TextStream, filter_logits, generate, pick, sample
from model import build_model
from model.config import ModelConfig


def tiny_model(family: str = "gla"):
    torch.manual_seed(0)
    return build_model(ModelConfig(family=family, vocab_size=23, d_model=16, n_layers=2, n_heads=2, head_k_dim=4,
                                   head_v_dim=8, mlp_hidden=32, max_seq_len=64, ssm_head_dim=8,
                                   ssm_state=4)).eval()


def test_seeded_sampling_repeats_and_equals_the_uncached_sampler():
    model, idx = tiny_model(), torch.tensor([[3, 1, 4], [1, 5, 9]])
    runs = [generate(model, idx, 8, 1.0, 5, 0.9, torch.Generator().manual_seed(s)) for s in (7, 7, 8)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    ref = sample(model, idx, 8, window=64, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(7),
                 top_p=0.9)
    assert torch.equal(runs[0], ref)


def test_top_k_and_top_p_keep_exactly_their_tokens():
    logits = torch.randn(4, 50)
    kept = filter_logits(logits, top_k=7).isfinite()
    assert kept.sum(-1).tolist() == [7] * 4
    assert torch.equal(kept, logits >= logits.topk(7).values[:, -1:])
    p = 0.6
    kept = filter_logits(logits, top_p=p).isfinite()
    probs = logits.softmax(-1)
    for row, keep in zip(probs, kept):                        # the smallest most-probable set with mass ≥ p
        order = row.argsort(descending=True)
        n = int((row[order].cumsum(0) < p).sum()) + 1
        assert keep.sum() == n and keep[order[:n]].all()
    assert filter_logits(logits, top_p=1e-9).isfinite().sum(-1).tolist() == [1] * 4   # the argmax always stays
    assert torch.equal(filter_logits(logits, top_p=1.0), logits)
    draws = torch.stack([pick(logits, 1.0, top_k=3, generator=torch.Generator().manual_seed(s)) for s in range(40)])
    assert (filter_logits(logits, top_k=3).gather(1, draws.t()).isfinite()).all()


def test_rows_stop_at_the_end_of_text_token():
    model, idx = tiny_model("mamba2"), torch.tensor([[1, 2], [3, 4], [5, 6]])
    eot, script = 22, iter([[5, 22, 7], [22, 6, 8], [1, 2, 22], [9, 9, 9]])
    seen = []
    out = model.generate(idx, 10, sample=lambda lg: torch.tensor(next(script)), stop_token=eot,
                         on_token=lambda t: seen.append(t.tolist()))
    assert out.tolist() == [[5, 22, 22], [22, 22, 22], [7, 8, 22]]          # ends once every row has stopped
    assert seen == out.t().tolist()


def test_text_stream_waits_for_whole_characters():
    pieces = {1: b"caf", 2: b"\xc3", 3: b"\xa9", 4: b"!"}
    decode = lambda toks: b"".join(pieces[t] for t in toks).decode("utf-8", errors="replace")  # noqa: E731
    out = io.StringIO()
    stream = TextStream(decode, out=out)
    printed = []
    for t in (1, 2, 3, 4):
        stream(torch.tensor([t]))
        printed.append(out.getvalue())
    assert printed == ["caf", "caf", "café", "café!"]
