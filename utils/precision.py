"""The training precision (`--train.precision`) and, under FSDP2, the mixed-precision policy that goes with it."""
from __future__ import annotations

import os

import torch
from accelerate import FullyShardedDataParallelPlugin

from config import ConfigError


def resolve_precision(p: str) -> str:
    """train.precision as accelerate's mixed_precision (bf16, fp16 or no); auto is bf16 on a GPU, fp32 on a CPU."""
    choices = {"auto": None, "bf16": "bf16", "fp16": "fp16", "fp32": "no"}
    if p not in choices:
        raise ConfigError(f"train.precision must be one of {', '.join(choices)}, got {p!r}")
    if p == "fp16" and not torch.cuda.is_available():
        # accelerate ignores fp16 on CPU and trains in fp32, while the run would be labelled fp16
        raise ConfigError("train.precision fp16 needs a CUDA GPU (on CPU accelerate trains in fp32 instead); "
                          "use fp32 or bf16 here")
    return choices[p] or ("bf16" if torch.cuda.is_available() else "no")


def fsdp_plugin(precision: str) -> FullyShardedDataParallelPlugin | None:
    """Under `accelerate launch` with an FSDP2 config (configs/accelerate/fsdp.yaml) and bf16/fp16: compute in
    that dtype but reduce and accumulate gradients in fp32, and leave outputs in the dtype each module makes
    (the loss is fp32), as torchtitan does. accelerate's own policy reduces in bf16 (gradient accumulation over
    micro-batches included) and casts every output to bf16, so each logged loss would be a mean of bf16-rounded
    micro-batch losses (bf16's spacing near a loss of 5 is 0.03 nats); casting outputs to fp32 instead would run
    the LM head's GEMM in fp32. The rest of the plugin comes from accelerate's environment, as it would without
    this. FSDP1 launches (FSDP_VERSION 1, accelerate's default) keep accelerate's own policy."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if (os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true" or os.environ.get("FSDP_VERSION", "1") != "2"
            or dtype is None):
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    return FullyShardedDataParallelPlugin(mixed_precision_policy=policy)
