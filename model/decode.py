"""Recurrent generation: prefill a prompt once, then decode one token per row per step at constant memory and time
(the attention families: a KV cache, time linear in the context).

    logits, cache = model.prefill(idx)                     # the full-sequence forward, keeping every layer's cache
    logits = model.step(next_tokens, cache)                # one token per row; the cache is updated in place
    tokens = model.generate(idx, 64, sample=..., stop_token=...)

Per layer the cache is a dict of batch-first tensors that the mixer's `prefill(x, residual)` returns and its
`step(x, cache, ctx, residual)` updates:
    GLA, Gated DeltaNet   state fp32 [B, H, K, V]  (+ Gated DeltaNet: conv [B, W−1, 2·H·K + H·V], the pre-conv tail)
    Mamba-2               state fp32 [B, H, N, P],  conv [B, W−1, d_inner + 2·G·N]
    GPT-2                 k, v [B, H, S, D]         (S slots, the seq dims a mixer names in `cache_seq_dims`)
    GPT-2 RA+MLA          k_lat, v_lat [B, S, L] and q_win fp32 [B, H, W, L]: q_lat of the last W tokens, which the
                          reciprocal band term α · q_lat,j · K_lat,i (0 < i − j ≤ W) of a new token i needs
Prefill runs the mixer's training op with output_final_state=True; the decode step runs its decode op (`gla_step`,
`gated_delta_step`, `ssd_step`) on DECODE_BACKEND[backend], which updates the fp32 state in place. Both run under
no_grad (inference only).

Prompts of different lengths (`lengths`, rows left-padded in idx): each length's rows prefill together with no
padding inside the computation, so every row's state is exactly its own prompt's; the recurrent caches are then
per row. Slot-indexed caches (KV) are right-aligned: row b's prompt fills slots [T − len_b, T), every row writes
its new token at the same slot, and attention masks the slots before a row's start. Positions are per row.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from model.config import ModelConfig, ModelConfigError
from ops import get_op

# The decode op's backend for each model backend. The chunkwise form has nothing to chunk in one token, so `chunk`
# decodes on the Triton step kernel (`fused`); `fla` too (fla's own models decode on its fused_recurrent kernels,
# the peer in scripts/bench_decode.py). resolve_step's label says so wherever a decode backend is reported
# (CausalLM.decode_backends: eval/generate.py's log, the benchmark's rows).
DECODE_BACKEND = {"naive": "naive", "chunk": "fused", "fused": "fused", "fla": "fused"}


def resolve_step(cfg: ModelConfig, op: str) -> tuple[Callable, str]:
    """A recurrent mixer's decode op on DECODE_BACKEND[cfg.backend], and its label for logs: the backend, with the
    model backend it stands in for when they differ (`fused (decode of chunk)`)."""
    backend = DECODE_BACKEND.get(cfg.backend, cfg.backend)
    label = backend if backend == cfg.backend else f"{backend} (decode of {cfg.backend})"
    return get_op(op, backend), label


@dataclass
class DecodeCache:
    """Every layer's cache and where the rows are. layers: one dict per layer (see the module docstring); pos: int64
    [B], each row's tokens so far (the next token's position); slot: slots used in the slot-indexed caches;
    capacity: their size; start: int64 [B], row b's first slot, or None when every row starts at slot 0."""
    layers: list[dict[str, torch.Tensor]]
    pos: torch.Tensor
    slot: int
    capacity: int
    start: torch.Tensor | None
    max_pos: int

    def keep(self) -> torch.Tensor | None:
        """bool [B, slot + 1]: the slots a row's new token (written at `slot`) attends to; None: all of them."""
        if self.start is None:
            return None
        return torch.arange(self.slot + 1, device=self.pos.device)[None, :] >= self.start[:, None]


def conv_tail(x: torch.Tensor, weight: torch.Tensor, width: int) -> torch.Tensor:
    """The short convolution's pre-conv inputs of the last width − 1 tokens, x[:, −(W−1):] weightᵀ → [B, W−1, C]
    (zeros before the first token, the conv's own padding). Recomputed from the normed input x [B, T, d] and the
    projection weight [C, d]: the projection-chain ops never return their pre-conv activations (the fused chain
    writes them only inside its GEMM's buffer), and W − 1 rows of one GEMM cost little next to the prefill."""
    n = width - 1
    pre = F.linear(x[:, -n:], weight) if n else x.new_zeros(x.shape[0], 0, weight.shape[0])
    return F.pad(pre, (0, 0, n - pre.shape[1], 0))


def conv_step(tail: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """One token of the causal depthwise conv + SiLU (ops/proj/short_conv.py's short_conv_ref at the last position):
    y = silu(bias + Σ_j w[c, j] · window[j, c]) over window = [tail; pre] of W rows. tail [B, W−1, C]; pre [B, C];
    weight [C, 1, W]. fp32 math; returns y [B, C] in pre's dtype and shifts pre into tail in place (the cache keeps
    its tensors, which a captured decode step needs)."""
    window = torch.cat([tail, pre.unsqueeze(1)], 1)                                   # [B, W, C]
    y = (window.float() * weight.squeeze(1).t().float()).sum(1)                       # [B, C]
    if bias is not None:
        y = y + bias.float()
    tail.copy_(window[:, 1:])
    return F.silu(y).to(pre.dtype)


def _place(layer: dict, cache: dict, rows: torch.Tensor | None, B: int, offset: int, capacity: int,
           seq_dims: dict[str, int]) -> None:
    """Write one row group's layer cache into the batch's: fixed tensors at `rows` (all rows: taken as they are),
    slot-indexed tensors at slots [offset, offset + T) of a `capacity`-slot buffer."""
    for name, t in cache.items():
        d = seq_dims.get(name)
        if d is None and rows is None:
            layer[name] = t.contiguous()
            continue
        if name not in layer:
            shape = list(t.shape)
            shape[0] = B
            if d is not None:
                shape[d] = capacity
            layer[name] = t.new_zeros(shape)
        dst = layer[name] if d is None else layer[name].narrow(d, offset, t.shape[d])
        if rows is None:
            dst.copy_(t)
        else:
            dst.index_copy_(0, rows, t)


@torch.no_grad()
def prefill(model, idx: torch.Tensor, lengths: torch.Tensor | list[int] | None = None, capacity: int = 0,
            all_logits: bool = False) -> tuple[torch.Tensor, DecodeCache]:
    """idx int64 [B, T]; lengths [B] (row b's prompt is idx[b, T − len_b:]; None: all T). Returns the logits of each
    row's last token [B, vocab] (all_logits: [B, T, vocab], zero at padding) and the cache, with room for
    `capacity` slots (≥ T; more are added when a step needs them)."""
    B, T = idx.shape
    if T == 0:
        raise ValueError("prefill: empty prompt")
    if lengths is None:
        groups, pos = [(T, None)], torch.full((B,), T, dtype=torch.long, device=idx.device)
    else:
        pos = torch.as_tensor(lengths, dtype=torch.long, device=idx.device)
        if pos.shape != (B,) or int(pos.min()) < 1 or int(pos.max()) > T:
            raise ValueError(f"prefill: lengths must be B={B} values in [1, {T}], got {pos.tolist()}")
        groups = [(n, (pos == n).nonzero()[:, 0]) for n in sorted(set(pos.tolist()))]
        if len(groups) == 1 and groups[0][0] == T:
            groups = [(T, None)]
    if model.pos_embed is not None and T > model.cfg.max_seq_len:
        raise ModelConfigError(f"sequence of {T} tokens exceeds model.max_seq_len {model.cfg.max_seq_len}")
    capacity = max(capacity, T)
    layers: list[dict] = [{} for _ in model.blocks]
    out = None
    for n, rows in groups:
        sub = idx[:, T - n:] if rows is None else idx[rows, T - n:]
        x = model.embed_tokens(sub, torch.arange(n, device=idx.device))               # [b, n, d]
        for layer, block in zip(layers, model.blocks):
            x, cache = block.prefill(x)
            _place(layer, cache, rows, B, T - n, capacity, block.mixer.cache_seq_dims)
        logits = model.logits(x if all_logits else x[:, -1:])                          # [b, n | 1, vocab]
        if rows is None:
            out = logits
            break
        if out is None:
            out = logits.new_zeros(B, T if all_logits else 1, logits.shape[-1])
        m = logits.shape[1]
        out.narrow(1, out.shape[1] - m, m).index_copy_(0, rows, logits)
    start = None if groups[0][1] is None else T - pos
    cache = DecodeCache(layers, pos, T, capacity, start, int(pos.max()))
    return (out if all_logits else out[:, -1]), cache


def _grow(model, cache: DecodeCache) -> None:
    """Double the slot-indexed caches' capacity (a step past the capacity prefill was given)."""
    cap = 2 * cache.capacity
    for layer, block in zip(cache.layers, model.blocks):
        for name, d in block.mixer.cache_seq_dims.items():
            t = layer[name]
            shape = list(t.shape)
            shape[d] = cap
            layer[name] = t.new_zeros(shape)
            layer[name].narrow(d, 0, t.shape[d]).copy_(t)
    cache.capacity = cap


@torch.no_grad()
def step(model, tokens: torch.Tensor, cache: DecodeCache) -> torch.Tensor:
    """tokens int64 [B], one new token per row → the logits of the next [B, vocab]; the cache advances one slot."""
    if model.pos_embed is not None and cache.max_pos >= model.cfg.max_seq_len:
        raise ModelConfigError(f"decoding position {cache.max_pos} exceeds model.max_seq_len {model.cfg.max_seq_len}")
    if cache.slot >= cache.capacity and any(b.mixer.cache_seq_dims for b in model.blocks):
        _grow(model, cache)
    x = model.embed_tokens(tokens[:, None], cache.pos[:, None])                        # [B, 1, d]
    for layer, block in zip(cache.layers, model.blocks):
        x = block.step(x, layer, cache)
    cache.slot += 1
    cache.max_pos += 1
    cache.pos += 1
    return model.logits(x)[:, 0]


def graphable(model) -> bool:
    """Whether model.step can be one CUDA graph: every cache is updated in place at fixed addresses (the recurrent
    families' state and conv tail). Slot-indexed KV caches write a new slot every step and grow; they stay eager."""
    return not any(b.mixer.cache_seq_dims for b in model.blocks)


class GraphedStep:
    """model.step for one batch as a single CUDA graph. At batch 1 an eager step is launch-bound (about ten kernel
    launches a layer from Python for microseconds of GPU work each); a replay launches them all at once, so a token
    costs its GPU time. Capture: two warm-up steps (kernels compiled and tuned) and the captured step run on the
    cache, whose in-place updates are then undone from a copy, so the real cache is where it was. The graph reads and
    writes the cache's own tensors; the logits it returns are one buffer, overwritten by the next call. Autocast's
    weight-cast cache is off inside the graph (its casts are replayed), since its cached tensors die with the
    caller's autocast context while the graph would still read them."""

    def __init__(self, model, cache: DecodeCache, tokens: torch.Tensor):
        if not graphable(model):
            raise ValueError("GraphedStep: this model's caches are slot-indexed (KV); decode it with model.step")
        if not tokens.is_cuda:
            raise ValueError("GraphedStep: CUDA graphs need the model and tokens on a CUDA GPU")
        self.cache, self.tokens = cache, tokens.clone()
        saved = [{n: t.clone() for n, t in layer.items()} for layer in cache.layers]
        pos, slot, max_pos = cache.pos.clone(), cache.slot, cache.max_pos
        amp = dict(device_type="cuda", dtype=torch.get_autocast_dtype("cuda"), enabled=torch.is_autocast_enabled("cuda"),
                   cache_enabled=False)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.autocast(**amp):
            for _ in range(2):
                step(model, self.tokens, cache)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.autocast(**amp):
            self.logits = step(model, self.tokens, cache)
        for layer, kept in zip(cache.layers, saved):
            for n, t in kept.items():
                layer[n].copy_(t)
        cache.pos.copy_(pos)
        cache.slot, cache.max_pos = slot, max_pos

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens int64 [B] → the next-token logits [B, vocab] (the graph's buffer); the cache advances one step."""
        self.tokens.copy_(tokens)
        self.graph.replay()
        self.cache.slot += 1
        self.cache.max_pos += 1
        return self.logits


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The argmax token of each row: logits [B, vocab] → int64 [B]."""
    return logits.argmax(-1)


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, lengths: torch.Tensor | list[int] | None = None,
             sample: Callable[[torch.Tensor], torch.Tensor] = greedy, stop_token: int | None = None,
             on_token: Callable[[torch.Tensor], None] | None = None,
             cuda_graph: bool | None = None) -> torch.Tensor:
    """Prefill idx [B, T] (left-padded rows of `lengths`), then up to max_new_tokens steps. sample: logits [B, vocab]
    → tokens [B]. A row that has emitted stop_token repeats it; generation ends when every row has. on_token is
    called with each step's tokens [B] as they come. cuda_graph: decode through GraphedStep (None: wherever it can,
    a CUDA model whose caches are updated in place). Returns the new tokens int64 [B, n ≤ max_new_tokens]."""
    B, T = idx.shape
    out: list[torch.Tensor] = []
    if max_new_tokens <= 0:
        return idx.new_empty(B, 0)
    logits, cache = prefill(model, idx, lengths, capacity=T + max_new_tokens)
    if cuda_graph is None:
        cuda_graph = idx.is_cuda and graphable(model) and max_new_tokens > 2
    decode_one = GraphedStep(model, cache, idx[:, -1]) if cuda_graph else (lambda t: step(model, t, cache))
    done = torch.zeros(B, dtype=torch.bool, device=idx.device)
    for i in range(max_new_tokens):
        tok = sample(logits)
        if stop_token is not None:
            tok = torch.where(done, stop_token, tok)
            done |= tok == stop_token
        out.append(tok)
        if on_token is not None:
            on_token(tok)
        if i + 1 == max_new_tokens or (stop_token is not None and bool(done.all())):
            break
        logits = decode_one(tok)
    return torch.stack(out, 1)
