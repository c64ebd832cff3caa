"""Generation: greedy sampling equals an explicit argmax loop, top-k 1 is greedy, and the CLI runs on a
trained checkpoint (synthetic data: prompts and output are token ids)."""
from __future__ import annotations

import torch
from accelerate.state import AcceleratorState, GradientState

import train
from eval.generate import main, sample
from model import build_model
from model.config import ModelConfig
from tests.test_train import tiny


def tiny_model():
    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=23, d_model=16, n_layers=2, n_heads=2, head_k_dim=4, head_v_dim=8,
                                   mlp_hidden=32)).eval()


def test_greedy_is_an_argmax_loop_over_the_window():
    model, idx = tiny_model(), torch.tensor([[3, 1, 4, 1, 5]])
    out = sample(model, idx, max_new_tokens=6, window=4, temperature=0)
    ref = idx
    with torch.no_grad():
        for _ in range(6):
            logits, _ = model(ref[:, -4:])
            ref = torch.cat([ref, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, ref)


def test_top_k_one_is_greedy_and_sampling_is_seeded():
    model, idx = tiny_model(), torch.tensor([[7, 2]] * 3)
    greedy = sample(model, idx, 5, window=8, temperature=0)
    assert torch.equal(sample(model, idx, 5, window=8, temperature=1.0, top_k=1), greedy)
    a, b = (sample(model, idx, 5, window=8, generator=torch.Generator().manual_seed(1)) for _ in range(2))
    assert torch.equal(a, b)


def test_cli_on_a_trained_checkpoint(tmp_path):
    train.main(tiny(tmp_path, "gen", "--train.max_steps=4"))
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    texts = main(["--ckpt", str(tmp_path / "runs" / "gen"), "--prompt", "1 2 3", "--temperature", "0",
                  "--max_new_tokens", "5", "--num_samples", "2"])
    assert len(texts) == 2 and texts[0] == texts[1] and len(texts[0].split()) == 8
