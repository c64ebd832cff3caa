"""eval/equivalence.py on a trained checkpoint (--ckpt): the backends' loss, logits and gradients on the weights
training produced rather than a fresh init. On CPU in fp32 `chunk` must agree with the naive model to 1e-4;
on a GPU, in bf16, within twice naive's own bf16 error."""
from __future__ import annotations

import sys

import torch
from accelerate.state import AcceleratorState, GradientState

import train
from eval import equivalence
from tests.test_train import tiny


def test_checkpoint_weights_are_compared(tmp_path, monkeypatch, capsys):
    train.main(tiny(tmp_path, "eq", "--train.max_steps=2", "--train.eval_batches=0", "--train.eval_interval=0",
                    "--train.precision=fp32"))
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    seen = {}
    real = equivalence.compare

    def spy(cfg, backends, *args, **kwargs):
        seen["state"], seen["layers"] = kwargs["state"], cfg.n_layers
        return real(cfg, backends, *args, **kwargs)

    monkeypatch.setattr(equivalence, "compare", spy)
    monkeypatch.setattr(sys, "argv", ["equivalence", "--ckpt", str(tmp_path / "runs" / "eq"), "--backends", "chunk",
                                      "--seq-len", "32"])
    equivalence.main()
    out = capsys.readouterr().out
    assert "checkpoints/step_" in out
    if torch.cuda.is_available():   # equivalence checks bf16 on a GPU, against naive's own bf16 error
        assert "chunk: equivalent within 2 × naive bf16 + 1e-3" in out
    else:
        assert "chunk (fp32): largest relative error" in out and "within 1e-4" in out
    from safetensors.torch import load_file

    from utils.checkpoint import WEIGHTS_FILE, latest_checkpoint

    saved = load_file(str(latest_checkpoint(tmp_path / "runs" / "eq") / WEIGHTS_FILE))
    assert seen["layers"] == 1 and set(seen["state"]) == set(saved)
    assert all(torch.equal(seen["state"][k], saved[k]) for k in saved)      # the trained weights, not an init
