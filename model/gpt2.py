"""GPT-2 (LayerNorm, learned positions, GELU MLP ×4, tied embeddings) with either plain multi-head
attention (`attention: mha`, the baseline) or RA+MLA (`attention: ramla`, reciprocal + multi-head latent):

    Q = x W_q → [T, H, D];  K_lat = x W_kd,  V_lat = x W_vd → [T, L] (shared by all heads)
    ctx_h = softmax(q_lat K_latᵀ/√L + α · band(transposed scores)) V_lat W_vu[h];  y = concat_h(ctx) W_o

`from_hf_state_dict` maps a transformers GPT2LMHeadModel state dict onto this model (its Conv1D
weights are stored transposed), so the baseline is provably the ecosystem's GPT-2; `to_hf_state_dict`
is its inverse (model/hf.py's export).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from model.common import CausalLM, resolve_op
from model.config import ModelConfig, ModelConfigError
from model.decode import DecodeCache

# the decode step's attention: kernels that take any key length as it comes (cuDNN's builds a plan per length)
DECODE_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


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
        self.decode_ops = {"attention_step": "KV cache, PyTorch SDPA"}
        self.cache_seq_dims = {"k": 2, "v": 2}                               # [B, H, S, D]

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, d] → [B, T, d]; cu_seqlens: packed documents (B = 1), attention kept inside each."""
        return self.prefill(x, cu_seqlens)[0]

    def prefill(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """forward, also returning the KV cache k, v [B, H, T, D]."""
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.H, self.D).unbind(2)       # [B, T, H, D] each
        o = self.attention(q, k, v, causal=True, cu_seqlens=cu_seqlens)    # [B, T, H, D]
        return self.proj(o.reshape(B, T, d)), {"k": k.transpose(1, 2), "v": v.transpose(1, 2)}

    def step(self, x: torch.Tensor, cache: dict, ctx: DecodeCache) -> torch.Tensor:
        """One token per row, x [B, 1, d]: its k, v written at slot ctx.slot, then its query over slots
        [0, ctx.slot] (those before a row's start masked: ctx.keep())."""
        B, _, d = x.shape
        q, k, v = self.qkv(x).view(B, 3, self.H, self.D).unbind(1)          # [B, H, D] each
        S = ctx.slot + 1
        cache["k"][:, :, ctx.slot] = k
        cache["v"][:, :, ctx.slot] = v
        keep = ctx.keep()
        with sdpa_kernel(DECODE_SDPA):                 # a new key length S every step
            o = F.scaled_dot_product_attention(q[:, :, None], cache["k"][:, :, :S], cache["v"][:, :, :S],
                                               attn_mask=None if keep is None else keep[:, None, None])  # [B, H, 1, D]
        return self.proj(o.reshape(B, 1, d))

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
        self.decode_ops = {"ramla_step": "latent KV cache, PyTorch"}
        self.cache_seq_dims = {"k_lat": 1, "v_lat": 1}                       # [B, S, L]

    def init_extra(self) -> None:
        """Variance-preserving latent maps: q_lat and the up-projected context keep unit scale."""
        with torch.no_grad():
            nn.init.normal_(self.w_ql, 0.0, 1 / math.sqrt(self.D))
            nn.init.normal_(self.w_vu, 0.0, 1 / math.sqrt(self.L))
            if self.alpha is not None:
                self.alpha.fill_(self.alpha_init)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, d] → [B, T, d]; cu_seqlens: packed documents (B = 1), attention and band kept inside each."""
        B, T, d = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.D)
        ctx = self.ramla(q, self.kd_proj(x), self.vd_proj(x), self.w_ql, self.w_vu, self.alpha, self.W,
                         cu_seqlens=cu_seqlens)
        return self.proj(ctx.reshape(B, T, d))

    def prefill(self, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """forward, also returning the cache: k_lat, v_lat [B, T, L] and q_win fp32 [B, H, W, L], the q_lat of the
        last W tokens right-aligned (zeros before the first token), for the reciprocal band of the tokens to come."""
        B, T, d = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.D)
        k_lat, v_lat = self.kd_proj(x), self.vd_proj(x)
        ctx = self.ramla(q, k_lat, v_lat, self.w_ql, self.w_vu, self.alpha, self.W)
        n = min(self.W, T)
        q_win = q.new_zeros(B, self.H, self.W, self.L, dtype=torch.float32)
        with torch.autocast(x.device.type, enabled=False):
            if n:
                q_win[:, :, self.W - n:] = torch.einsum("bthd,hdl->bhtl", q[:, T - n:].float(), self.w_ql.float())
        return self.proj(ctx.reshape(B, T, d)), {"k_lat": k_lat, "v_lat": v_lat, "q_win": q_win}

    def step(self, x: torch.Tensor, cache: dict, ctx: DecodeCache) -> torch.Tensor:
        """One token i per row, x [B, 1, d], in fp32 as ops/ramla/naive.py: K_lat,i and V_lat,i written at slot
        ctx.slot; s_ij = q_lat,i · K_lat,j / √L over the cached slots j ≤ i, plus α · q_lat,j · K_lat,i / √L for
        i − W ≤ j ≤ i (q_lat,j from q_win, and q_lat,i itself); softmax over the row's slots; (P V_lat) W_vu[h]."""
        B, _, d = x.shape
        q = self.q_proj(x).view(B, self.H, self.D)
        k_new, v_new = self.kd_proj(x)[:, 0], self.vd_proj(x)[:, 0]                     # [B, L]
        cache["k_lat"][:, ctx.slot] = k_new
        cache["v_lat"][:, ctx.slot] = v_new
        with torch.autocast(x.device.type, enabled=False):       # fp32 inside bf16 autocast, as the oracle
            o = self._attend(q.float(), k_new.float(), cache, ctx).to(q.dtype)
        return self.proj(o.reshape(B, 1, d))

    def _attend(self, q: torch.Tensor, k_new: torch.Tensor, cache: dict, ctx: DecodeCache) -> torch.Tensor:
        """fp32 q [B, H, D], K_lat,i [B, L] → the context [B, H, D] of token i = ctx.slot; advances q_win."""
        i, S, W, scale = ctx.slot, ctx.slot + 1, self.W, self.L ** -0.5
        q_lat = torch.einsum("bhd,hdl->bhl", q, self.w_ql.float())                         # [B, H, L]
        s = torch.einsum("bhl,bsl->bhs", q_lat, cache["k_lat"][:, :S].float()) * scale     # [B, H, S]
        if self.alpha is not None:
            a, n = self.alpha.float(), min(W, i)                                           # n band keys before i
            band = torch.einsum("bhwl,bl->bhw", cache["q_win"][:, :, W - n:], k_new)      # q_lat,j · K_lat,i
            own = (q_lat * k_new[:, None]).sum(-1, keepdim=True)                           # q_lat,i · K_lat,i
            s = torch.cat([s[..., :i - n], s[..., i - n:i] + a * band * scale, s[..., i:] + a * own * scale], -1)
            if W:
                cache["q_win"] = torch.cat([cache["q_win"][:, :, 1:], q_lat[:, :, None]], 2)
        keep = ctx.keep()
        if keep is not None:
            s = s.masked_fill(~keep[:, None], float("-inf"))
        ctx_lat = torch.einsum("bhs,bsl->bhl", s.softmax(-1), cache["v_lat"][:, :S].float())  # [B, H, L]
        return torch.einsum("bhl,hld->bhd", ctx_lat, self.w_vu.float())

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


# transformers GPT2LMHeadModel's per-layer names → ours; the attention and MLP weights are Conv1D, stored [in, out]
HF_NAMES = {"ln_1": "mixer_norm", "ln_2": "mlp_norm", "attn.c_attn": "mixer.qkv", "attn.c_proj": "mixer.proj",
            "mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj"}


def from_hf_state_dict(sd: dict[str, torch.Tensor], n_layers: int, tied: bool = True) -> dict[str, torch.Tensor]:
    """transformers GPT2LMHeadModel state dict → this model's (plain `mha` attention); `tied` False also maps
    the untied lm_head.weight → head.weight. HF's other keys (causal-mask buffers) are left out."""
    prefix = "transformer." if any(k.startswith("transformer.") for k in sd) else ""
    out = {"embed.weight": sd[f"{prefix}wte.weight"], "pos_embed.weight": sd[f"{prefix}wpe.weight"],
           "norm.weight": sd[f"{prefix}ln_f.weight"], "norm.bias": sd[f"{prefix}ln_f.bias"]}
    for i in range(n_layers):
        for hf, ours in HF_NAMES.items():
            w, b = sd[f"{prefix}h.{i}.{hf}.weight"], sd[f"{prefix}h.{i}.{hf}.bias"]
            out[f"blocks.{i}.{ours}.weight"] = w.t() if hf.startswith(("attn", "mlp")) else w  # Conv1D is [in, out]
            out[f"blocks.{i}.{ours}.bias"] = b
    if not tied:
        out["head.weight"] = sd["lm_head.weight"]
    return out


def to_hf_state_dict(sd: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """The inverse of from_hf_state_dict: this model's (`mha`) state dict → GPT2LMHeadModel's, Conv1D weights
    transposed to [in, out]; a tied head writes no lm_head.weight (transformers ties it to wte on load)."""
    out = {"transformer.wte.weight": sd["embed.weight"], "transformer.wpe.weight": sd["pos_embed.weight"],
           "transformer.ln_f.weight": sd["norm.weight"], "transformer.ln_f.bias": sd["norm.bias"]}
    for i in range(n_layers):
        for hf, ours in HF_NAMES.items():
            w = sd[f"blocks.{i}.{ours}.weight"]
            out[f"transformer.h.{i}.{hf}.weight"] = w.t() if hf.startswith(("attn", "mlp")) else w
            out[f"transformer.h.{i}.{hf}.bias"] = sd[f"blocks.{i}.{ours}.bias"]
    if "head.weight" in sd:
        out["lm_head.weight"] = sd["head.weight"]
    return out
