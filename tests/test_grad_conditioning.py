"""scripts/grad_conditioning.py: the fp32-vs-fp64 gradient comparison it reports, on a tiny GLA (well
conditioned: errors at fp32's rounding) and on a planted sign flip (the comparison sees it)."""
from __future__ import annotations

import json

import torch

from scripts.grad_conditioning import compare, main
from tests.test_parity import TINY


def test_tiny_gla_gradients_agree_to_fp32_rounding(tmp_path):
    rows = main(["--config", "configs/smoke.yaml", "--steps", "2", "--out", str(tmp_path),
                 f"--data.cache_dir={tmp_path / 'cache'}", *TINY])
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert abs(r["loss32_minus_64"]) < 1e-5
        assert 0 < r["fp32"]["rel_err"] < 1e-4 and 0 < r["fp32_split"]["rel_err"] < 1e-4, r
        assert r["grad_norm64"] > 0
    assert len((tmp_path / "conditioning.jsonl").read_text().splitlines()) == 2
    assert json.loads((tmp_path / "conditioning.jsonl").read_text().splitlines()[0])["step"] == 1


def test_compare_reports_a_flipped_gradient():
    ref = {"a": torch.tensor([1.0, -2.0, 3.0, 0.0]), "b": torch.tensor([4.0])}
    same = compare({n: t.clone() for n, t in ref.items()}, ref)
    assert same["rel_err"] == 0 and same["sign_flips"] == 0
    bad = compare({"a": torch.tensor([1.0, 2.0, 3.0, 0.0]), "b": torch.tensor([4.0])}, ref)
    assert bad["sign_flips"] == 1 / 5 and bad["rel_err"] > 0.5 and bad["worst"][0][0] == "a"


def test_probe_output_norm_finds_the_first_position(tmp_path):
    """At GLA's init the largest dL/do sits at position 0, where the state is rank one (probe_output_norm.py)."""
    from scripts.probe_output_norm import probe
    rows = probe("configs/gla_125m.yaml", layers=1, trials=1, overrides=["--model.d_model=64", "--model.n_heads=2",
                 "--model.head_k_dim=32", "--model.head_v_dim=32", "--model.mlp_hidden=128"], B=2, T=128)
    assert len(rows) == 1
    r = rows[0]
    assert r["min_rms"] <= r["median_rms"] and r["median_grad"] <= r["max_grad"] and 0 < r["top_token_share"] <= 1
    assert r["max_grad_position"] == 0, r
