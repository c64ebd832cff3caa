"""Model families. `build_model(cfg)` is the one constructor the scripts use."""
from __future__ import annotations

import importlib

import torch.nn as nn

from model.config import ModelConfig, ModelConfigError

FAMILIES = {"gla": "model.gla", "gated_deltanet": "model.gated_deltanet", "mamba2": "model.mamba2",
            "gpt2": "model.gpt2"}


def build_model(cfg: ModelConfig) -> nn.Module:
    if cfg.family not in FAMILIES:
        raise ModelConfigError(f"unknown model family {cfg.family!r}; families: {', '.join(FAMILIES)}")
    return importlib.import_module(FAMILIES[cfg.family]).build(cfg)
