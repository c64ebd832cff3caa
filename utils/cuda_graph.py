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
- Fixed gradient buffers. A micro-batch that starts a step (`first`) writes its gradients rather than adding them:
  every `.grad` is set to None before it runs, so autograd hands each parameter the gradient tensor it made, which
  in a capture comes from the graph's pool and is rewritten in place by every replay. No pass zeroes the gradients
  and none adds into zeros. The step's other micro-batches accumulate into those tensors. Under DDP the reducer of
  a syncing micro-batch then copies each gradient, divided by the world size, into its bucket and rebinds `.grad`
  to the bucket's view (one pass, where gradients kept in the buckets cost a zeroing, an add and a division). A
  replay runs no Python, so after each one every `.grad` is bound again to the tensor it held when that graph was
  captured: the optimizer reads the buckets, and the next micro-batch adds into what the first one wrote. Where
  `first` is not used every `.grad` exists before the capture and is zeroed in place between steps
  (`zero_grad(set_to_none=False)`).
- Warm-up before capture: the first WARMUP micro-batches (DDP_WARMUP under DDP) run normally, on the capture
  stream. They compile the model, compile and autotune the Triton kernels and allocate cuBLAS's workspace, and let
  DDP's reducer settle its buckets; none of that may happen inside a capture.
- Nothing in the step may wait for the GPU (`.item()`, a shape read from data). A capture that fails is an error
  naming the setting, with CUDA's reason.
- DDP: NCCL's all-reduce is captured with the backward (NCCL allows it), as PyTorch documents: the wrapper built on
  the capture stream (ddp_capture), asynchronous error handling off, DDP_WARMUP eager iterations first. Micro-batches
  inside no_sync launch no all-reduce, so they have a graph of their own. FSDP2 is not captured: its all-gathers and
  reshards are driven from the host block by block.
- No fp16 loss scaling: the scaler reads the gradients on the host.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator

import torch

from config import Config, ConfigError

CHOICES = ("auto", "true", "false")
WARMUP = 2          # micro-batches run normally before the capture: the second sees every lazy initialisation done
DDP_WARMUP = 11     # under DDP: its reducer rebuilds buckets and settles over the first iterations (PyTorch's advice)
DDP_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}      # set before the process group starts when DDP is captured


def resolve_cuda_graphs(cfg: Config, device_type: str, world_size: int, precision: str,
                        fsdp: bool = False) -> tuple[bool, str]:
    """(capture or not, the reason for the run log). `auto` captures wherever a graph can work (module docstring)
    except on `fla`, whose kernels are flash-linear-attention's own; `true` where it cannot is a ConfigError with the
    remedy."""
    value = str(cfg.train.cuda_graphs).lower()
    if value not in CHOICES:
        raise ConfigError(f"train.cuda_graphs must be one of {', '.join(CHOICES)}, got {cfg.train.cuda_graphs!r}")
    if value == "false":
        return False, "train.cuda_graphs=false"
    why = ("needs a CUDA GPU" if device_type != "cuda" else
           "does not capture FSDP2 (its all-gathers and reshards are driven from the host block by block)"
           if fsdp else
           "needs one shape for every micro-batch (data.varlen's document offsets change every step)"
           if cfg.data.varlen else
           "does not go with fp16 (its loss scaler reads the gradients on the host; bf16 needs no scaler)"
           if precision == "fp16" else None)
    ddp = ", DDP's all-reduce captured too" if world_size > 1 else ""
    if value == "true":
        if why:
            raise ConfigError(f"train.cuda_graphs {why}; pass --train.cuda_graphs=false")
        return True, "train.cuda_graphs=true" + ddp
    if why is None and cfg.model.backend == "fla":
        why = "is not used with fla's kernels (flash-linear-attention's own autograd functions)"
    return (False, f"auto: off (a graph {why})") if why else (True, "auto: on for CUDA GPUs" + ddp)


class GraphedMicroBatch:
    """`run(x, y)` (a micro-batch's forward and backward, returning its detached loss) captured as a CUDA graph
    after `warmup` normal calls, then replayed. `params`: the parameters whose gradients the backward makes.
    Calling it returns the micro-batch's loss (a fresh tensor). With `first=True` the micro-batch's gradients
    replace `.grad` (module docstring), so the caller does not zero them; otherwise they are added into `.grad`,
    created here (zeros) when missing. `key` tells apart micro-batches that launch different work (under DDP, those
    that all-reduce and those inside no_sync): each (key, first) has its own graph and warm-up, all in one memory
    pool. `stream`: the capture stream (DDP's wrapper must have been built on it, see ddp_capture). `replays` counts
    the calls served by a graph."""

    def __init__(self, run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 params: list[torch.nn.Parameter], warmup: int = WARMUP,
                 stream: torch.cuda.Stream | None = None) -> None:
        self.run, self.warmup = run, warmup
        self.params = [p for p in params if p.requires_grad]
        self.calls: dict[Hashable, int] = {}
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.losses: dict[Hashable, torch.Tensor] = {}
        self.bound: dict[Hashable, list[torch.Tensor | None]] = {}     # each graph's `.grad` tensors after its capture
        self.replays, self.pool = 0, None
        self.writes = False         # whether some micro-batch has come with first=True
        self.stream = stream or torch.cuda.Stream()
        self.x = self.y = None

    def __call__(self, x: torch.Tensor, y: torch.Tensor, key: Hashable = None, first: bool = False) -> torch.Tensor:
        if self.x is None:
            self.x, self.y = (torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in (x, y))
        key, self.writes = (key, first), self.writes or first
        if key not in self.graphs:      # a replay rewrites the tensors the capture handed to `.grad`
            for p in self.params:
                if first:
                    p.grad = None
                elif p.grad is None:
                    p.grad = torch.zeros_like(p)
        if x.shape != self.x.shape or y.shape != self.y.shape:
            raise ValueError(f"train.cuda_graphs: a micro-batch of shape {tuple(x.shape)}, the graph's is "
                             f"{tuple(self.x.shape)}; every micro-batch must have the same shape")
        self.x.copy_(x, non_blocking=True)      # asynchronous from pinned memory (train.py pins each batch)
        self.y.copy_(y, non_blocking=True)
        self.calls[key] = self.calls.get(key, 0) + 1
        # a graph that adds into `.grad` waits for the first micro-batch's graph: it must add into that graph's tensors
        if key not in self.graphs and self.calls[key] > self.warmup and (
                first or not self.writes or any(k[1] for k in self.graphs)):
            if first and self.graphs:
                raise RuntimeError("GraphedMicroBatch: a graph that adds into .grad was captured before the first "
                                   "micro-batch's, whose capture replaces .grad; pass first=True from the first call")
            self._capture(key)
        if key not in self.graphs:
            return self._on_stream(lambda: self.run(self.x, self.y))
        self.graphs[key].replay()
        self.replays += 1
        for p, g in zip(self.params, self.bound[key]):       # as the captured call left them (module docstring)
            if p.grad is not g:
                p.grad = g
        return self.losses[key].clone()        # the graph's own buffer is overwritten by the next replay

    def _on_stream(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """fn() on the capture stream, ordered after and before the current stream's work."""
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = fn()
        torch.cuda.current_stream().wait_stream(self.stream)
        return out

    def _capture(self, key: Hashable) -> None:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()        # the warm-up's cached activations; the graph's live in its own pool
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: NCCL's watchdog thread may query its events while this thread captures
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
                self.losses[key] = self.run(self.x, self.y)
        except RuntimeError as e:
            raise RuntimeError(f"train.cuda_graphs: capturing the training micro-batch failed: {e}. Something in the "
                               "step waits for the GPU or changes with the data; pass --train.cuda_graphs=false") \
                from e
        self.pool = self.pool or graph.pool()
        self.graphs[key] = graph
        self.bound[key] = [p.grad for p in self.params]

    def release(self) -> None:
        """Frees the graphs and their memory pool once the GPU is idle. A graph that captured NCCL work must go before
        its communicator does (accelerate's end_training destroys the process group), or the teardown waits on it."""
        torch.cuda.synchronize()
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.losses.clear()
        self.bound.clear()


@contextlib.contextmanager
def ddp_capture(on: bool, world_size: int) -> Iterator[torch.cuda.Stream | None]:
    """Around accelerator.prepare: where graphs capture DDP's all-reduce (on and world_size > 1), DDP's wrapper is
    built on the capture stream it yields, as PyTorch requires of a graphed DDP backward; None otherwise. (NCCL's
    asynchronous error handling, which a capture cannot have, is turned off by the caller before the process group
    starts: DDP_ENV.)"""
    if not (on and world_size > 1):
        yield None
        return
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield stream
    torch.cuda.current_stream().wait_stream(stream)
