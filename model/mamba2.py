"""Mamba-2 (Dao & Gu, ICML 2024); blocks have no MLP by default.

    z, xBC, dt = x W_in;  xBC = SiLU(conv4(xBC));  x, B, C = split(xBC)
    dt = softplus(dt + dt_bias),  A = −exp(A_log)
    h_t = exp(dt_t A) h_{t-1} + dt_t B_tᵀ x_t,   y_t = C_t h_t + D ⊙ x_t
    out = RMSNorm(y ⊙ silu(z)) W_out

The projection chain is two layer-level ops, both fused by the `proj` component of `--backend fused`:
the input side (in_proj, the short conv, dt) is the `mamba2_proj_in` op, the output side (gate, norm,
W_out and the block's residual add) the `proj_out` op with gate_first. The weights stay the modules
below, so checkpoints do not depend on the backend.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.common import CausalLM, RMSNorm, ShortConv, SwiGLU, init_ssm_decay_, resolve_chain
from model.config import ModelConfig, ModelConfigError
from model.decode import DecodeCache, conv_step, conv_tail, resolve_step


class Mamba2Mixer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        d_inner = cfg.expand * cfg.d_model
        if d_inner % cfg.ssm_head_dim:
            raise ModelConfigError(f"mamba2: d_inner {d_inner} is not a multiple of ssm_head_dim {cfg.ssm_head_dim}")
        self.d_inner, self.P, self.N, self.G = d_inner, cfg.ssm_head_dim, cfg.ssm_state, cfg.ssm_groups
        self.H, self.chunk_size = d_inner // self.P, cfg.chunk_size
        conv_dim = d_inner + 2 * self.G * self.N
        self.in_proj = nn.Linear(cfg.d_model, d_inner + conv_dim + self.H, bias=False)   # [z | xBC | dt]
        self.conv = ShortConv(conv_dim, cfg.conv_size, bias=True)
        self.dt_bias = nn.Parameter(torch.empty(self.H))
        self.A_log = nn.Parameter(torch.empty(self.H))
        self.D = nn.Parameter(torch.empty(self.H))
        self.norm = RMSNorm(d_inner, cfg.norm_eps)
        self.out_proj = nn.Linear(d_inner, cfg.d_model, bias=False)
        self.out_proj.residual_out = True
        self.ssd, self.proj_in, self.proj_out, self.resolved_ops = resolve_chain(cfg, "ssd", "mamba2_proj_in")
        self.ssd_step, label = resolve_step(cfg, "ssd_step")
        self.decode_ops, self.cache_seq_dims = {"ssd_step": label}, {}
        self.adds_residual = True                                            # proj_out adds the block's residual

    def init_extra(self) -> None:
        init_ssm_decay_(self.A_log, self.dt_bias)
        with torch.no_grad():
            self.D.fill_(1.0)

    def forward(self, u: torch.Tensor, residual: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """u: [B, T, d] → [B, T, d]; plus residual [B, T, d] when given (the block passes its input); cu_seqlens:
        packed documents (B = 1), the short conv and the state restarting at each."""
        return self.prefill(u, residual, cache=False, cu_seqlens=cu_seqlens)[0]

    def prefill(self, u: torch.Tensor, residual: torch.Tensor | None = None, cache: bool = True,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, dict | None]:
        """forward, also returning the decode cache (with cache): state fp32 [B, H, N, P] (the op's final state)
        and conv [B, W−1, d_inner + 2·G·N], the xBC pre-conv inputs of the last W − 1 tokens, recomputed from u
        (model.decode.conv_tail: mamba2_proj_in does not return them)."""
        Bsz, T, _ = u.shape
        z, x, Bm, Cm, dt = self.proj_in(u, self.in_proj.weight, self.conv.conv.weight, self.conv.conv.bias,
                                        self.dt_bias, self.d_inner, self.G * self.N,
                                        cu_seqlens=cu_seqlens)                           # dt [B, T, H] fp32
        x = x.view(Bsz, T, self.H, self.P)
        y, h = self.ssd(x, dt, -self.A_log.float().exp(), Bm.view(Bsz, T, self.G, self.N),
                        Cm.view(Bsz, T, self.G, self.N), output_final_state=cache,
                        chunk_size=self.chunk_size, cu_seqlens=cu_seqlens)               # [B, T, H, P]
        y = (y + self.D[:, None] * x).reshape(Bsz, T, 1, self.d_inner)      # one "head": the norm spans d_inner
        out = self.proj_out(y, z, self.norm.weight, self.out_proj.weight, residual, self.norm.eps, gate_first=True)
        if not cache:
            return out, None
        xbc_w = self.in_proj.weight[self.d_inner:self.d_inner + self.conv.conv.in_channels]
        return out, {"state": h, "conv": conv_tail(u, xbc_w, self.conv.conv.weight.shape[-1])}

    def step(self, u: torch.Tensor, cache: dict, ctx: DecodeCache, residual: torch.Tensor | None = None) -> torch.Tensor:
        """One token per row, u [B, 1, d]: mamba2_proj_in's computation for the last position (the conv over the
        cached tail, model.decode.conv_step), the decode op on cache["state"] (in place), then proj_out."""
        Bsz, GN = u.shape[0], self.G * self.N
        z, xbc, dt = F.linear(u[:, 0], self.in_proj.weight).split([self.d_inner, self.conv.conv.in_channels, self.H], -1)
        xbc = conv_step(cache["conv"], xbc, self.conv.conv.weight, self.conv.conv.bias)
        x, Bm, Cm = xbc.split([self.d_inner, GN, GN], -1)
        x = x.reshape(Bsz, self.H, self.P)
        y, _ = self.ssd_step(x, F.softplus(dt.float() + self.dt_bias), -self.A_log.float().exp(),
                             Bm.reshape(Bsz, self.G, self.N), Cm.reshape(Bsz, self.G, self.N), cache["state"])
        y = (y + self.D[:, None] * x).reshape(Bsz, 1, 1, self.d_inner)
        return self.proj_out(y, z[:, None], self.norm.weight, self.out_proj.weight, residual, self.norm.eps,
                             gate_first=True)

    def op_dims(self, batch: int, seq_len: int, dtype: torch.dtype) -> dict[str, tuple]:
        """(op function, the dims it is called with) per op, for the run log's kernel plans."""
        M = batch * seq_len
        return {"ssd": (self.ssd, dict(B=batch, T=seq_len, H=self.H, N=self.N, P=self.P, G=self.G,
                                       chunk_size=self.chunk_size, dtype=dtype)),
                "mamba2_proj_in": (self.proj_in, dict(M=M, channels=self.conv.conv.in_channels, dtype=dtype)),
                "proj_out": (self.proj_out, dict(M=M, H=1, V=self.d_inner, d=self.out_proj.out_features,
                                                 dtype=dtype))}

    def flops_per_token(self, seq_len: int) -> float:
        """SSD as scalar-decay GLA (K = N, V = P), fwd + bwd (3× fwd), per head."""
        C = min(self.chunk_size, seq_len)
        return 3.0 * self.H * 2 * (C * self.N + C * self.P + 2 * self.N * self.P)


def build(cfg: ModelConfig) -> CausalLM:
    # Mamba-2 LMs have no MLP; model.mlp_hidden > 0 adds a SwiGLU after each mixer
    return CausalLM(cfg, Mamba2Mixer, make_mlp=lambda c: SwiGLU(c, c.d_model, c.mlp_hidden) if c.mlp_hidden else None)
