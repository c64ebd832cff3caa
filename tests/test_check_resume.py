"""scripts/check_resume.py: a CPU run crashed at a checkpoint and resumed gives the uninterrupted rows bit for bit,
and the comparison catches a changed, missing or extra row."""
from __future__ import annotations

import json

import pytest

from scripts.check_resume import compare_rows, main, rows


@pytest.mark.slow
def test_a_resumed_cpu_run_is_bit_for_bit_and_evaluates(tmp_path):
    r = main(["--config", "configs/smoke.yaml", "--backend", "naive", "--steps", "4", "--at", "2", "--eval", "cpu",
              "--out", str(tmp_path), "--data.synthetic.eval_tokens=4096", "--train.eval_batches=1"])
    assert r["ok"] and r["bitwise"] and r["rows_compared"] == 3 and not r["sharded"]     # steps 3, 4 and val 4
    assert r["eval_cpu"]["tokens_scored"] == 4095
    assert "bit for bit equal" in (tmp_path / "resume.md").read_text()


def test_the_comparison_catches_every_kind_of_difference(tmp_path):
    full = [{"step": s, "loss": 5.0 - s, "grad_norm": 1.0, "tokens_per_s": 9.0} for s in (1, 2, 3, 4)]
    full.append({"step": 4, "val_loss": 2.0})
    (tmp_path / "a.jsonl").write_text("\n".join(map(json.dumps, full)))
    same = [{**r, "tokens_per_s": 1.0} if "loss" in r else r for r in full]     # timing differs: still equal
    (tmp_path / "b.jsonl").write_text("\n".join(map(json.dumps, same)))
    assert compare_rows(rows(tmp_path / "a.jsonl"), rows(tmp_path / "b.jsonl"), 2) == (3, [])
    changed = [dict(r) for r in full[:4]] + [{"step": 5, "loss": 0.5}]
    changed[3]["loss"] = 1.0 + 2 ** -40                                          # one ulp-scale change
    (tmp_path / "c.jsonl").write_text("\n".join(map(json.dumps, changed)))
    n, diffs = compare_rows(rows(tmp_path / "a.jsonl"), rows(tmp_path / "c.jsonl"), 2)
    assert n == 3 and len(diffs) == 3
    assert any("step 4 train" in d and "≠" in d for d in diffs)
    assert any("step 4 val: missing" in d for d in diffs) and any("step 5 train: only after" in d for d in diffs)


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        main(["--config", "configs/smoke.yaml", "--steps", "4", "--at", "4"])
    with pytest.raises(SystemExit):
        main(["--config", "configs/smoke.yaml", "--eval", "tpu"])
