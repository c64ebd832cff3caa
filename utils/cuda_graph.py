"""Training micro-batches replayed from one CUDA graph: `--train.cuda_graphs`.

A compiled step still launches every kernel from Python, and the fused backend's operators plan tiles and bind
Triton arguments before each launch. Where the host needs longer to launch a step than the GPU needs to run it, the
GPU waits. A CUDA graph records the launches of one micro-batch once: its forward, its backward and the accumulation
of its gradients into every parameter's `.grad`. Each later micro-batch copies its tokens into the graph's input
buffers and replays it with one call, so the host no longer paces the GPU. `auto` (the default) captures wherever
it can. The optimizer, gradient clipping, evaluation and checkpoints run outside the graph, as without it. The model
may be compiled or eager: the graph records whatever the step launches.

What a graph requires of the step, and how it is met:
- Static shapes: every micro-batch is [micro_batch_size, seq_len] (a different shape is an error).
- Fixed gradient buffers: every `.grad` exists before the capture and is zeroed in place between steps
  (`zero_grad(set_to_none=False)`), so that each replay accumulates into the same memory.
- Warm-up before capture: the first WARMUP micro-batches run normally, on the capture stream. They compile the
  model, compile and autotune the Triton kernels and allocate cuBLAS's workspace; none of that may happen inside a
  capture.
- Nothing in the step may wait for the GPU (`.item()`, a shape read from data). A capture that fails is an error
  naming the setting, with CUDA's reason.
- One process: DDP's and FSDP2's communication hooks run on the host between kernels and are not captured.
- No fp16 loss scaling: the scaler reads the gradients on the host.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from config import Config, ConfigError

CHOICES = ("auto", "true", "false")
WARMUP = 2          # micro-batches run normally before the capture: the second sees every lazy initialisation done


def resolve_cuda_graphs(cfg: Config, device_type: str, world_size: int, precision: str) -> tuple[bool, str]:
    """(capture or not, the reason for the run log). `auto` captures wherever a graph can work (module docstring)
    except on `fla`, whose kernels are flash-linear-attention's own; `true` where it cannot is a ConfigError with the
    remedy."""
    value = str(cfg.train.cuda_graphs).lower()
    if value not in CHOICES:
        raise ConfigError(f"train.cuda_graphs must be one of {', '.join(CHOICES)}, got {cfg.train.cuda_graphs!r}")
    if value == "false":
        return False, "train.cuda_graphs=false"
    why = ("needs a CUDA GPU" if device_type != "cuda" else
           f"runs on one process ({world_size} were launched: DDP's and FSDP2's communication is not captured)"
           if world_size > 1 else
           "needs one shape for every micro-batch (data.varlen's document offsets change every step)"
           if cfg.data.varlen else
           "does not go with fp16 (its loss scaler reads the gradients on the host; bf16 needs no scaler)"
           if precision == "fp16" else None)
    if value == "true":
        if why:
            raise ConfigError(f"train.cuda_graphs {why}; pass --train.cuda_graphs=false")
        return True, "train.cuda_graphs=true"
    if why is None and cfg.model.backend == "fla":
        why = "is not used with fla's kernels (flash-linear-attention's own autograd functions)"
    return (False, f"auto: off (a graph {why})") if why else (True, "auto: on for one CUDA process")


class GraphedMicroBatch:
    """`run(x, y)` (a micro-batch's forward and backward, returning its detached loss) captured as a CUDA graph
    after WARMUP normal calls, then replayed. `params`: the parameters whose gradients the backward accumulates;
    their `.grad` is created here (zeros) when missing. Calling it returns the micro-batch's loss (a fresh tensor).
    `replays` counts the calls served by the graph."""

    def __init__(self, run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 params: list[torch.nn.Parameter], warmup: int = WARMUP) -> None:
        self.run, self.warmup = run, warmup
        self.params = [p for p in params if p.requires_grad]
        self.calls, self.replays = 0, 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.stream = torch.cuda.Stream()
        self.x = self.y = self.loss = None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.x is None:
            self.x, self.y = (torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in (x, y))
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        if x.shape != self.x.shape or y.shape != self.y.shape:
            raise ValueError(f"train.cuda_graphs: a micro-batch of shape {tuple(x.shape)}, the graph's is "
                             f"{tuple(self.x.shape)}; every micro-batch must have the same shape")
        self.x.copy_(x, non_blocking=True)      # asynchronous from pinned memory (train.py pins each batch)
        self.y.copy_(y, non_blocking=True)
        self.calls += 1
        if self.graph is None and self.calls > self.warmup:
            self._capture()
        if self.graph is None:
            return self._on_stream(lambda: self.run(self.x, self.y))
        self.graph.replay()
        self.replays += 1
        return self.loss.clone()        # the graph's own buffer is overwritten by the next replay

    def _on_stream(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """fn() on the capture stream, ordered after and before the current stream's work."""
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = fn()
        torch.cuda.current_stream().wait_stream(self.stream)
        return out

    def _capture(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()        # the warm-up's cached activations; the graph's live in its own pool
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.stream):
                self.loss = self.run(self.x, self.y)
        except RuntimeError as e:
            raise RuntimeError(f"train.cuda_graphs: capturing the training micro-batch failed: {e}. Something in the "
                               "step waits for the GPU or changes with the data; drop --train.cuda_graphs") from e
        self.graph = graph
