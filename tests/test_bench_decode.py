"""The decode benchmark runs end to end at toy sizes on a CPU (times mean nothing there): ours and the peer per
batch size, the per-token series over prompt lengths, and its md, json and png."""
from __future__ import annotations

import json

import scripts.bench_decode as bench_decode
from scripts.bench_decode import main

TOY = ["--model.d_model=32", "--model.n_layers=1", "--model.n_heads=2", "--model.head_k_dim=8",
       "--model.head_v_dim=16", "--model.vocab_size=64", "--model.mlp_hidden=64", "--model.max_seq_len=24"]


def test_bench_decode_writes_its_report(tmp_path, monkeypatch):
    # utils.runinfo.environment imports fla for its version (seconds on a CPU); the report only prints it
    monkeypatch.setattr(bench_decode, "environment", lambda device: {"date": "d", "torch": "t", "triton": "tr",
                                                                     "fla": "f", "commit": "c"})
    # 15 new tokens (9 + 15 fills max_seq_len): the peer's generate(15) must outlast generate(1) on a busy CPU too
    rows = main(["--configs", "gla_125m,gpt2_124m", "--backend", "naive", "--batches", "1,2", "--prompt", "9",
                 "--new", "15", "--lengths", "5,30", "--flat-new", "2", "--out", str(tmp_path), *TOY])
    ours = [r for r in rows if r["model"] == "ours" and r.get("series") != "flat"]
    assert [(r["config"], r["batch"], r["status"]) for r in ours] == [
        ("gla_125m", 1, "ok"), ("gla_125m", 2, "ok"), ("gpt2_124m", 1, "ok"), ("gpt2_124m", 2, "ok")]
    assert all(r["decode"] == "gla_step: naive" for r in ours if r["config"] == "gla_125m")
    gpt2_peer = [r for r in rows if r["model"] == "peer" and r["config"] == "gpt2_124m"]
    assert [r["status"] for r in gpt2_peer] == ["ok", "ok"] and all(r["decode_tok_s"] > 0 for r in gpt2_peer)
    flat = {(r["config"], r["prompt"]): r["status"] for r in rows if r.get("series") == "flat"}
    assert flat == {("gla_125m", 5): "ok", ("gla_125m", 30): "ok", ("gpt2_124m", 5): "ok", ("gpt2_124m", 30): "n/a"}
    md = (tmp_path / "decode.md").read_text()
    assert "| gpt2_124m | ours | naive |" in md and "× |" in md and "P = 30" in md
    assert len(json.loads((tmp_path / "decode.json").read_text())["rows"]) == len(rows)
    assert (tmp_path / "decode.png").stat().st_size > 0
