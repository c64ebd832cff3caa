"""Blocks shared by the model families: RMSNorm, SwiGLU, the pre-norm block and the LM wrapper."""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.config import ModelConfig


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
    """down(silu(x W_gate) ⊙ x W_up), with gate and up as one GEMM."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.down.residual_out = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    """x + mixer(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, mixer: nn.Module):
        super().__init__()
        self.mixer_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer = mixer
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.swiglu_hidden())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.mixer_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class CausalLM(nn.Module):
    """Token embedding, `n_layers` blocks, final norm and (tied) output head.

    `make_mixer(cfg, layer_idx)` builds each layer's token mixer; mixers resolve their ops through
    the backend registry when constructed, so forward never dispatches.
    """

    def __init__(self, cfg: ModelConfig, make_mixer: Callable[[ModelConfig, int], nn.Module]):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, make_mixer(cfg, i)) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        # An untied head is its own parameter; the tied head reuses embed.weight in forward, so
        # state dicts never hold aliased tensors (safetensors refuses those).
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, init_std) weights, zero biases; residual output projections scaled by 1/√(2L)."""
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                s = std / math.sqrt(2 * self.cfg.n_layers) if getattr(m, "residual_out", False) else std
                nn.init.normal_(m.weight, 0.0, s)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx, targets: int64 [B, T]. Returns logits [B, T, vocab] and, with targets, the mean loss."""
        x = self.embed(idx)                                              # [B, T, d]
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        logits = F.linear(x, self.embed.weight) if self.head is None else self.head(x)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss

    def backends(self) -> list[tuple[int, str, str]]:
        """(layer, op, backend) for every op every layer resolved, for the run log."""
        out = []
        for i, block in enumerate(self.blocks):
            for op, backend in getattr(block.mixer, "resolved_ops", {}).items():
                out.append((i, op, backend))
        return out

    def num_params(self, exclude_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.embed.weight.numel() if exclude_embedding else n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 per matmul weight (head included) plus the mixers' own."""
        n_matmul = self.num_params(exclude_embedding=True)
        if self.head is None:
            n_matmul += self.embed.weight.numel()
        mixer = sum(b.mixer.flops_per_token(seq_len) for b in self.blocks)
        return 6.0 * n_matmul + mixer
