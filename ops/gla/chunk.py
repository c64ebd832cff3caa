"""GLA on the `chunk` backend: flash-linear-attention's decomposition into separate Triton stages
(ops/chunkwise/), with a per-key-dim decay gk [B, T, H, K] or one decay per head, gk [B, T, H, 1]."""
from __future__ import annotations

import functools

import torch

from ops import backend_fn, varlen
from ops.chunkwise.decay_attention import CHUNK_SIZES, chunk_decay_attention, stages_plan
from ops.triton_utils import check_dtypes, check_triton_device

check_available = check_triton_device       # ops.get_op calls it with (op, backend)


@backend_fn(chunk_sizes=CHUNK_SIZES, plan=functools.partial(stages_plan, split_state=False))
def gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor,
        scale: float | None = None, initial_state: torch.Tensor | None = None,
        output_final_state: bool = False, chunk_size: int = 64,
        cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as ops.gla.naive.gla: q, k, gk [B, T, H, K] (gk may be [B, T, H, 1]); v [B, T, H, V];
    states [B, H, K, V] fp32. Returns o in v's dtype and the final state if asked. cu_seqlens: packed documents
    in ops/varlen.py's chunk-aligned layout (B = 1, states [N, H, K, V]; at most N·(C − 1) padded tokens)."""
    check_dtypes("gla", "chunk", q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if cu_seqlens is not None:
        return varlen.run_chunk_aligned(
            "gla", cu_seqlens, chunk_size, initial_state, (q, k, v, gk),
            lambda q, k, v, gk, docs: chunk_decay_attention(q, k, v, gk, scale, initial_state, output_final_state,
                                                            chunk_size, docs=docs))
    return chunk_decay_attention(q, k, v, gk, scale, initial_state, output_final_state, chunk_size)
