"""Config loading: YAML presets, typed dotted overrides, unknown keys are errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from config import ConfigError, config_from_dict, load_config, to_dict

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_preset_loads_and_round_trips(path):
    cfg = load_config(path)
    assert config_from_dict(to_dict(cfg)) == cfg


def test_overrides_are_typed():
    cfg = load_config("configs/smoke.yaml", ["--optim.lr=3e-4", "--train.max_steps", "12",
                                             "--train.progress=false", "--model.backend=fla"])
    assert cfg.optim.lr == 3e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.train.max_steps == 12 and cfg.train.progress is False and cfg.model.backend == "fla"


@pytest.mark.parametrize("args, match", [
    (["--model.d_modle=3"], "unknown config key 'model.d_modle'.*did you mean 'd_model'"),
    (["--nope.x=1"], "unknown config key 'nope.x'"),
    (["--train.max_steps=1.5"], "expects int"),
    (["--train.progress=maybe"], "expects bool"),
    (["--model=3"], "is a section"),
    (["train.max_steps=3"], "unexpected argument"),
    (["--train.max_steps"], "has no value"),
    # ranges the types cannot say (config.RANGES)
    (["--train.grad_accum=0"], "'train.grad_accum' must be >= 1, got 0"),
    (["--train.max_steps=-1"], "'train.max_steps' must be >= 1"),
    (["--train.micro_batch_size=0"], "'train.micro_batch_size' must be >= 1"),
    (["--train.log_interval=0"], "'train.log_interval' must be >= 1"),
    (["--train.name="], "'train.name' must be a folder name"),
    (["--optim.lr=0"], "'optim.lr' must be > 0"),
    (["--optim.beta2=1"], r"'optim.beta2' must be in \[0, 1\)"),
    (["--data.seq_len=0"], "'data.seq_len' must be >= 1"),
    (["--train.max_bad_steps=0"], "'train.max_bad_steps' must be >= 1"),
    (["--train.profile=1:5"], r"'train.profile' must be empty or A:N, the N steps from step A >= 2"),
    (["--train.profile=30"], "'train.profile' must be empty or A:N"),
    (["--train.profile=30:0"], "'train.profile' must be empty or A:N"),
    (["--train.max_steps=10", "--train.profile=8:5"], r"train.profile=8:5 ends at step 12, after train.max_steps=10"),
    (["--train.activation_checkpointing=mlp"], "'train.activation_checkpointing' must be one of none, full, selective"),
])
def test_bad_overrides_are_errors(args, match):
    with pytest.raises(ConfigError, match=match):
        load_config("configs/smoke.yaml", args)


def test_unknown_yaml_key_is_an_error(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model:\n  n_layer: 2\n")
    with pytest.raises(ConfigError, match="bad.yaml.*'model.n_layer'.*did you mean 'n_layers'"):
        load_config(p)


@pytest.mark.parametrize("raw", ["off", "0123", "null", "true", "1e3", "[a]"])
def test_text_fields_keep_the_text_as_typed(raw):
    # YAML reads these as False, 83, None, True, 1000.0 and a list; a run named by str() of that went elsewhere
    cfg = load_config("configs/smoke.yaml", [f"--train.name={raw}", f"--data.cache_dir={raw}"])
    assert cfg.train.name == raw and cfg.data.cache_dir == raw


def test_zero_disables_where_documented():
    cfg = load_config("configs/smoke.yaml", ["--train.eval_interval=0", "--train.ckpt_interval=0",
                                             "--train.keep_ckpts=0", "--optim.grad_clip=0", "--optim.warmup_steps=0"])
    assert cfg.train.eval_interval == 0 and cfg.optim.grad_clip == 0


def test_a_mistyped_script_option_is_named():
    with pytest.raises(ConfigError, match="unknown option '--bakend': did you mean --backend"):
        load_config("configs/smoke.yaml", ["--bakend", "naive"], flags=["--backend", "--config"])


def test_malformed_yaml_names_the_file_line_and_column(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model:\n  d_model: 32\n  n_layers: 2\n   n_heads: 4\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML at line 4, column 11: mapping values are not "
                                          r"allowed here; fix the file's YAML syntax"):
        load_config(p)


@pytest.mark.parametrize("key", ["optim.lr", "optim.eps", "optim.grad_clip", "model.norm_eps", "model.ra_alpha",
                                 "data.synthetic.concentration"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", ".inf"])
def test_every_float_key_must_be_finite(key, value):
    with pytest.raises(ConfigError, match=f"'{key}' must be a finite number"):
        load_config("configs/smoke.yaml", [f"--{key}={value}"])


@pytest.mark.parametrize("key", ["d_model", "n_layers", "n_heads", "head_k_dim", "head_v_dim", "chunk_size",
                                 "gate_low_rank", "conv_size", "expand", "ssm_head_dim", "ssm_state", "ssm_groups",
                                 "max_seq_len", "latent_dim", "ra_window", "vocab_size"])
def test_every_model_dimension_must_be_positive(key):
    with pytest.raises(ConfigError, match=f"'model.{key}' must be >= 1, got 0"):
        load_config("configs/smoke.yaml", [f"--model.{key}=0"])


def test_a_non_finite_float_in_yaml_is_refused_too(tmp_path):
    p = tmp_path / "inf.yaml"
    p.write_text("optim:\n  lr: .inf\n")
    with pytest.raises(ConfigError, match="'optim.lr' must be a finite number, got inf"):
        load_config(p)


def test_help_lists_the_training_keys_with_their_comments(capsys):
    import train

    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "activation_checkpointing = 'none'  # none | full (recompute each block) | selective" in out
    assert "max_bad_steps = 5  # stop after this many consecutive steps skipped" in out
    assert "grad_clip = 1.0  # 0 disables clipping" in out and "optim (--optim.KEY=VALUE):" in out
