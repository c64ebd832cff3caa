"""Activation checkpointing for train.py (`--train.activation_checkpointing`): recompute part of the forward in
the backward instead of keeping its activations.

- `none`: autograd keeps every intermediate of every block.
- `full`: each block (`model.blocks[i]`) runs under non-reentrant `torch.utils.checkpoint`: the forward keeps only
  the block's input, the backward reruns the block. Activation memory falls to one residual stream [B, T, d] per
  layer plus one block's intermediates at a time, for one more forward of the blocks (about +1/3 of the step's
  FLOPs).
- `selective`: only each block's MLP (`block.mlp`) is recomputed; the mixer's intermediates and its output are
  kept. The MLP is the split that frees the most memory per recomputed FLOP: its intermediates (SwiGLU: the
  [B, T, 2·hidden] gate/up projection, silu(gate) and their product, 4·hidden values a token; GELU: 3 × 4d) are the
  largest a layer keeps and cost two GEMMs to recompute, while recomputing the mixer would rerun the chunkwise
  scan, the step's most expensive kernels, to free smaller [B, T, H, D] tensors. A model without an MLP (Mamba-2
  with model.mlp_hidden 0, its default) has nothing to recompute selectively: that is an error, not a silent
  `none`.

The wrapper is torch.distributed's `checkpoint_wrapper` (what accelerate's and torchtitan's activation
checkpointing use), applied from outside the model to the unprepared module, before `accelerator.prepare` and
`torch.compile`:

- DDP wraps the whole model; non-reentrant checkpointing runs its gradient hooks as usual.
- FSDP2: accelerate's wrap policy looks through `CheckpointWrapper`, so every block stays its own `fully_shard`
  unit and the recompute gathers its parameters again (accelerate's own `fsdp_activation_checkpointing` does the
  same; it must then be off, or both would wrap the blocks).
- torch.compile: Dynamo traces the non-reentrant checkpoint as a higher-order op, so the model still compiles
  fullgraph and AOTAutograd's partitioner recomputes the region in the backward.

State dict keys do not change (the wrapper drops its `_checkpoint_wrapped_module.` prefix on save and restores it
on load): checkpoints move between modes, and a resumed run may change the mode.
"""
from __future__ import annotations

import functools
import os

import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl, CheckpointWrapper,
                                                                         apply_activation_checkpointing,
                                                                         checkpoint_wrapper)

from config import CHECKPOINTING, ConfigError


def checkpoint_activations(model: nn.Module, mode: str) -> str:
    """Wrap `model`'s blocks (`full`) or their MLPs (`selective`) in place for recomputation in the backward;
    `none` leaves the model as it is. Returns what was wrapped, for the run log. Works on a meta-device model, so
    train.py checks the setting before any data is prepared."""
    if mode not in CHECKPOINTING:
        raise ConfigError(f"train.activation_checkpointing must be one of {', '.join(CHECKPOINTING)}, got {mode!r}")
    if mode == "none":
        return "none"
    if os.environ.get("FSDP_ACTIVATION_CHECKPOINTING", "false").lower() == "true":
        raise ConfigError(f"train.activation_checkpointing={mode} and accelerate's fsdp_activation_checkpointing would "
                          "both wrap the blocks; set fsdp_activation_checkpointing: false in the accelerate config")
    blocks = list(model.blocks)
    if mode == "full":
        targets = {id(b) for b in blocks}
    else:
        mlps = [b.mlp for b in blocks if b.mlp is not None]
        if not mlps:
            raise ConfigError("train.activation_checkpointing=selective recomputes each block's MLP, and this model "
                              "has none (model.mlp_hidden 0); use full")
        targets = {id(m) for m in mlps}
    if any(isinstance(m, CheckpointWrapper) for m in model.modules()):
        raise ValueError("the model is already wrapped for activation checkpointing")
    # No forward of these models draws random numbers (no dropout), so the RNG state need not be saved and restored
    wrap = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrap, check_fn=lambda m: id(m) in targets)
    what = "each block" if mode == "full" else "each block's MLP"
    return f"{mode}: {what} recomputed in the backward ({len(targets)} wrapped)"
