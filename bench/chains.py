"""The projection chains (proj_in, gdn_proj_in, mamba2_proj_in, proj_out) as the model runs them: their FLOP
formula, the fp32 oracle without TF32, the input handed over as a non-leaf (normed_input), and each case's runs."""
from __future__ import annotations

import contextlib
import importlib
from typing import Callable

import torch

from bench.cases import Case, Options, Run, backend_or_reason, fp32_copies, tensors_of
from ops import get_op, list_backends
from utils.timing import on_gpu

OUTPUTS = {"proj_in": ["q", "k", "v", "gk", "r"], "gdn_proj_in": ["q", "k", "v", "g", "beta", "r"],
           "mamba2_proj_in": ["z", "x", "B", "C", "dt"], "proj_out": ["y"]}


def flops_chain(op: str, d: dict) -> float:
    """Forward FLOPs of the chain's GEMMs (and short convolutions), M = B·T rows."""
    M = d["B"] * d["T"]
    if op == "proj_in":
        HK, HV = d["H"] * d["K"], d["H"] * d["V"]
        return 2.0 * M * d["d"] * (2 * HK + 2 * HV + d["L"]) + 2.0 * M * d["L"] * HK
    if op == "gdn_proj_in":
        HK, HV = d["H"] * d["K"], d["H"] * d["V"]
        return 2.0 * M * d["d"] * (2 * HK + 2 * HV + 2 * d["H"]) + 2.0 * M * d["W"] * (2 * HK + HV)
    if op == "mamba2_proj_in":
        conv = d["d_inner"] + 2 * d["d_state"]
        return 2.0 * M * d["d"] * (d["d_inner"] + conv + d["H"]) + 2.0 * M * d["W"] * conv
    return 2.0 * M * d["H"] * d["V"] * d["d"]


@contextlib.contextmanager
def exact_fp32():
    """fp32 matmuls and convolutions without TF32: the oracle in true fp32."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def normed_input(fn: Callable) -> Callable:
    """fn with its first argument handed over as the model hands it: the block's RMSNorm output, a non-leaf.
    Autocast caches its bf16 cast of an fp32 leaf that requires grad (its heuristic for weights) until the
    autocast region ends; were x such a leaf, the unfused chain would cast it once instead of at each F.linear
    (and sum its gradients in bf16), which the model never does. x.view_as(x) is not a leaf and adds no kernel."""
    def call(x, *args, **kwargs):
        return fn(x.view_as(x), *args, **kwargs)
    return call


def prepare_chain(case: Case, opts: Options, device: torch.device) -> tuple[dict, dict]:
    """The chain as the model calls it: under bf16 autocast on a GPU, the input sides' x handed over as a non-leaf
    (normed_input), proj_out's o and r in the activations' dtype."""
    op = case.op
    naive = importlib.import_module(f"ops.{op}.naive")
    dtype = opts.dtype if op == "proj_out" else torch.float32
    kw = naive.make_inputs(case.dims, dtype, device, **case.knobs)
    leaves = tensors_of(kw)
    leaves = {n: t for n, t in leaves.items() if t.requires_grad}
    names = OUTPUTS[op] + list(leaves)
    ref_kw = fp32_copies(kw)
    oracle_fn = get_op(op, "naive")

    def oracle():
        with exact_fp32():
            out = oracle_fn(**ref_kw)
        return out if isinstance(out, tuple) else (out,)
    flops = flops_chain(op, case.dims)
    runs: dict[str, Run | str] = {}
    for backend in list_backends(op):
        if backend != "naive" and opts.backends and backend not in opts.backends:
            continue                                    # naive stays: it is the peer and sets the bound
        fn = backend_or_reason(op, backend)
        if isinstance(fn, str):
            runs[backend] = fn
            continue

        def forward(fn=fn if op == "proj_out" else normed_input(fn)):
            first, *rest = kw
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu()):
                out = fn(kw[first], **{n: kw[n] for n in rest})
            return out if isinstance(out, tuple) else (out,)
        runs[backend] = Run(backend, forward, list(leaves.values()), names, list(leaves.values()), (flops, 3 * flops))
    return runs, {"ref": Run("naive", oracle, [t for t in tensors_of(ref_kw).values() if t.requires_grad], names,
                             [], (0, None))}
