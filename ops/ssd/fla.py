"""SSD on flash-linear-attention's scalar-decay GLA (`chunk_simple_gla`), the speed peer:
q = C, k = B, v = dt·x, g = dt·A, scale 1. Needs the fla package and a GPU."""
from __future__ import annotations

import torch

from ops import backend_fn, check_chunk_size, require_fla
from ops.ssd.naive import expand_groups

check_available = require_fla       # ops.get_op calls it with (op, backend)
CHUNK_SIZES = (64,)                 # fla's chunk kernels fix C = 64


@backend_fn(chunk_sizes=CHUNK_SIZES)
def ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
        initial_state: torch.Tensor | None = None, output_final_state: bool = False,
        chunk_size: int = 64, cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as ops.ssd.naive.ssd; cu_seqlens (packed documents, B = 1, states [N, H, N, P]) goes to fla's own
    varlen path."""
    from fla.ops.simple_gla import chunk_simple_gla

    check_chunk_size("ssd", "fla", chunk_size, CHUNK_SIZES)
    H = x.shape[2]
    v = (x * dt.unsqueeze(-1)).to(x.dtype)
    q, k = expand_groups(C, H).to(x.dtype), expand_groups(B, H).to(x.dtype)
    return chunk_simple_gla(q, k, v, g=(dt.float() * A.float()), scale=1.0, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens)
