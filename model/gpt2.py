"""GPT-2 (LayerNorm, learned positions, GELU MLP ×4, tied embeddings) with either plain multi-head
attention (`attention: mha`, the baseline) or RA+MLA (`attention: ramla`, reciprocal + multi-head latent):

    Q = x W_q → [T, H, D];  K_lat = x W_kd,  V_lat = x W_vd → [T, L] (shared by all heads)
    ctx_h = softmax(q_lat K_latᵀ/√L + α · band(transposed scores)) V_lat W_vu[h];  y = concat_h(ctx) W_o

`from_hf_state_dict` maps a transformers GPT2LMHeadModel state dict onto this model (its Conv1D
weights are stored transposed), so the baseline is provably the ecosystem's GPT-2.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.common import CausalLM, resolve_op
from model.config import ModelConfig, ModelConfigError


class GeluMLP(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(d, hidden)
        self.proj = nn.Linear(hidden, d)
        self.proj.residual_out = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))           # GPT-2's "gelu_new"


class MHA(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ModelConfigError(f"gpt2: d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
        self.H, self.D = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj.residual_out = True
        self.attention, label = resolve_op(cfg, "attention")
        self.resolved_ops = {"attention": label}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.H, self.D).unbind(2)       # [B, T, H, D] each
        return self.proj(self.attention(q, k, v, causal=True).reshape(B, T, d))

    def op_dims(self, batch: int, seq_len: int, dtype: torch.dtype) -> dict[str, tuple]:
        """(op function, the dims it is called with), for the run log's kernel plans."""
        return {"attention": (self.attention, dict(B=batch, T=seq_len, H=self.H, D=self.D, dtype=dtype))}

    def flops_per_token(self, seq_len: int) -> float:
        """Causal QKᵀ and PV, fwd + bwd: 3 · 2 · 2 · H · D · T / 2."""
        return 6.0 * self.H * self.D * seq_len


class RAMLA(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ModelConfigError(f"gpt2: d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
        self.H, self.D, self.L, self.W = cfg.n_heads, cfg.d_model // cfg.n_heads, cfg.latent_dim, cfg.ra_window
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model)                    # W_q
        self.kd_proj = nn.Linear(cfg.d_model, self.L)                        # W_kd
        self.vd_proj = nn.Linear(cfg.d_model, self.L)                        # W_vd
        self.w_ql = nn.Parameter(torch.empty(self.H, self.D, self.L))
        self.w_vu = nn.Parameter(torch.empty(self.H, self.L, self.D))
        plain = cfg.ra_alpha == 0 and not cfg.ra_learnable
        self.alpha = None if plain else nn.Parameter(torch.tensor(cfg.ra_alpha), requires_grad=cfg.ra_learnable)
        self.alpha_init = cfg.ra_alpha
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)                      # W_o
        self.proj.residual_out = True
        self.ramla, label = resolve_op(cfg, "ramla")
        self.resolved_ops = {"ramla": label}

    def init_extra(self) -> None:
        """Variance-preserving latent maps: q_lat and the up-projected context keep unit scale."""
        with torch.no_grad():
            nn.init.normal_(self.w_ql, 0.0, 1 / math.sqrt(self.D))
            nn.init.normal_(self.w_vu, 0.0, 1 / math.sqrt(self.L))
            if self.alpha is not None:
                self.alpha.fill_(self.alpha_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.D)
        ctx = self.ramla(q, self.kd_proj(x), self.vd_proj(x), self.w_ql, self.w_vu, self.alpha, self.W)
        return self.proj(ctx.reshape(B, T, d))

    def op_dims(self, batch: int, seq_len: int, dtype: torch.dtype) -> dict[str, tuple]:
        """(op function, the dims it is called with), for the run log's kernel plans."""
        return {"ramla": (self.ramla, dict(B=batch, T=seq_len, H=self.H, L=self.L, W=self.W,
                                           plain=self.alpha is None, dtype=dtype))}

    def flops_per_token(self, seq_len: int) -> float:
        """Causal latent scores and P·V_lat (T·L each per head; the reciprocal band reuses the
        scores), plus the per-head maps W_ql and W_vu (2·D·L each), fwd + bwd."""
        return 3.0 * self.H * (2 * seq_len * self.L + 4 * self.D * self.L)


MIXERS = {"mha": MHA, "ramla": RAMLA}


def build(cfg: ModelConfig) -> CausalLM:
    if cfg.attention not in MIXERS:
        raise ModelConfigError(f"gpt2: unknown attention {cfg.attention!r}; choose one of {', '.join(MIXERS)}")
    return CausalLM(cfg, MIXERS[cfg.attention], make_mlp=lambda c: GeluMLP(c.d_model, c.mlp_hidden or 4 * c.d_model),
                    norm=lambda: nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps), learned_positions=True)


def from_hf_state_dict(sd: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """transformers GPT2LMHeadModel state dict → this model's (plain `mha` attention)."""
    prefix = "transformer." if any(k.startswith("transformer.") for k in sd) else ""
    out = {"embed.weight": sd[f"{prefix}wte.weight"], "pos_embed.weight": sd[f"{prefix}wpe.weight"],
           "norm.weight": sd[f"{prefix}ln_f.weight"], "norm.bias": sd[f"{prefix}ln_f.bias"]}
    names = {"ln_1": "mixer_norm", "ln_2": "mlp_norm", "attn.c_attn": "mixer.qkv", "attn.c_proj": "mixer.proj",
             "mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj"}
    for i in range(n_layers):
        for hf, ours in names.items():
            w, b = sd[f"{prefix}h.{i}.{hf}.weight"], sd[f"{prefix}h.{i}.{hf}.bias"]
            out[f"blocks.{i}.{ours}.weight"] = w.t() if hf.startswith(("attn", "mlp")) else w  # Conv1D is [in, out]
            out[f"blocks.{i}.{ours}.bias"] = b
    return out
