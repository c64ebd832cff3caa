"""The eval scripts' user errors: each names what is wrong and what to do, and on the command line it is one
`error:` line with exit 1 (Ctrl-C: one line, exit 130), never a traceback. Also perplexity's default output
name, which must not let a score on other data replace the standard one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState

import train
from config import ConfigError
from eval import equivalence, generate, perplexity
from model import build_model
from model.config import ModelConfig
from ops import BackendError
from tests.test_train import tiny

REPO = Path(__file__).resolve().parents[2]
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the Triton backends")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tiny synthetic-data GLA run (vocab 16), trained for 2 steps."""
    tmp = tmp_path_factory.mktemp("cli")
    train.main(tiny(tmp, "cli", "--train.max_steps=2", "--train.eval_batches=0", "--train.eval_interval=0"))
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return tmp / "runs" / "cli"


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=env or os.environ.copy())


def no_interpreter() -> dict:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


@pytest.mark.parametrize("script", ["eval/perplexity.py", "eval/generate.py"])
def test_missing_checkpoint_is_one_error_line(script, tmp_path):
    r = cli(script, "--ckpt", str(tmp_path / "nonexistent"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: no complete checkpoint in "), r.stderr


@pytest.mark.parametrize("script", ["eval/perplexity.py", "eval/generate.py"])
def test_ctrl_c_exits_130_without_a_traceback(script):
    """The interrupt is raised where the checkpoint is looked up (the scripts import resolve_checkpoint by name)."""
    code = ("import runpy, sys, utils.checkpoint as c\n"
            "def interrupted(path): raise KeyboardInterrupt\n"
            "c.resolve_checkpoint = interrupted\n"
            f"sys.argv = [{script!r}, '--ckpt', 'x']\n"
            f"runpy.run_path({script!r}, run_name='__main__')\n")
    r = cli("-c", code)
    assert r.returncode == 130 and "Traceback" not in r.stderr and r.stderr.splitlines()[-1] == "interrupted", r.stderr


def test_perplexity_cli_errors(run_dir):
    r = cli("eval/perplexity.py", "--ckpt", str(run_dir), "--stride", "300")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "error: --stride must be between 1 and the window length 32 (--seq_len), got 300"


@NO_GPU
def test_perplexity_on_a_gpu_backend_names_it_and_the_remedy(run_dir):
    r = cli("eval/perplexity.py", "--ckpt", str(run_dir), "--backend", "fused", env=no_interpreter())
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: op 'gla', backend 'fused': its Triton kernels need a CUDA GPU"), r.stderr
    assert "--backend naive" in r.stderr and "TRITON_INTERPRET=1" in r.stderr


def test_perplexity_window_settings_are_checked_first(run_dir, monkeypatch):
    def unreachable(*args, **kwargs):
        raise AssertionError("data prepared before the settings were checked")

    monkeypatch.setattr(perplexity, "prepare_split", unreachable)
    for flags, msg in [(["--stride", "300"], "--stride must be between 1 and the window length 32"),
                       (["--seq_len", "8", "--stride", "0"], None), (["--seq_len", "-3"], "--seq_len and --batch_size"),
                       (["--batch_size", "0"], "--seq_len and --batch_size must be positive"),
                       (["--train.seed=3"], "only --data.\\* overrides"),
                       (["--seq-len", "8"], "unknown option '--seq-len': did you mean --seq_len")]:
        if msg is None:        # stride 0 means "= seq_len": valid, so it gets as far as the data
            with pytest.raises(AssertionError, match="data prepared"):
                perplexity.main(["--ckpt", str(run_dir), *flags])
            continue
        with pytest.raises(ConfigError, match=msg):
            perplexity.main(["--ckpt", str(run_dir), *flags])
    with pytest.raises(FileNotFoundError, match="--out .*does not exist"):
        perplexity.main(["--ckpt", str(run_dir), "--out", str(run_dir / "no" / "such.json")])


def test_perplexity_window_longer_than_learned_positions():
    cfg = ModelConfig(family="gpt2", d_model=16, n_layers=1, n_heads=2, vocab_size=32, max_seq_len=64)
    model = build_model(cfg)
    full = type("Cfg", (), {"model": cfg})()
    perplexity.check_window(model, full, 64, 64, 1)
    with pytest.raises(ConfigError, match="windows of 65 tokens .*max_seq_len 64.*--seq_len 64 or less"):
        perplexity.check_window(model, full, 65, 65, 1)
    gla = build_model(ModelConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, head_k_dim=4, head_v_dim=8,
                                  mlp_hidden=32, max_seq_len=64))
    perplexity.check_window(gla, type("Cfg", (), {"model": gla.cfg})(), 4096, 4096, 1)  # no positions to outgrow


def test_perplexity_default_name_tags_other_data(run_dir, tmp_path):
    """The checkpoint's own data keeps the old name; other data (here another Markov chain) gets a tag."""
    cache = f"--data.cache_dir={tmp_path / 'cache'}"
    std = run_dir / "eval" / "step_00000002_valid_32_32.json"
    perplexity.main(["--ckpt", str(run_dir), "--split", "valid", cache])
    first = json.loads(std.read_text())
    perplexity.main(["--ckpt", str(run_dir), "--split", "valid", cache, "--data.synthetic.seed=5"])
    perplexity.main(["--ckpt", str(run_dir), "--split", "valid", cache, "--data.synthetic.train_tokens=30000"])
    assert json.loads(std.read_text()) == first                   # the standard result stays as it was
    tagged = sorted(std.parent.glob("step_00000002_valid_32_32_*.json"))
    assert [p.name.rsplit("-", 1)[0] for p in tagged] == ["step_00000002_valid_32_32_synthetic"], tagged
    assert json.loads(tagged[0].read_text())["loss"] != first["loss"]


def test_perplexity_on_data_with_a_larger_vocabulary_names_it(run_dir, tmp_path):
    """Tokens the embedding has no row for: an error naming both vocabularies, not an IndexError."""
    with pytest.raises(ConfigError, match="vocab_size 32, but the model embeds 16"):
        perplexity.main(["--ckpt", str(run_dir), "--split", "valid", f"--data.cache_dir={tmp_path / 'cache'}",
                         "--data.synthetic.vocab_size=32"])


def test_data_tag_ignores_spellings_of_one_source(tmp_path):
    from data.config import DataConfig

    (tmp_path / "wiki").mkdir()
    base = DataConfig(source="hf:Salesforce/wikitext:wikitext-103-raw-v1")
    same = DataConfig(source=base.source, eval_source=base.source, cache_dir="elsewhere", tokenizer_file="x")
    assert perplexity.data_tag(same, base, "test") == ""
    other = DataConfig(source=base.source, eval_source=f"local:{tmp_path / 'wiki'}/")
    tag = perplexity.data_tag(other, base, "test")
    assert tag.startswith("wiki-") and len(tag) == len("wiki-") + 6
    assert perplexity.data_tag(other, base, "train") == ""      # eval_source leaves the train split alone
    assert perplexity.data_tag(DataConfig(source=base.source, eval_source=str(tmp_path / "wiki")), other, "test") == ""


def test_generate_prompt_errors(run_dir):
    r = cli("eval/generate.py", "--ckpt", str(run_dir), "--prompt", "3 1 99", "--max_new_tokens", "2")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == ("error: --prompt has token ids 99 outside the model's vocabulary (ids 0 to 15, "
                                "model.vocab_size 16)")
    args = ["--ckpt", str(run_dir), "--max_new_tokens", "2"]
    with pytest.raises(ConfigError, match="'hello': this model was trained on synthetic data, which has no text "
                                          "tokenizer; give space-separated token ids below vocab_size 16"):
        generate.main([*args, "--prompt", "hello"])
    with pytest.raises(ConfigError, match="ids -1, 16 outside"):
        generate.main([*args, "--prompt", "-1 16 2"])
    with pytest.raises(ConfigError, match="gives no tokens; give space-separated token ids"):
        generate.main(args)                                          # the default prompt, "\n", is text
    with pytest.raises(ConfigError, match="--num_samples ≥ 1"):
        generate.main([*args, "--prompt", "1", "--num_samples", "0"])


def test_generate_text_prompt_outside_a_small_vocabulary():
    with pytest.raises(ConfigError, match="the prompt encodes to token ids 50, 70 outside .*vocab_size 40"):
        generate.prompt_ids("ab", 40, lambda text: [3, 70, 50, 70])
    assert generate.prompt_ids("ab", 80, lambda text: [3, 70]) == [3, 70]


def test_equivalence_help_cites_nothing_missing(capsys):
    with pytest.raises(SystemExit):
        equivalence.main(["--help"])
    out = capsys.readouterr().out
    assert "STYLE.md" not in out and "TRITON_INTERPRET=1 python -m eval.equivalence" in out


@NO_GPU
def test_equivalence_on_cpu_says_to_set_triton_interpret():
    r = cli("-m", "eval.equivalence", "--config", "configs/smoke.yaml", "--backends", "chunk", env=no_interpreter())
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: op 'gla', backend 'chunk': its Triton kernels need a CUDA GPU"), r.stderr
    assert "TRITON_INTERPRET=1" in r.stderr


def test_equivalence_checks_backends_before_the_reference_run(monkeypatch):
    def unreachable(*args, **kwargs):
        raise AssertionError("the reference ran first")

    monkeypatch.setattr(equivalence, "compare", unreachable)
    with pytest.raises(BackendError, match="unknown backend 'bogus'"):
        equivalence.main(["--config", "configs/smoke.yaml", "--backends", "chunk,bogus"])
