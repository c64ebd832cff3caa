"""scripts/memory_breakdown.py on the tiny smoke GLA: the token mixer's op gets its own row, and the
saved activations grow with the tokens they are scaled to."""
from __future__ import annotations

from scripts.memory_breakdown import main


def test_breakdown_names_the_op_and_scales_with_tokens(capsys):
    args = ["--config", "configs/smoke.yaml", "--backend", "chunk", "--batch", "2", "--measure-seq-len", "64"]
    short, long = main(args + ["--seq-len", "256"]), main(args + ["--seq-len", "512"])
    rows = {r["module"]: r for r in short["rows"]}
    assert rows["blocks.*.mixer.gla (op)"]["MB"] > 0 and rows["blocks.*.mixer.gla (op)"]["per_layer_MB"] > 0
    assert 1.9 < long["activations_MB"] / short["activations_MB"] <= 2.0 + 1e-9
    assert short["states_MB"] == long["states_MB"] > 0
    assert "| **saved activations** |" in capsys.readouterr().out
