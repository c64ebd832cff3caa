"""Model hyper-parameters shared by every family (fields a family does not use are ignored by it)."""
from __future__ import annotations

from dataclasses import dataclass

from utils.errors import UserError


class ModelConfigError(UserError, ValueError):
    """A model setting the model cannot be built with (printed without a traceback)."""


@dataclass
class ModelConfig:
    family: str = "gla"                # gla | gated_deltanet | mamba2 | gpt2 (see model.FAMILIES)
    backend: str = "naive"             # the token mixer's backend (ops.BACKENDS); the projections' only with fused
    fuse: str = ""                     # backend fused only: components to fuse, e.g. "chunk" ("" = all it has)
    vocab_size: int = 50257
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    head_k_dim: int = 64               # K per head (GLA, Gated DeltaNet); GPT-2: head dim = d_model / n_heads
    head_v_dim: int = 64               # V per head (GLA, Gated DeltaNet)
    mlp_hidden: int = 0                # 0 → the family's default (SwiGLU 8d/3 rounded to 256; GPT-2 4d; Mamba-2 none)
    chunk_size: int = 64               # C of the chunkwise ops (GLA, Gated DeltaNet, Mamba-2's SSD); every backend
    #                                    of them receives it, and one that cannot run it is refused at start-up
    norm_eps: float = 1e-6
    # eps of the per-head output norm of GLA and Gated DeltaNet (RMSNorm_head(o) before the gate). Its gain is up to
    # 1/√eps where o ≈ 0 (the first token's output when q·k ≈ 0), which amplifies rounding; 0 → norm_eps
    o_norm_eps: float = 0.0
    init_std: float = 0.02
    tie_embeddings: bool = True
    # GLA
    gate_low_rank: int = 16            # rank of the decay projection W_g1 W_g2
    gate_normalizer: float = 16.0      # gk = logsigmoid(.) / gate_normalizer
    # Gated DeltaNet and Mamba-2
    conv_size: int = 4                 # causal depthwise conv width
    # Mamba-2
    expand: int = 2                    # d_inner = expand · d_model
    ssm_head_dim: int = 64             # P; heads = d_inner / P
    ssm_state: int = 128               # N
    ssm_groups: int = 1                # G: B and C are shared by heads within a group
    # GPT-2
    max_seq_len: int = 2048            # learned positions
    attention: str = "mha"             # mha (plain GPT-2) | ramla (reciprocal + multi-head latent attention)
    latent_dim: int = 64               # RA+MLA: L
    ra_window: int = 64                # RA+MLA: reciprocal band W
    ra_alpha: float = 0.5              # RA+MLA: initial α; 0 with ra_learnable false is plain MLA
    ra_learnable: bool = True

    def swiglu_hidden(self) -> int:
        if self.mlp_hidden:
            return self.mlp_hidden
        return -(-int(8 * self.d_model / 3) // 256) * 256
