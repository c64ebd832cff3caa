"""GLA on flash-linear-attention's `chunk_gla` (the speed peer); needs the fla package and a GPU."""
from __future__ import annotations

import torch

from ops import backend_fn, check_chunk_size, require_fla

check_available = require_fla       # ops.get_op calls it with (op, backend)
CHUNK_SIZES = (64,)                 # fla's chunk kernels fix C = 64


@backend_fn(chunk_sizes=CHUNK_SIZES)
def gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor,
        scale: float | None = None, initial_state: torch.Tensor | None = None,
        output_final_state: bool = False, chunk_size: int = 64,
        cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as ops.gla.naive.gla: [B, T, H, K|V] activations, [B, H, K, V] fp32 states; cu_seqlens (packed
    documents, B = 1, states [N, H, K, V]) goes to fla's own varlen path."""
    from fla.ops.gla import chunk_gla

    check_chunk_size("gla", "fla", chunk_size, CHUNK_SIZES)
    return chunk_gla(q, k, v, gk, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, cu_seqlens=cu_seqlens)
