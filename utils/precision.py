"""The training precision (`--train.precision`), under FSDP2 the mixed-precision policy that goes with it, and under
DDP the dtype gradients are all-reduced in (`--train.grad_reduce`)."""
from __future__ import annotations

import os

import torch
from accelerate import DistributedDataParallelKwargs, FullyShardedDataParallelPlugin
from accelerate.utils import DDPCommunicationHookType

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


def ddp_kwargs(grad_reduce: str, world_size: int, cuda: bool) -> tuple[DistributedDataParallelKwargs | None, str]:
    """(accelerate's DDP kwargs handler or None, the run log's line) for train.grad_reduce, checked before any work.

    fp32: DDP's own all-reduce of the fp32 gradients. bf16: torch's bf16_compress_hook, half the bytes: each rank's
    gradient bucket is rounded to bf16 (8 significant bits) and divided by the world size, summed in bf16 by NCCL,
    and written back into the fp32 bucket; the optimizer still steps in fp32. It changes the numbers (a relative
    error of about 2^-8 per element of the averaged gradient), so a run that uses it is proved against one GPU by
    the scaling study's loss gap, not assumed equal. NCCL only (gloo has no bf16 hook); FSDP launches reduce-scatter
    in the policy's fp32 (fsdp_plugin)."""
    if grad_reduce not in ("fp32", "bf16"):
        raise ConfigError(f"train.grad_reduce must be fp32 or bf16, got {grad_reduce!r}")
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if world_size == 1:
        return None, "gradient all-reduce: none (one process)"
    if grad_reduce == "fp32":
        return None, "gradient reduction: " + ("FSDP's reduce-scatter, fp32" if fsdp else "DDP's all-reduce, fp32")
    if fsdp:
        raise ConfigError("train.grad_reduce=bf16 applies to DDP launches; FSDP reduce-scatters in fp32. Launch "
                          "with configs/accelerate/ddp.yaml, or leave train.grad_reduce=fp32")
    if not cuda:
        raise ConfigError("train.grad_reduce=bf16 needs NCCL (CUDA GPUs): gloo on CPUs has no bf16 all-reduce hook; "
                          "use train.grad_reduce=fp32 here")
    kwargs = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.BF16)
    return kwargs, "gradient reduction: DDP's all-reduce, bf16 (torch's bf16_compress_hook: half the bytes)"
