"""GLA on flash-linear-attention's `chunk_gla` (the speed peer); needs the fla package and a GPU."""
from __future__ import annotations

import importlib.util

import torch

from ops import BackendError


def check_available() -> None:
    if importlib.util.find_spec("fla") is None:
        raise BackendError("op 'gla', backend 'fla': flash-linear-attention is not installed; "
                           "pip install -e '.[fla]' (offline: the fla wheels in ../shared/wheels) or "
                           "choose another --backend")
    if not torch.cuda.is_available():
        raise BackendError("op 'gla', backend 'fla': flash-linear-attention's kernels need a CUDA GPU; "
                           "on this machine use --backend naive")


def gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor,
        scale: float | None = None, initial_state: torch.Tensor | None = None,
        output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes as ops.gla.naive.gla: [B, T, H, K|V] activations, [B, H, K, V] fp32 states."""
    from fla.ops.gla import chunk_gla

    return chunk_gla(q, k, v, gk, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state)
