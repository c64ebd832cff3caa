"""Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025), as ../shared/DESIGN.md §3 defines it.

    q, k, v = SiLU(conv4(x W_{q,k,v}));  q, k L2-normalised per head
    β = sigmoid(x W_β),  g = −exp(A_log) · softplus(x W_a + dt_bias)
    S_t = exp(g_t) (I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ,   o_t = S_tᵀ (q_t K^{-1/2})
    y = (RMSNorm_head(o) ⊙ swish(x W_r)) W_o
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.common import CausalLM, RMSNorm, ShortConv, init_ssm_decay_, resolve_op
from model.config import ModelConfig


class GatedDeltaNetMixer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        d, H, K, V = cfg.d_model, cfg.n_heads, cfg.head_k_dim, cfg.head_v_dim
        self.H, self.K, self.V = H, K, V
        self.q_proj = nn.Linear(d, H * K, bias=False)
        self.k_proj = nn.Linear(d, H * K, bias=False)
        self.v_proj = nn.Linear(d, H * V, bias=False)
        self.q_conv = ShortConv(H * K, cfg.conv_size)
        self.k_conv = ShortConv(H * K, cfg.conv_size)
        self.v_conv = ShortConv(H * V, cfg.conv_size)
        self.b_proj = nn.Linear(d, H, bias=False)                            # W_β
        self.a_proj = nn.Linear(d, H, bias=False)                            # W_a
        self.A_log = nn.Parameter(torch.empty(H))
        self.dt_bias = nn.Parameter(torch.empty(H))
        self.r_proj = nn.Linear(d, H * V, bias=False)                        # output gate W_r
        self.o_norm = RMSNorm(V, cfg.norm_eps)
        self.o_proj = nn.Linear(H * V, d, bias=False)
        self.o_proj.residual_out = True
        self.gated_delta, label = resolve_op(cfg, "gated_delta")
        self.resolved_ops = {"gated_delta": label}

    def init_extra(self) -> None:
        init_ssm_decay_(self.A_log, self.dt_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, T, d] → [B, T, d]."""
        B, T, _ = x.shape
        q = F.normalize(self.q_conv(self.q_proj(x)).view(B, T, self.H, self.K), dim=-1, eps=1e-6)
        k = F.normalize(self.k_conv(self.k_proj(x)).view(B, T, self.H, self.K), dim=-1, eps=1e-6)
        v = self.v_conv(self.v_proj(x)).view(B, T, self.H, self.V)
        # CUDA autocast runs F.normalize in fp32; the Triton backends take q, k, v in one dtype, and
        # every backend must see the same inputs (the chunk backend raised here in bf16 training).
        q, k = q.to(v.dtype), k.to(v.dtype)
        beta = self.b_proj(x).float().sigmoid()                              # [B, T, H]
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias)  # [B, T, H]
        o, _ = self.gated_delta(q, k, v, g, beta, scale=self.K ** -0.5)     # [B, T, H, V]
        o = self.o_norm(o) * F.silu(self.r_proj(x).view(B, T, self.H, self.V))
        return self.o_proj(o.reshape(B, T, self.H * self.V))

    def flops_per_token(self, seq_len: int, chunk: int = 64) -> float:
        """Chunkwise form beyond the projections, fwd + bwd (3× fwd), per head: Q Kᵀ and K Kᵀ
        (2·C·K each), the UT solve (C²/3), W and U (2·C·(K + V)), A·U (2·C·V), and the state
        terms W S, q S, the update (2·K·V each)."""
        C, K, V = min(chunk, seq_len), self.K, self.V
        return 3.0 * self.H * (4 * C * K + C * C / 3 + 2 * C * (K + V) + 2 * C * V + 6 * K * V)


def build(cfg: ModelConfig) -> CausalLM:
    return CausalLM(cfg, GatedDeltaNetMixer)
