"""scripts/parity.py end to end on a tiny GLA: naive and chunk trained from the same weights on the
same data in fp32 stay equal (the chunk kernels are exact in fp32), the noise-floor run splits the
micro-batch, and the report is written."""
from __future__ import annotations

import json

import pytest

from scripts.parity import main

TINY = ["--train.precision=fp32", "--train.progress=false", "--model.d_model=32", "--model.n_heads=2",
        "--model.head_k_dim=8", "--model.head_v_dim=16", "--model.mlp_hidden=64", "--data.seq_len=64",
        "--train.micro_batch_size=2", "--train.eval_batches=1", "--train.log_interval=1",
        "--data.synthetic.train_tokens=20000", "--data.synthetic.eval_tokens=600"]


# the parallel case also checks a fused backend restricted to some components (`fused[state]` → --fuse state) and
# a second floor split (micro-batch 4: `naive~` at 2 × 2, `naive~4` at 1 × 4)
@pytest.mark.parametrize("parallel, other, run", [(False, "chunk", "smoke_chunk"), (True, "fused[state]", "smoke_fused-state")],
                         ids=["sequential", "parallel"])
def test_parity_naive_vs_chunk(tmp_path, parallel, other, run):
    floor_args = ["--floor", "2,4", "--parallel", "--train.micro_batch_size=4"] if parallel else ["--floor"]
    result = main(["--config", "configs/smoke.yaml", "--backends", f"naive,{other}", "--steps", "3", "--eval-interval", "3",
                   "--out", str(tmp_path), f"--data.cache_dir={tmp_path / 'cache'}", *TINY, *floor_args])
    naive, chunk = result["backends"]["naive"], result["backends"][other]
    assert naive["pass"] and naive["final_delta_val"] == 0
    assert chunk["pass"] and abs(chunk["final_delta_val"]) < 1e-4, chunk["delta_val"]
    assert abs(chunk["test"]["loss"] - naive["test"]["loss"]) < 1e-4
    floors = {"naive~": ("smoke_naive_floor", 2)} | ({"naive~4": ("smoke_naive_floor4", 4)} if parallel else {})
    micro = 4 if parallel else 2
    assert [b for b in result["backends"] if "~" in b] == list(floors)
    for name, (folder, split) in floors.items():
        floor = result["backends"][name]
        assert abs(floor["final_delta_val"]) < 1e-4, floor["delta_val"]
        cfg = (tmp_path / folder / "config.yaml").read_text()
        assert f"micro_batch_size: {micro // split}" in cfg and f"grad_accum: {split}" in cfg, cfg
        assert f"eval_batches: {split}" in cfg
        assert f"`{name}` ends" in (tmp_path / "parity.md").read_text()
    assert json.loads((tmp_path / "parity.json").read_text())["backends"][other]["pass"]
    if parallel:
        assert "step" in (tmp_path / f"{run}.log").read_text()
        assert "gla=fused[state]" in (tmp_path / f"{run}.log").read_text()   # the run used only that component
    assert (tmp_path / "parity.png").stat().st_size > 0 and other in (tmp_path / "parity.md").read_text()


def test_teacher_forced_scores_every_backend_on_the_reference_weights(tmp_path, monkeypatch):
    """--teacher: the reference keeps a checkpoint per evaluation; every backend is scored on each. In fp32
    chunk's Δ there is rounding only, and the reference's own is exactly 0."""
    result = main(["--config", "configs/smoke.yaml", "--backends", "naive,chunk", "--steps", "4", "--eval-interval", "2",
                   "--teacher", "--out", str(tmp_path), f"--data.cache_dir={tmp_path / 'cache'}", *TINY])
    teacher = result["teacher"]
    assert list(teacher["naive"]["delta"]) == [2, 4] and set(teacher["naive"]["delta"].values()) == {0.0}
    assert teacher["chunk"]["pass"] and all(abs(d) < 1e-5 for d in teacher["chunk"]["delta"].values())
    # the losses differ between checkpoints: each step's weights were loaded, not the last ones twice
    assert teacher["chunk"]["loss"][2] != teacher["chunk"]["loss"][4]
    assert "Teacher-forced" in (tmp_path / "parity.md").read_text()

    # the check can fail: a backend whose model is not the reference's (noise on its weights) does
    import torch

    import eval.perplexity as perplexity
    from scripts.parity import teacher_forced

    real = perplexity.load_model

    def nudged(ckpt, backend=None, device="cpu", fuse=None):
        model, cfg, path = real(ckpt, backend, device, fuse)
        if backend == "chunk":
            torch.manual_seed(0)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * torch.randn_like(p))
        return model, cfg, path

    monkeypatch.setattr(perplexity, "load_model", nudged)
    wrong = teacher_forced(tmp_path / "smoke_naive", ["naive", "chunk"], [f"--data.cache_dir={tmp_path / 'cache'}"],
                           1e-4)
    assert wrong["naive"]["pass"] and not wrong["chunk"]["pass"]


def test_floor_split_must_divide_the_micro_batch():
    import argparse

    from scripts.parity import floor_overrides, floor_splits

    assert floor_splits("2,4") == [2, 4]
    for bad in ("", "2,", "x", "1", "2,2"):
        with pytest.raises(argparse.ArgumentTypeError, match="distinct whole numbers"):
            floor_splits(bad)

    assert floor_overrides("configs/smoke.yaml", ["--train.micro_batch_size=4"], 4)[:2] == [
        "--train.micro_batch_size=1", "--train.grad_accum=4"]
    for split in (1, 3):
        with pytest.raises(SystemExit, match="must be 2 or more and divide it"):
            floor_overrides("configs/smoke.yaml", ["--train.micro_batch_size=4"], split)


def test_settings_and_backends_are_checked_before_any_training(tmp_path, monkeypatch):
    """A typo in an option or an override, or a backend this machine cannot run, fails at once with the remedy,
    not after the reference backend has trained."""
    import subprocess

    from config import ConfigError
    from ops import BackendError

    def unreachable(*args, **kwargs):
        raise AssertionError("a training started before the settings were checked")

    monkeypatch.setattr(subprocess, "run", unreachable)
    monkeypatch.setattr(subprocess, "Popen", unreachable)
    base = ["--config", "configs/smoke.yaml", "--out", str(tmp_path / "p")]
    with pytest.raises(ConfigError, match="unknown option '--tolerence': did you mean --tolerance"):
        main(base + ["--tolerence", "0.1"])
    with pytest.raises(ConfigError, match="'train.max_stepz'.*did you mean 'max_steps'"):
        main(base + ["--train.max_stepz=3"])
    with pytest.raises(BackendError, match="unknown backend 'nope' for op 'gla'"):
        main(base + ["--backends", "naive,nope"])
    with pytest.raises(BackendError, match=r"unknown fused component\(s\) warp"):
        main(base + ["--backends", "naive,fused[warp]"])
    assert not (tmp_path / "p").exists()
