"""Model hyper-parameters shared by every family."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    family: str = "gla"                # see model.FAMILIES
    backend: str = "naive"             # kernel backend of every op (ops.BACKENDS)
    vocab_size: int = 50257
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    head_k_dim: int = 64               # K, per head
    head_v_dim: int = 64               # V, per head
    mlp_hidden: int = 0                # SwiGLU hidden size; 0 → 8d/3 rounded up to a multiple of 256
    gate_low_rank: int = 16            # GLA: rank of the decay projection W_g1 W_g2
    gate_normalizer: float = 16.0      # GLA: gk = logsigmoid(.) / gate_normalizer
    norm_eps: float = 1e-6
    init_std: float = 0.02
    tie_embeddings: bool = True

    def swiglu_hidden(self) -> int:
        if self.mlp_hidden:
            return self.mlp_hidden
        return -(-int(8 * self.d_model / 3) // 256) * 256
