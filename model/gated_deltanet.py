"""Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025).

    q, k, v = SiLU(conv4(x W_{q,k,v}));  q, k L2-normalised per head
    β = sigmoid(x W_β),  g = −exp(A_log) · softplus(x W_a + dt_bias)
    S_t = exp(g_t) (I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ,   o_t = S_tᵀ (q_t K^{-1/2})
    y = (RMSNorm_head(o) ⊙ swish(x W_r)) W_o

The projection chain is two layer-level ops, both fused by the `proj` component of `--backend fused`:
the input side (the projections, short convs, norms, β and g) is the `gdn_proj_in` op, the output side
(norm, gate, W_o and the block's residual add) the `proj_out` op, shared with GLA. The weights stay the
modules below, so checkpoints do not depend on the backend.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.common import CausalLM, RMSNorm, ShortConv, init_ssm_decay_, resolve_chain
from model.config import ModelConfig
from model.decode import DecodeCache, conv_step, conv_tail, resolve_step
from ops.proj.short_conv import EPS


class GatedDeltaNetMixer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        d, H, K, V = cfg.d_model, cfg.n_heads, cfg.head_k_dim, cfg.head_v_dim
        self.H, self.K, self.V, self.chunk_size = H, K, V, cfg.chunk_size
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
        self.o_norm = RMSNorm(V, cfg.o_norm_eps or cfg.norm_eps)            # per head, weight shared by heads
        self.o_proj = nn.Linear(H * V, d, bias=False)
        self.o_proj.residual_out = True
        self.gated_delta, self.proj_in, self.proj_out, self.resolved_ops = resolve_chain(cfg, "gated_delta",
                                                                                         "gdn_proj_in")
        self.gated_delta_step, label = resolve_step(cfg, "gated_delta_step")
        self.decode_ops, self.cache_seq_dims = {"gated_delta_step": label}, {}
        self.adds_residual = True                                            # proj_out adds the block's residual

    def init_extra(self) -> None:
        init_ssm_decay_(self.A_log, self.dt_bias)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, T, d] → [B, T, d]; plus residual [B, T, d] when given (the block passes its input); cu_seqlens:
        packed documents (B = 1), the short convs and the state restarting at each."""
        q, k, v, g, beta, r = self._project(x, cu_seqlens)    # q, k [B, T, H, K]; v [B, T, H, V]; g, β fp32 [B, T, H]
        o, _ = self.gated_delta(q, k, v, g, beta, scale=self.K ** -0.5, chunk_size=self.chunk_size,
                                cu_seqlens=cu_seqlens)                                               # [B, T, H, V]
        return self.proj_out(o, r, self.o_norm.weight, self.o_proj.weight, residual, self.o_norm.eps)

    def _project(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        return self.proj_in(x, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.r_proj.weight,
                            self.b_proj.weight, self.a_proj.weight, self.q_conv.conv.weight, self.k_conv.conv.weight,
                            self.v_conv.conv.weight, self.A_log, self.dt_bias, self.H, cu_seqlens=cu_seqlens)

    def prefill(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """forward, also returning the decode cache: state fp32 [B, H, K, V] (the op's final state) and conv
        [B, W−1, 2·H·K + H·V], the q | k | v pre-conv inputs of the last W − 1 tokens, recomputed from x
        (model.decode.conv_tail: gdn_proj_in does not return them)."""
        q, k, v, g, beta, r = self._project(x)
        o, S = self.gated_delta(q, k, v, g, beta, scale=self.K ** -0.5, output_final_state=True,
                                chunk_size=self.chunk_size)
        W = self.q_conv.conv.weight.shape[-1]
        tail = torch.cat([conv_tail(x, p.weight, W) for p in (self.q_proj, self.k_proj, self.v_proj)], -1)
        y = self.proj_out(o, r, self.o_norm.weight, self.o_proj.weight, residual, self.o_norm.eps)
        return y, {"state": S, "conv": tail}

    def step(self, x: torch.Tensor, cache: dict, ctx: DecodeCache, residual: torch.Tensor | None = None) -> torch.Tensor:
        """One token per row, x [B, 1, d]: gdn_proj_in's computation for the last position (the conv over the
        cached tail, model.decode.conv_step), the decode op on cache["state"] (in place), then proj_out."""
        B, HK = x.shape[0], self.H * self.K
        xt = x[:, 0]
        pre = torch.cat([F.linear(xt, p.weight) for p in (self.q_proj, self.k_proj, self.v_proj)], -1)  # [B, C]
        conv_w = torch.cat([c.conv.weight for c in (self.q_conv, self.k_conv, self.v_conv)], 0)        # [C, 1, W]
        y = conv_step(cache["conv"], pre, conv_w)
        v = y[:, 2 * HK:].view(B, self.H, self.V)
        q, k = (F.normalize(y[:, i * HK:(i + 1) * HK].view(B, self.H, self.K), dim=-1, eps=EPS).to(v.dtype)
                for i in (0, 1))
        beta = F.linear(xt, self.b_proj.weight).float().sigmoid()                                   # [B, H]
        g = -self.A_log.float().exp() * F.softplus(F.linear(xt, self.a_proj.weight).float() + self.dt_bias)
        o, _ = self.gated_delta_step(q, k, v, g, beta, cache["state"], scale=self.K ** -0.5)         # [B, H, V]
        return self.proj_out(o[:, None], F.linear(x, self.r_proj.weight), self.o_norm.weight, self.o_proj.weight,
                             residual, self.o_norm.eps)

    def op_dims(self, batch: int, seq_len: int, dtype: torch.dtype) -> dict[str, tuple]:
        """(op function, the dims it is called with) per op, for the run log's kernel plans."""
        H, K, V, M = self.H, self.K, self.V, batch * seq_len
        return {"gated_delta": (self.gated_delta, dict(B=batch, T=seq_len, H=H, K=K, V=V,
                                                       chunk_size=self.chunk_size, dtype=dtype)),
                "gdn_proj_in": (self.proj_in, dict(M=M, H=H, K=K, V=V, dtype=dtype)),
                "proj_out": (self.proj_out, dict(M=M, H=H, V=V, d=self.o_proj.out_features, dtype=dtype))}

    def flops_per_token(self, seq_len: int) -> float:
        """Chunkwise form beyond the projections, fwd + bwd (3× fwd), per head: Q Kᵀ and K Kᵀ
        (2·C·K each), the UT solve (C²/3), W and U (2·C·(K + V)), A·U (2·C·V), and the state
        terms W S, q S, the update (2·K·V each)."""
        C, K, V = min(self.chunk_size, seq_len), self.K, self.V
        return 3.0 * self.H * (4 * C * K + C * C / 3 + 2 * C * (K + V) + 2 * C * V + 6 * K * V)


def build(cfg: ModelConfig) -> CausalLM:
    return CausalLM(cfg, GatedDeltaNetMixer)
