"""Gated DeltaNet on the `fused` backend: the `chunk` backend's stages. No component inside the mixer is fused
(the WY stage sits between the state pass and the output), so the fused Gated DeltaNet model differs from `chunk`
only in its projection chain, the layer-level `proj` component (the gdn_proj_in and proj_out ops). This module
exists so that `--backend fused` names that model and the run log records `gated_delta: fused[]`.
"""
from __future__ import annotations

from collections.abc import Callable

from ops.gated_delta.chunk import gated_delta
from ops.triton_utils import check_triton_device

COMPONENTS: tuple[str, ...] = ()

check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def build(fuse: frozenset[str]) -> Callable:
    """No component of this op is fused (ops.get_op has refused any it was asked for): the chunk stages."""
    return gated_delta


__all__ = ["gated_delta", "build", "COMPONENTS"]
