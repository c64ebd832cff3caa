"""Run configuration: typed dataclasses, YAML presets and strict dotted overrides.

    cfg = load_config("configs/gla_125m.yaml", ["--optim.lr=3e-4", "--train.max_steps", "200"])

Every key in a YAML file or an override must name a dataclass field; an unknown key is an
error that suggests the closest field, never silently ignored.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import itertools
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from data.config import DataConfig
from model.config import ModelConfig
from utils.errors import UserError


@dataclass
class OptimConfig:
    lr: float = 6e-4
    min_lr_ratio: float = 0.1          # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.1          # not applied to norms, biases, embeddings
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0             # 0 disables clipping


@dataclass
class TrainConfig:
    name: str = "run"
    out_dir: str = "runs"
    seed: int = 1337
    micro_batch_size: int = 8          # sequences per rank per micro-step
    grad_accum: int = 1                # micro-steps per optimizer step
    max_steps: int = 1000
    precision: str = "auto"            # auto (bf16 on GPU, fp32 on CPU) | bf16 | fp16 | fp32
    log_interval: int = 10
    eval_interval: int = 200           # 0 disables periodic validation
    eval_batches: int = 20             # validation: eval_batches·micro_batch_size windows, split across ranks
    ckpt_interval: int = 500           # 0: only the final checkpoint
    keep_ckpts: int = 2
    progress: bool = True
    compile: str = "auto"              # compile the step: auto (CUDA; not fla, recurrent naive, varlen) | true | false
    compile_backend: str = "inductor"  # torch.compile's backend (aot_eager traces without generating code)
    compile_scope: str = "auto"        # auto: blocks | model: one graph | blocks: each block
    cuda_graphs: str = "auto"          # replay each micro-batch from one CUDA graph: auto (CUDA, one process or DDP;
                                       # not FSDP2, fla, varlen, fp16) | true | false (utils/cuda_graph.py)
    log_with: str = "none"             # none | tensorboard (<run dir>/tensorboard/<name>/) | wandb: accelerate's
                                       # tracker, given metrics.jsonl's rows and the config (utils/trackers.py)
    activation_checkpointing: str = "none"  # none | full (recompute each block) | selective (each block's MLP)
    max_bad_steps: int = 5             # stop after this many consecutive steps skipped for a non-finite loss/grad norm
    profile: str = ""                  # A:N: steps A..A+N-1 under torch.profiler on the main process → <run dir>/
                                       # profile/{profile.md,profile.json,trace.json} (utils/profiling.py)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


class ConfigError(UserError, ValueError):
    pass


def keys_help(sections: tuple[str, ...] = ("optim", "train")) -> str:
    """The keys of `sections` with their defaults and source comments (a field's own line and the comment lines
    continuing it), for a script's --help: the comments beside the fields are their documentation."""
    out = []
    for name in sections:
        section = _fields(Config)[name].default_factory()
        lines = inspect.getsource(type(section)).splitlines()
        out.append(f"{name} (--{name}.KEY=VALUE):")
        for f in dataclasses.fields(section):
            at = next(i for i, line in enumerate(lines) if re.match(rf"\s+{f.name}\s*:", line))
            notes = [lines[at].partition("#")[2].strip()]
            notes += [line.strip()[1:].strip() for line in itertools.takewhile(
                lambda line: re.match(r"\s{8,}#", line), lines[at + 1:])]
            text = " ".join(n for n in notes if n)
            out.append(f"  {f.name} = {getattr(section, f.name)!r}" + (f"  # {text}" if text else ""))
    return "\n".join(out)


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _unknown(key: str, where: str, choices: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key.split(".")[-1], choices, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(choices)}"
    return ConfigError(f"unknown config key {key!r} in {where}{hint}")


def _coerce(value: Any, typ: Any, key: str) -> Any:
    """Convert a YAML/CLI value to the field's declared type, or raise naming the key."""
    if dataclasses.is_dataclass(typ):
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} must be a mapping, got {value!r}")
        return _from_dict(typ, value, key)
    try:
        if typ is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            if isinstance(value, bool):
                return value
            raise ValueError
        if typ is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if typ is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)  # YAML reads "3e-4" as a string; float() accepts it
        if typ is str:
            return str(value)
    except (TypeError, ValueError):
        pass
    else:
        return value
    raise ConfigError(f"config key {key!r} expects {typ.__name__}, got {value!r}")


def _from_dict(cls: type, d: dict, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    known = _fields(cls)
    kwargs = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        if k not in known:
            raise _unknown(key, cls.__name__, sorted(known))
        kwargs[k] = _coerce(v, hints[k], key)
    return cls(**kwargs)


def set_dotted(cfg: Config, key: str, raw: str) -> None:
    """Set `a.b.c` on a nested dataclass from a CLI string (parsed as YAML, then type-checked)."""
    obj, parts = cfg, key.split(".")
    for i, p in enumerate(parts):
        known = _fields(type(obj))
        if p not in known:
            raise _unknown(key, type(obj).__name__, sorted(known))
        if i == len(parts) - 1:
            typ = typing.get_type_hints(type(obj))[p]
            if dataclasses.is_dataclass(typ):
                raise ConfigError(f"config key {key!r} is a section; set one of its fields")
            # text fields take the CLI text as typed: YAML would read --train.name=off as False, 0123 as octal 83
            # and null as None, and str() of those would name the run folder 'False', '83' or ''
            try:
                value = yaml.safe_load(raw) if isinstance(raw, str) and typ is not str else raw
            except yaml.YAMLError:
                raise ConfigError(f"config key {key!r} expects {typ.__name__}, got {raw!r}") from None
            setattr(obj, p, _coerce("" if value is None else value, typ, key))
        else:
            obj = getattr(obj, p)
            if not dataclasses.is_dataclass(obj):
                raise ConfigError(f"config key {key!r}: {'.'.join(parts[:i + 1])} is not a section")


def parser_flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string a script's parser defines: parse_overrides' `flags`, for its typo hints."""
    return [o for a in parser._actions for o in a.option_strings]


def parse_overrides(args: list[str], flags: list[str] = ()) -> list[tuple[str, str]]:
    """`--a.b=v` or `--a.b v` pairs; anything else is an error. `flags`: the calling script's own options, for
    a suggestion when an undotted key is a typo of one (--bakend → --backend)."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--") or len(a) == 2:
            raise ConfigError(f"unexpected argument {a!r}: overrides look like --section.key=value")
        name = a.split("=", 1)[0]
        if "." not in name and name[2:] not in _fields(Config):
            close = difflib.get_close_matches(name, list(flags), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(f"unknown option {name!r}: {hint}(config overrides look like --section.key=value)")
        if "=" in a:
            k, v = a[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError(f"override {a!r} has no value")
            k, v = a[2:], args[i + 1]
            i += 2
        out.append((k, v))
    return out


def _at_least(lo: float, strict: bool = False) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v > lo, f"> {lo}") if strict else (lambda v: v >= lo, f">= {lo}")


_UNIT = (lambda v: 0 <= v < 1, "in [0, 1)")
CHECKPOINTING = ("none", "full", "selective")     # train.activation_checkpointing (utils/activation_checkpointing.py)
# Ranges the field types cannot say. Outside them a run is a silent no-op or a crash deep inside training:
# grad_accum 0 "trains" with loss 0 and saves a checkpoint, max_steps -1 does nothing and exits 0, log_interval 0
# divides by 0.
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "train.micro_batch_size": _at_least(1), "train.grad_accum": _at_least(1), "train.max_steps": _at_least(1),
    "train.log_interval": _at_least(1), "train.eval_interval": _at_least(0), "train.eval_batches": _at_least(0),
    "train.ckpt_interval": _at_least(0), "train.keep_ckpts": _at_least(0), "train.max_bad_steps": _at_least(1),
    "train.activation_checkpointing": (lambda v: v in CHECKPOINTING, f"one of {', '.join(CHECKPOINTING)}"),
    "train.compile_scope": (lambda v: v in ("auto", "model", "blocks"), "one of auto, model, blocks"),
    "train.name": (lambda v: v.strip() not in ("", ".", ".."), "a folder name (not empty, '.' or '..')"),
    "train.profile": (lambda v: v == "" or bool(re.fullmatch(r"([2-9]|[1-9]\d+):[1-9]\d*", v)),
                      "empty or A:N, the N steps from step A >= 2 (step 1 compiles)"),
    "data.seq_len": _at_least(1), "data.num_proc": _at_least(0),
    "optim.lr": _at_least(0, strict=True), "optim.warmup_steps": _at_least(0),
    "optim.min_lr_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]"), "optim.weight_decay": _at_least(0),
    "optim.beta1": _UNIT, "optim.beta2": _UNIT, "optim.eps": _at_least(0, strict=True),
    "optim.grad_clip": _at_least(0),
    # every model dimension: 0 would divide by zero (head_k_dim ** -0.5) or build empty layers deep in the run
    **{f"model.{k}": _at_least(1) for k in (
        "vocab_size", "d_model", "n_layers", "n_heads", "head_k_dim", "head_v_dim", "chunk_size", "gate_low_rank",
        "conv_size", "expand", "ssm_head_dim", "ssm_state", "ssm_groups", "max_seq_len", "latent_dim", "ra_window")},
    "model.mlp_hidden": _at_least(0), "model.gate_normalizer": _at_least(0, strict=True),
    "model.init_std": _at_least(0),
    "model.norm_eps": _at_least(0, strict=True), "model.o_norm_eps": _at_least(0),
    "data.synthetic.vocab_size": _at_least(2), "data.synthetic.order": _at_least(1),
    "data.synthetic.concentration": _at_least(0, strict=True), "data.synthetic.train_tokens": _at_least(1),
    "data.synthetic.eval_tokens": _at_least(1),
}


def _floats(obj: Any, prefix: str = ""):
    """(dotted key, value) of every float field under a config dataclass."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _floats(value, key + ".")
        elif hints[f.name] is float:
            yield key, value


def validate(cfg: Config) -> Config:
    """Raise ConfigError naming the first float that is not finite (inf or nan: a run would take it until it
    diverged), then the first key outside its range (RANGES), then a profiled window past the run's end."""
    for key, value in _floats(cfg):
        if not math.isfinite(value):
            raise ConfigError(f"config key {key!r} must be a finite number, got {value!r}")
    for key, (ok, want) in RANGES.items():
        obj, *path, name = [cfg, *key.split(".")]
        for part in path:
            obj = getattr(obj, part)
        value = getattr(obj, name)
        if not ok(value):
            raise ConfigError(f"config key {key!r} must be {want}, got {value!r}")
    if cfg.train.profile:
        first, count = map(int, cfg.train.profile.split(":"))
        if first + count - 1 > cfg.train.max_steps:
            raise ConfigError(f"train.profile={cfg.train.profile} ends at step {first + count - 1}, after "
                              f"train.max_steps={cfg.train.max_steps}; choose a window inside the run")
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, flags: list[str] = ()) -> Config:
    """The preset at `path` with `overrides` applied, validated. `flags`: the script's own options (see
    parse_overrides)."""
    d = {}
    if path is not None:
        with open(path) as f:
            try:
                d = yaml.safe_load(f) or {}
            except yaml.YAMLError as e:
                raise ConfigError(f"{path}: {_yaml_problem(e)}; fix the file's YAML syntax") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
    try:
        cfg = _from_dict(Config, d)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    for k, v in parse_overrides(overrides or [], flags):
        set_dotted(cfg, k, v)
    return validate(cfg)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """'not valid YAML at line L, column C: PROBLEM' (1-based, as editors count) from a yaml error."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"not valid YAML{where}: {problem}"


def config_from_dict(d: dict) -> Config:
    """The inverse of to_dict (e.g. a checkpoint's saved config), with the same strict checking."""
    return _from_dict(Config, d)


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def flatten(d: dict, prefix: str = "") -> dict:
    """A nested dict (to_dict's) as one level with dotted keys: {"optim": {"lr": 3e-4}} -> {"optim.lr": 3e-4}."""
    out = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def save_config(cfg: Config, path: str | Path) -> None:
    with open(path, "w") as f:
        yaml.safe_dump(to_dict(cfg), f, sort_keys=False)
