"""Gated DeltaNet on the `fused` backend: the `chunk` backend's stages. No mixer-level component is fused yet
(issues [F] and [G] built theirs for GLA and SSD; the delta rule's WY stage sits between them here), so the
fused Gated DeltaNet model differs from `chunk` only in its projection chain, the layer-level `proj` component
(ops/gdn_proj_in, ops/proj_out; issue [H]). This module exists so that `--backend fused` names that model and
the run log records `gated_delta: fused[]`, i.e. nothing fused inside the mixer.
"""
from __future__ import annotations

from collections.abc import Callable

from ops.triton_utils import check_triton_device
from ops.gated_delta.chunk import gated_delta

COMPONENTS: tuple[str, ...] = ()


check_available = check_triton_device       # ops.get_op calls it with (op, backend)


def build(fuse: frozenset[str]) -> Callable:
    """No component of this op is fused (ops.get_op has refused any it was asked for): the chunk stages."""
    return gated_delta


__all__ = ["gated_delta", "build", "COMPONENTS"]
