"""Blocks shared by the model families: RMSNorm, SwiGLU, the pre-norm block and the LM wrapper."""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from model import decode
from model.config import ModelConfig, ModelConfigError
from model.decode import DecodeCache
from ops.loss.linear_cross_entropy import linear_cross_entropy
from ops import BackendError, fused_label, get_op, kernel_plan, parse_fuse, varlen
from ops.proj.short_conv import short_conv_ref


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Under bf16 autocast a mixer's output arrives in bf16 while the weight is fp32; torch's
        # fused kernel needs matching dtypes (it still accumulates in fp32), else a slow path runs.
        return F.rms_norm(x, self.weight.shape, self.weight.to(x.dtype), self.eps)


class SwiGLU(nn.Module):
    """down(silu(x W_gate) ⊙ x W_up), with gate and up as one GEMM; the elementwise middle is the `swiglu` op,
    fused where cfg fuses the `proj` component (resolve_proj), else PyTorch's chain."""

    def __init__(self, cfg: ModelConfig, d: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.down.residual_out = True
        self.swiglu, self.swiglu_backend = resolve_proj(cfg, "swiglu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., d] → [..., d]; gate_up's output [..., 2·hidden] is [gate | up]."""
        return self.down(self.swiglu(self.gate_up(x)))


class Block(nn.Module):
    """x + mixer(norm(x)), then x + mlp(norm(x)) when the family has an MLP."""

    def __init__(self, mixer: nn.Module, mlp: nn.Module | None, norm: Callable[[], nn.Module]):
        super().__init__()
        self.mixer_norm = norm()
        self.mixer = mixer
        self.mlp_norm = norm() if mlp is not None else None
        self.mlp = mlp
        # A mixer whose output op adds the residual itself (the proj_out op; in its GEMM's epilogue when fused)
        self.mixer_adds_residual = getattr(mixer, "adds_residual", False)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, d] → [B, T, d]; cu_seqlens (packed documents, x [1, T, d]) goes to the mixer."""
        if self.mixer_adds_residual:
            x = self.mixer(self.mixer_norm(x), residual=x, cu_seqlens=cu_seqlens)
        else:
            x = x + self.mixer(self.mixer_norm(x), cu_seqlens=cu_seqlens)
        return x if self.mlp is None else x + self.mlp(self.mlp_norm(x))

    def prefill(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """forward, also returning the mixer's decode cache (model/decode.py)."""
        if self.mixer_adds_residual:
            x, cache = self.mixer.prefill(self.mixer_norm(x), residual=x)
        else:
            y, cache = self.mixer.prefill(self.mixer_norm(x))
            x = x + y
        return (x if self.mlp is None else x + self.mlp(self.mlp_norm(x))), cache

    def step(self, x: torch.Tensor, cache: dict[str, torch.Tensor], ctx) -> torch.Tensor:
        """forward for one token per row, x [B, 1, d], through the mixer's cache (updated in place); ctx is the
        model's DecodeCache (slot, positions, masks)."""
        if self.mixer_adds_residual:
            x = self.mixer.step(self.mixer_norm(x), cache, ctx, residual=x)
        else:
            x = x + self.mixer.step(self.mixer_norm(x), cache, ctx)
        return x if self.mlp is None else x + self.mlp(self.mlp_norm(x))


class ShortConv(nn.Module):
    """Causal depthwise conv1d over time, then SiLU: [B, T, C] → [B, T, C]."""

    def __init__(self, channels: int, width: int, bias: bool = False):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, width, groups=channels, padding=width - 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the layers' projection-chain ops read self.conv's parameters; this is their PyTorch computation
        return short_conv_ref(x, self.conv.weight, self.conv.bias)


def init_ssm_decay_(A_log: torch.Tensor, dt_bias: torch.Tensor) -> None:
    """Mamba's decay init, shared by Mamba-2 and Gated DeltaNet: A ∈ [1, 16], and
    dt = softplus(dt_bias) log-uniform in [1e-3, 0.1]."""
    with torch.no_grad():
        A_log.copy_(torch.empty_like(A_log).uniform_(1, 16).log())
        dt = torch.empty_like(dt_bias).uniform_(math.log(1e-3), math.log(0.1)).exp()
        dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))                   # inverse softplus


def resolve_op(cfg: ModelConfig, op: str, has_proj: bool = False) -> tuple[Callable, str]:
    """`op` on cfg.backend with cfg.fuse's components, and the label the run log records for it
    (`fused[chunk]` names what is actually fused). Mixers call this once, when constructed.
    has_proj: the mixer also resolves projection-chain ops (resolve_chain); without them, naming
    `proj` in --fuse is an error rather than a silently unfused projection."""
    fuse = parse_fuse(cfg.fuse)
    if fuse is not None and "proj" in fuse and not has_proj:
        raise BackendError(f"op {op!r} ({cfg.family}): the fused 'proj' component (the projection chain) is "
                           "not implemented for this family (GLA, Gated DeltaNet and Mamba-2 have it); "
                           "drop it from --fuse")
    return get_op(op, cfg.backend, fuse, cfg.chunk_size), fused_label(op, cfg.backend, fuse)


def resolve_proj(cfg: ModelConfig, op: str) -> tuple[Callable, str]:
    """A layer-level projection-chain op (proj_in, gdn_proj_in, mamba2_proj_in, proj_out, swiglu): its `fused`
    backend where cfg asks for the `proj` component (--backend fused with no --fuse, or proj among --fuse's
    components), else its `naive` one (the plain PyTorch chain); with the label the run log records."""
    fuse = parse_fuse(cfg.fuse)
    if cfg.backend == "fused" and (fuse is None or "proj" in fuse):
        proj = frozenset({"proj"})
        return get_op(op, "fused", proj), fused_label(op, "fused", proj)
    return get_op(op, "naive"), "naive"


def resolve_chain(cfg: ModelConfig, op: str,
                  proj_in_op: str) -> tuple[Callable, Callable, Callable, dict[str, str]]:
    """A mixer with a projection chain (GLA, Gated DeltaNet, Mamba-2): its op, its input-side op `proj_in_op`,
    the shared output side `proj_out`, and the backends the run log records. The proj ops are recorded only
    when fused: the naive chain is the default and is left out of the log."""
    mixer, label = resolve_op(cfg, op, has_proj=True)
    proj_in, in_label = resolve_proj(cfg, proj_in_op)
    proj_out, out_label = resolve_proj(cfg, "proj_out")
    fused = {name: lab for name, lab in ((proj_in_op, in_label), ("proj_out", out_label)) if lab != "naive"}
    return mixer, proj_in, proj_out, {op: label, **fused}


class CausalLM(nn.Module):
    """Token embedding, `n_layers` blocks, final norm and (tied) output head.

    `make_mixer(cfg, layer_idx)` builds each layer's token mixer; mixers resolve their ops through
    the backend registry when constructed, so forward never dispatches.
    """

    def __init__(self, cfg: ModelConfig, make_mixer: Callable[[ModelConfig, int], nn.Module],
                 make_mlp: Callable[[ModelConfig], nn.Module | None] | None = None,
                 norm: Callable[[], nn.Module] | None = None, learned_positions: bool = False):
        super().__init__()
        self.cfg = cfg
        make_mlp = make_mlp or (lambda c: SwiGLU(c, c.d_model, c.swiglu_hidden()))
        norm = norm or (lambda: RMSNorm(cfg.d_model, cfg.norm_eps))
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_embed = nn.Embedding(cfg.max_seq_len, cfg.d_model) if learned_positions else None
        self.blocks = nn.ModuleList(Block(make_mixer(cfg, i), make_mlp(cfg), norm) for i in range(cfg.n_layers))
        self.norm = norm()
        # An untied head is its own parameter; the tied head reuses embed.weight in forward, so
        # state dicts never hold aliased tensors (safetensors refuses those).
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, init_std) weights, zero biases, unit norms; residual output projections scaled by
        1/√(2L); then each module's own `init_extra()` (decay parameters, latent projections)."""
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                s = std / math.sqrt(2 * self.cfg.n_layers) if getattr(m, "residual_out", False) else std
                nn.init.normal_(m.weight, 0.0, s)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (RMSNorm, nn.LayerNorm)):
                nn.init.ones_(m.weight)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for m in self.modules():
            if hasattr(m, "init_extra"):
                m.init_extra()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, return_logits: bool = True,
                cu_seqlens: torch.Tensor | None = None):
        """idx, targets: int64 [B, T]. Returns logits [B, T, vocab] and, with targets, the mean loss.
        With targets and return_logits=False (training) the logits are None and the loss comes from the
        linear_cross_entropy op (ops.loss): the same math, chunked over rows so the whole [B, T, vocab]
        logits never exist at once.
        cu_seqlens: packed documents, int32 offsets into the flattened [1, B·T] token stream (ops/varlen.py;
        data.sampler.cu_seqlens starts one at every row and every separator). The blocks then run on one row
        [1, B·T, d], each document as if alone: recurrent states and short convolutions restart at its first token,
        attention stays inside it and learned positions count from 0 at its start."""
        B, T = idx.shape
        if self.pos_embed is not None and T > self.cfg.max_seq_len:
            raise ModelConfigError(f"sequence of {T} tokens exceeds model.max_seq_len {self.cfg.max_seq_len}")
        if cu_seqlens is None:
            x = self.embed_tokens(idx, torch.arange(T, device=idx.device))          # [B, T, d]
        else:
            x = self.embed_tokens(idx, varlen.positions(cu_seqlens, B * T).view(B, T)).view(1, B * T, -1)
        for block in self.blocks:
            x = block(x) if cu_seqlens is None else block(x, cu_seqlens)
        x = self.norm(x).view(B, T, -1)
        head = self.embed.weight if self.head is None else self.head.weight
        if targets is not None and not return_logits:
            return None, linear_cross_entropy(x, head, targets)
        logits = F.linear(x, head)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss

    def embed_tokens(self, idx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token (+ learned position) embeddings: idx int64 [B, T], positions int64 (T,) or [B, T] → [B, T, d]
        (the callers check positions against max_seq_len: forward and prefill by shape, step by its count)."""
        x = self.embed(idx)
        return x if self.pos_embed is None else x + self.pos_embed(positions)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm and the (tied) head: x [B, T, d] → [B, T, vocab]."""
        return F.linear(self.norm(x), self.embed.weight if self.head is None else self.head.weight)

    def prefill(self, idx: torch.Tensor, lengths: torch.Tensor | list[int] | None = None, capacity: int = 0,
                all_logits: bool = False) -> tuple[torch.Tensor, DecodeCache]:
        """The prompt's forward, keeping every layer's decode cache (model.decode.prefill)."""
        return decode.prefill(self, idx, lengths, capacity, all_logits)

    def step(self, tokens: torch.Tensor, cache: DecodeCache) -> torch.Tensor:
        """One token per row, tokens (B,) → next-token logits [B, vocab]; updates cache (model.decode.step)."""
        return decode.step(self, tokens, cache)

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **kw) -> torch.Tensor:
        """Prefill, then decode up to max_new_tokens per row (model.decode.generate) → new tokens [B, n]."""
        return decode.generate(self, idx, max_new_tokens, **kw)

    def decode_backends(self) -> dict[str, str]:
        """op → backend of the decode step (the same in every layer), for logs and benchmark labels."""
        return dict(getattr(self.blocks[0].mixer, "decode_ops", {}))

    def kernel_plans(self, batch: int, seq_len: int, dtype: torch.dtype, device: torch.device) -> list[str]:
        """What each op of a layer launches for micro-batches of `batch` × `seq_len` in `dtype` on `device`, for the
        run log: one line per op whose backend describes its plan (every layer has the same ops and shapes)."""
        mixer = self.blocks[0].mixer
        labels = getattr(mixer, "resolved_ops", {})
        plans = []
        for op, (fn, dims) in mixer.op_dims(batch, seq_len, dtype).items():
            plan = kernel_plan(fn, device, **dims)
            if plan is not None:
                plans.append(f"{op} ({labels.get(op, 'naive')}): {plan}")
        return plans

    def check_trains(self) -> None:
        """A BackendError naming the op, the backend and the remedy where a layer's op has a forward-only backend
        (evaluation and generation): training refuses it before any work, not at the first backward."""
        for op, (fn, _) in self.blocks[0].mixer.op_dims(1, 1, torch.float32).items():
            if not getattr(fn, "trains", True):
                raise BackendError(f"op {op!r}, backend {self.cfg.backend!r}: its kernel is forward-only (evaluation "
                                   "and generation) and cannot train; choose another --backend (for GPT-2's "
                                   "attention: naive, which is SDPA)")

    def backends(self) -> list[tuple[int, str, str]]:
        """(layer, op, backend) for every op every layer resolved, for the run log."""
        out = []
        for i, block in enumerate(self.blocks):
            for op, backend in getattr(block.mixer, "resolved_ops", {}).items():
                out.append((i, op, backend))
        return out

    def num_params(self, exclude_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embedding:
            n -= self.embed.weight.numel() + (self.pos_embed.weight.numel() if self.pos_embed is not None else 0)
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 per matmul weight (head included) plus the mixers' own."""
        n_matmul = self.num_params(exclude_embedding=True)
        if self.head is None:
            n_matmul += self.embed.weight.numel()
        mixer = sum(b.mixer.flops_per_token(seq_len) for b in self.blocks)
        return 6.0 * n_matmul + mixer
