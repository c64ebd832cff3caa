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
])
def test_bad_overrides_are_errors(args, match):
    with pytest.raises(ConfigError, match=match):
        load_config("configs/smoke.yaml", args)


def test_unknown_yaml_key_is_an_error(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model:\n  n_layer: 2\n")
    with pytest.raises(ConfigError, match="bad.yaml.*'model.n_layer'.*did you mean 'n_layers'"):
        load_config(p)
