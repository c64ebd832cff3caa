"""The case registry behind scripts/bench_ops.py, and what an op family hands the runner.

A Case is an (op, shape): the dims its builder (make_inputs in ops/<op>/naive.py) takes and any more builder
arguments. registry() lists them all, QUICK names --quick's shape per op. A family's prepare function (bench/mixers.py,
bench/chains.py, bench/attention.py) turns a case into Runs, the op's variants on the case's inputs, and the
oracles they are checked against; Family says how its rows are bounded and timed, Options what the flags chose.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch

from ops import BackendError, get_op, list_backends

OPS = ("gla", "ssd", "gated_delta", "state", "proj_in", "gdn_proj_in", "mamba2_proj_in", "proj_out", "ramla",
       "attention")
MIXERS = ("gla", "ssd", "gated_delta")
CHAINS = ("proj_in", "gdn_proj_in", "mamba2_proj_in", "proj_out")


# ---- the registry ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    op: str                   # an ops/ op, or 'state' (the state pass of GLA and SSD)
    shape: str                # the name --shapes selects
    dims: dict                # the builder's shape
    knobs: dict = field(default_factory=dict)     # more builder arguments (gate_first, scalar decay, ...)


def registry(seq_lens: list[int]) -> list[Case]:
    """Every (op, shape) case; RA+MLA's at each of seq_lens. `tiny`: the CPU smoke shape of each op."""
    def gla(name, B, T, H, K, V):
        return Case("gla", name, dict(B=B, T=T, H=H, K=K, V=V))

    def state(name, B, T, H, K, V, scalar=False):
        return Case("state", name, dict(B=B, T=T, H=H, K=K, V=V), {"scalar": scalar})

    def attn(name, B, T, H, causal):
        return Case("attention", name, dict(B=B, T=T, H=H, D=64), {"causal": causal})

    return [
        gla("mve", 16, 2048, 12, 64, 64), gla("gla340m_layer", 8, 2048, 4, 256, 512),
        gla("gla340m_model", 8, 2048, 4, 128, 256), gla("long", 1, 32768, 4, 128, 128), gla("tiny", 1, 100, 2, 16, 16),
        Case("ssd", "mamba2", dict(B=8, T=2048, H=24, P=64, G=1, N=128)),
        Case("ssd", "tiny", dict(B=1, T=100, H=2, P=16, G=1, N=16)),
        Case("gated_delta", "gdn_mve", dict(B=16, T=2048, H=16, K=64, V=64)),
        Case("gated_delta", "gdn_wide", dict(B=8, T=2048, H=8, K=128, V=128)),
        Case("gated_delta", "tiny", dict(B=1, T=70, H=1, K=16, V=16)),
        state("train", 16, 2048, 16, 64, 64), state("long", 1, 65536, 4, 128, 128),
        state("gla125m", 8, 2048, 12, 64, 64), state("gla125m_b4", 4, 2048, 12, 64, 64),
        state("mamba2_n16", 8, 2048, 24, 16, 64, True), state("mamba2_n64", 8, 2048, 24, 64, 64, True),
        state("mamba2_n128", 8, 2048, 24, 128, 64, True),
        state("tiny", 1, 256, 2, 16, 16),
        Case("proj_in", "gla_b8t4096", dict(B=8, T=4096, d=2048, H=16, K=128, V=128, L=16)),
        Case("proj_in", "gla340m", dict(B=8, T=2048, d=1024, H=4, K=128, V=256, L=16)),
        Case("proj_in", "tiny", dict(B=1, T=24, d=32, H=2, K=16, V=16, L=4)),
        Case("gdn_proj_in", "gdn340m", dict(B=8, T=2048, d=1024, H=8, K=128, V=128, W=4)),
        Case("gdn_proj_in", "tiny", dict(B=1, T=24, d=32, H=2, K=16, V=16, W=4)),
        Case("mamba2_proj_in", "mamba2_370m", dict(B=8, T=2048, d=1024, d_inner=2048, d_state=128, H=32, W=4)),
        Case("mamba2_proj_in", "tiny", dict(B=1, T=24, d=16, d_inner=32, d_state=8, H=4, W=4)),
        Case("proj_out", "gla_b8t4096", dict(B=8, T=4096, H=16, V=128, d=2048)),
        Case("proj_out", "gla340m", dict(B=8, T=2048, H=4, V=256, d=1024)),
        Case("proj_out", "gdn340m", dict(B=8, T=2048, H=8, V=128, d=1024)),
        Case("proj_out", "mamba2_370m", dict(B=8, T=2048, H=1, V=2048, d=1024), {"gate_first": True, "eps": 1e-5}),
        Case("proj_out", "tiny", dict(B=1, T=24, H=2, V=16, d=32)),
        *(Case("ramla", f"T{T}", dict(B=8, T=T, H=12, D=64, L=64, W=64)) for T in seq_lens),   # gpt2_ramla_124m
        Case("ramla", "tiny", dict(B=1, T=48, H=2, D=16, L=16, W=8)),
        attn("small", 1, 512, 8, False), attn("small_causal", 1, 512, 8, True), attn("gpt2", 8, 2048, 12, False),
        attn("gpt2_causal", 8, 2048, 12, True), attn("tiny", 1, 40, 2, True),
    ]


QUICK = {"gla": "mve", "ssd": "mamba2", "gated_delta": "gdn_mve", "state": "train", "proj_in": "gla340m",
         "gdn_proj_in": "gdn340m", "mamba2_proj_in": "mamba2_370m", "proj_out": "gla340m", "attention": "small"}


# ---- what a family hands the runner -----------------------------------------------------------------------------

@dataclass
class Run:
    """One variant of an op, prepared on its case's inputs."""
    backend: str                              # the registry backend it belongs to (or the peer library's name)
    forward: Callable[[], tuple]              # the outputs that are checked
    leaves: list                              # inputs whose gradients are checked and timed ([]: forward only)
    names: list[str]                          # the outputs' names, then the leaves'
    reads: list                               # what the forward reads (the byte count)
    flops: tuple[float, float | None]         # forward FLOPs, and fwd+bwd's (or the separate backward's)
    oracle: str = "ref"                       # which oracle it is checked against
    backward: Callable[[], tuple] | None = None   # a separate backward pass (the state pass), checked and timed
    bwd_reads: list = field(default_factory=list)
    checked: bool = True                      # False: a peer computing another op, timed unchecked
    timed: bool = True                        # False: a run that only sets the bound
    graph: bool = True                        # also timed as a CUDA graph (where the family is)
    context: Callable[[], ContextManager] = contextlib.nullcontext   # around every call (deterministic mode, ...)
    peer: str | None = None                   # the variant it is compared with, if not the family's peer
    floor: tuple | None = None                # the data-movement model's floor, forward and fwd+bwd ms
    note: str = ""


@dataclass
class Family:
    prepare: Callable[[Case, "Options", torch.device], tuple[dict, dict]]   # → (runs by label, oracles by key)
    peer: str                                 # the backend the speedup column compares with
    tol: float = 5e-3
    bound_from: str | None = None             # a run whose errors set the bounds: 2 × its error + 1e-3
    overrides: dict = field(default_factory=dict)
    warmup: float = 25
    rep: float = 100
    graph: bool = False


@dataclass
class Options:
    backends: list[str]
    chunk_sizes: list[int]
    segments: list[int]
    dtype: torch.dtype                        # the activations' dtype: bf16 on a GPU, fp32 under the interpreter


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def tensors_of(kwargs: dict) -> dict:
    return {n: t for n, t in kwargs.items() if isinstance(t, torch.Tensor)}


def fp32_copies(kwargs: dict) -> dict:
    """The oracle's inputs: the same values in fp32 (fp64 stays), fresh leaves where the originals need grad."""
    return {n: (t.detach().to(torch.promote_types(t.dtype, torch.float32)).requires_grad_(t.requires_grad)
                if isinstance(t, torch.Tensor) else t) for n, t in kwargs.items()}


def selected(op: str, opts: Options) -> list[str]:
    return [b for b in list_backends(op) if not opts.backends or b in opts.backends]


def backend_or_reason(op: str, backend: str) -> Callable | str:
    try:
        return get_op(op, backend)
    except BackendError as e:
        return str(e)

