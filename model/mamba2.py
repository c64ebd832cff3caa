"""Mamba-2 (Dao & Gu, ICML 2024), as ../shared/DESIGN.md §3 defines it; blocks have no MLP by default.

    z, xBC, dt = x W_in;  xBC = SiLU(conv4(xBC));  x, B, C = split(xBC)
    dt = softplus(dt + dt_bias),  A = −exp(A_log)
    h_t = exp(dt_t A) h_{t-1} + dt_t B_tᵀ x_t,   y_t = C_t h_t + D ⊙ x_t
    out = RMSNorm(y ⊙ silu(z)) W_out
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.common import CausalLM, RMSNorm, ShortConv, SwiGLU, init_ssm_decay_, resolve_op
from model.config import ModelConfig


class Mamba2Mixer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        d_inner = cfg.expand * cfg.d_model
        if d_inner % cfg.ssm_head_dim:
            raise ValueError(f"mamba2: d_inner {d_inner} is not a multiple of ssm_head_dim {cfg.ssm_head_dim}")
        self.d_inner, self.P, self.N, self.G = d_inner, cfg.ssm_head_dim, cfg.ssm_state, cfg.ssm_groups
        self.H = d_inner // self.P
        conv_dim = d_inner + 2 * self.G * self.N
        self.in_proj = nn.Linear(cfg.d_model, d_inner + conv_dim + self.H, bias=False)   # [z | xBC | dt]
        self.conv = ShortConv(conv_dim, cfg.conv_size, bias=True)
        self.dt_bias = nn.Parameter(torch.empty(self.H))
        self.A_log = nn.Parameter(torch.empty(self.H))
        self.D = nn.Parameter(torch.empty(self.H))
        self.norm = RMSNorm(d_inner, cfg.norm_eps)
        self.out_proj = nn.Linear(d_inner, cfg.d_model, bias=False)
        self.out_proj.residual_out = True
        self.ssd, label = resolve_op(cfg, "ssd")
        self.resolved_ops = {"ssd": label}

    def init_extra(self) -> None:
        init_ssm_decay_(self.A_log, self.dt_bias)
        with torch.no_grad():
            self.D.fill_(1.0)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """u: [B, T, d] → [B, T, d]."""
        Bsz, T, _ = u.shape
        z, xBC, dt = self.in_proj(u).split([self.d_inner, self.d_inner + 2 * self.G * self.N, self.H], -1)
        x, Bm, Cm = self.conv(xBC).split([self.d_inner, self.G * self.N, self.G * self.N], -1)
        x = x.view(Bsz, T, self.H, self.P)
        dt = F.softplus(dt.float() + self.dt_bias)                           # [B, T, H]
        y, _ = self.ssd(x, dt, -self.A_log.float().exp(), Bm.view(Bsz, T, self.G, self.N),
                        Cm.view(Bsz, T, self.G, self.N))                     # [B, T, H, P]
        y = (y + self.D[:, None] * x).reshape(Bsz, T, self.d_inner)
        return self.out_proj(self.norm(y * F.silu(z)))

    def flops_per_token(self, seq_len: int, chunk: int = 64) -> float:
        """SSD as scalar-decay GLA (K = N, V = P), fwd + bwd (3× fwd), per head."""
        C = min(chunk, seq_len)
        return 3.0 * self.H * 2 * (C * self.N + C * self.P + 2 * self.N * self.P)


def build(cfg: ModelConfig) -> CausalLM:
    # Mamba-2 LMs have no MLP; model.mlp_hidden > 0 adds a SwiGLU after each mixer
    return CausalLM(cfg, Mamba2Mixer, make_mlp=lambda c: SwiGLU(c.d_model, c.mlp_hidden) if c.mlp_hidden else None)
