"""Gated Linear Attention (Yang et al., ICML 2024).

    q = x W_q,  k = x W_k,  v = x W_v,  gk = logsigmoid(x W_g1 W_g2 + b) / 16
    S_t = diag(exp(gk_t)) S_{t-1} + k_tᵀ v_t,   o_t = (q_t K^{-1/2}) S_t
    y = (RMSNorm_head(o) ⊙ swish(x W_r)) W_o

The projection chain is two layer-level ops, both fused by the `proj` component of `--backend fused`:
the input side (q, k, v, gk and the gate's x W_r) is the `proj_in` op, the output side (norm, gate, W_o
and the block's residual add) the `proj_out` op. The weights stay the nn.Linear parameters below, so
checkpoints do not depend on the backend.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from model.common import CausalLM, RMSNorm, resolve_chain
from model.config import ModelConfig
from model.decode import DecodeCache, resolve_step


class GLAMixer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        d, H, K, V = cfg.d_model, cfg.n_heads, cfg.head_k_dim, cfg.head_v_dim
        self.H, self.K, self.V, self.normalizer, self.chunk_size = H, K, V, cfg.gate_normalizer, cfg.chunk_size
        self.q_proj = nn.Linear(d, H * K, bias=False)
        self.k_proj = nn.Linear(d, H * K, bias=False)
        self.v_proj = nn.Linear(d, H * V, bias=False)
        self.gk_down = nn.Linear(d, cfg.gate_low_rank, bias=False)          # W_g1
        self.gk_up = nn.Linear(cfg.gate_low_rank, H * K, bias=True)         # W_g2, b
        self.r_proj = nn.Linear(d, H * V, bias=False)                       # output gate W_r
        self.o_norm = RMSNorm(V, cfg.o_norm_eps or cfg.norm_eps)            # per head, weight shared by heads
        self.o_proj = nn.Linear(H * V, d, bias=False)
        self.o_proj.residual_out = True
        self.gla, self.proj_in, self.proj_out, self.resolved_ops = resolve_chain(cfg, "gla", "proj_in")
        self.gla_step, label = resolve_step(cfg, "gla_step")
        self.decode_ops, self.cache_seq_dims = {"gla_step": label}, {}
        self.adds_residual = True                                           # proj_out adds the block's residual

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, T, d] → [B, T, d]; plus residual [B, T, d] when given (the block passes its input); cu_seqlens:
        packed documents (B = 1), the state restarting at each (proj_in is per token and needs none)."""
        q, k, v, gk, r = self._project(x)                                   # [B, T, H, K|V]; gk fp32; r [B, T, H·V]
        o, _ = self.gla(q, k, v, gk, scale=self.K ** -0.5, chunk_size=self.chunk_size,
                        cu_seqlens=cu_seqlens)                              # [B, T, H, V]
        return self.proj_out(o, r, self.o_norm.weight, self.o_proj.weight, residual, self.o_norm.eps)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.proj_in(x, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.r_proj.weight,
                            self.gk_down.weight, self.gk_up.weight, self.gk_up.bias, self.H, self.normalizer)

    def prefill(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """forward, also returning the decode cache {state: fp32 [B, H, K, V]}, the op's final state."""
        q, k, v, gk, r = self._project(x)
        o, S = self.gla(q, k, v, gk, scale=self.K ** -0.5, output_final_state=True, chunk_size=self.chunk_size)
        return self.proj_out(o, r, self.o_norm.weight, self.o_proj.weight, residual, self.o_norm.eps), {"state": S}

    def step(self, x: torch.Tensor, cache: dict, ctx: DecodeCache, residual: torch.Tensor | None = None) -> torch.Tensor:
        """One token per row, x [B, 1, d]: the projections (no conv: proj_in is per token), the decode op on
        cache["state"] (in place), then proj_out."""
        q, k, v, gk, r = self._project(x)
        o, _ = self.gla_step(q[:, 0], k[:, 0], v[:, 0], gk[:, 0], cache["state"], scale=self.K ** -0.5)
        return self.proj_out(o[:, None], r, self.o_norm.weight, self.o_proj.weight, residual, self.o_norm.eps)

    def op_dims(self, batch: int, seq_len: int, dtype: torch.dtype) -> dict[str, tuple]:
        """(op function, the dims it is called with) per op, for the run log's kernel plans."""
        H, K, V, M, d = self.H, self.K, self.V, batch * seq_len, self.o_proj.out_features
        return {"gla": (self.gla, dict(B=batch, T=seq_len, H=H, K=K, V=V, chunk_size=self.chunk_size, dtype=dtype)),
                "proj_in": (self.proj_in, dict(M=M, d=d, HK=H * K, HV=H * V, L=self.gk_down.out_features,
                                               dtype=dtype)),
                "proj_out": (self.proj_out, dict(M=M, H=H, V=V, d=d, dtype=dtype))}

    def flops_per_token(self, seq_len: int) -> float:
        """Mixer FLOPs beyond the projections, fwd + bwd (3× fwd), chunkwise form: per head the
        C×K scores, C×V scores·values, and q·S plus the state update (2·K·V each)."""
        C = min(self.chunk_size, seq_len)
        return 3.0 * self.H * 2 * (C * self.K + C * self.V + 2 * self.K * self.V)


def build(cfg: ModelConfig) -> CausalLM:
    return CausalLM(cfg, GLAMixer)
