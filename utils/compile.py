"""Whether and how train.py compiles the training step: `--train.compile`, `--train.compile_backend`,
`--train.compile_scope`.

The model's forward (the training loss, `model(x, y, return_logits=False)`) is compiled whole with
`torch.compile(fullgraph=True)`: every kernel entry point is a `torch.library` operator (ops/library.py), so there is
nothing to break the graph, and a break is an error rather than a silent slowdown. The backward is traced with it by
AOTAutograd. Evaluation and checkpoints use the uncompiled module (the same parameters), so no second graph is
compiled for the no-grad evaluation and checkpoint keys do not change.

`auto` compiles on a CUDA GPU, except for the recurrent families on `naive` (their chunk loops are many small
PyTorch ops whose compilation would dominate a short parity or test run; GPT-2's `naive` is SDPA and compiles)
and `fla` (its kernels are flash-linear-attention's autograd functions, not operators here); the run log says
which and why. Inductor's own CUDA graphs (mode `reduce-overhead`) are not used: their trees fail at a training
step's first backward (pytorch/pytorch#169545); `--train.cuda_graphs` captures the micro-batch itself
(utils/cuda_graph.py), compiled or not.

`compile_scope`: `model` compiles the whole forward as one graph; `blocks` compiles each block's forward
(regional compilation): Dynamo traces the first block and reuses its code for every other (their parameters are
graph inputs, not guards), so compile time is one block's rather than n_layers', and the embedding, final norm and
chunked loss run eagerly. Module hooks stay outside the graphs, so FSDP2's all-gathers run as they do eagerly, which
is why `blocks` is the scope that compiles under FSDP2 (compiled there by default too: eager FSDP2 steps are
host-bound, its per-block hooks leaving the GPU idle). `auto` (the default) is `blocks`: block scope trains at the
whole model's speed and compiles one block instead of n_layers, which keeps every config's first step under a
minute.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from config import Config, ConfigError, TrainConfig

CHOICES = ("auto", "true", "false")


def scope(tc: TrainConfig) -> str:
    """The compile scope a run uses: train.compile_scope, with `auto` resolved (module docstring)."""
    return "blocks" if tc.compile_scope == "auto" else tc.compile_scope


def resolve_compile(cfg: Config, device_type: str, fsdp: bool) -> tuple[bool, str]:
    """(compile or not, the reason for the run log), checked before any work: a bad value, and compiling the whole
    model under FSDP2 or with packed documents, are errors with the remedy."""
    tc, backend = cfg.train, cfg.model.backend
    if tc.compile not in CHOICES:
        raise ConfigError(f"train.compile must be one of {', '.join(CHOICES)}, got {tc.compile!r}")
    if tc.compile == "true":
        on, why = True, "train.compile=true"
    elif tc.compile == "false":
        on, why = False, "train.compile=false"
    elif device_type != "cuda":
        on, why = False, "auto: off on a CPU (Inductor's CPU code would take minutes to compile for a short run)"
    elif backend == "fla" or (backend == "naive" and cfg.model.family != "gpt2"):
        on, why = False, (f"auto: off for backend {backend!r} ("
                          + ("its chunk loops are many small ops: compile time would dominate a short run"
                             if backend == "naive" else "fla's kernels are not torch.library operators here") + ")")
    elif cfg.data.varlen:
        on, why = False, "auto: off with data.varlen (the document offsets change shape every step)"
    else:
        on, why = True, "auto: on for a CUDA GPU" + (" (FSDP2: block by block)" if fsdp else "")
    if on and fsdp and scope(tc) != "blocks":
        raise ConfigError("the compiled step under FSDP2 is compiled block by block; pass --train.compile_scope=blocks "
                          "(or --train.compile=false)")
    if on and cfg.data.varlen:
        raise ConfigError("train.compile=true does not go with data.varlen (the document offsets change shape every "
                          "step); pass --train.compile=false or --data.varlen=false")
    if on:
        why += f"; backend {tc.compile_backend}, scope {scope(tc)}"
    return on, why


def compiled_step(model: torch.nn.Module, cfg: Config) -> Callable:
    """The module's forward compiled whole (fullgraph) with the configured backend, or block by block. Static
    shapes: every training step has the same, and Dynamo would otherwise trace dynamic shapes once the same forward
    had been compiled at another shape in this process (a test's, say), where AOTAutograd's backward hits PyTorch's
    view-of-a-strided-gradient failure on some models.

    Under DDP the wrapper's own forward (bucket rebuilding, hooks) cannot be traced, so fullgraph is off there:
    Dynamo runs it eagerly and compiles the module inside, which Dynamo's DDPOptimizer splits at DDP's gradient
    buckets so that each bucket's all-reduce still overlaps the backward. The module inside has no graph break
    of its own (tests/test_compile.py compiles every model fullgraph)."""
    if scope(cfg.train) == "blocks":
        compile_blocks(getattr(model, "module", model), cfg.train.compile_backend)
        return model
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    return torch.compile(model, fullgraph=not ddp, dynamic=False, backend=cfg.train.compile_backend)


def compile_blocks(model: torch.nn.Module, backend: str = "inductor") -> int:
    """Regional compilation, in place: every block's forward (`model.blocks[i]`, a checkpoint wrapper included) is
    replaced by its fullgraph, static-shape compilation. The blocks share one code object, so Dynamo compiles the
    first and every other reuses it. Forward hooks (DDP's, FSDP2's unshard and reshard) run around each compiled
    forward, as they do eagerly. Evaluation through the same module runs the compiled blocks too (one more graph,
    for no-grad). Returns the number of blocks compiled."""
    if any(getattr(b.forward, "_torchdynamo_orig_callable", None) for b in model.blocks):
        raise ValueError("the model's blocks are already compiled")
    for block in model.blocks:
        block.forward = torch.compile(block.forward, fullgraph=True, dynamic=False, backend=backend)
    return len(model.blocks)
