"""How fast is each op on each backend, against its peer? Every op through one runner over a registry of cases.

    python scripts/bench_ops.py --quick                                       # one shape per op
    python scripts/bench_ops.py --ops gla --backends chunk,fused,fla --shapes mve,gla340m_layer
    python scripts/bench_ops.py --ops gla --backends fused,fla --chunk-sizes 32,64,128,256
    python scripts/bench_ops.py --ops state --shapes long --segments 4,8,16,32
    python scripts/bench_ops.py --ops proj_in,gdn_proj_in,mamba2_proj_in,proj_out
    python scripts/bench_ops.py --ops ramla --seq-lens 2048,4096,8192
    python scripts/bench_ops.py --ops attention --profile                     # + torch.profiler's kernel table
    python scripts/bench_ops.py --list                                        # the registry: ops × shapes

A case is an (op, shape). Its inputs come from the op's builder (make_inputs in ops/<op>/naive.py, the one the
op's tests use), and the op's naive oracle runs in fp32 on the same values (no TF32). Then each backend runs:
its output and the gradient of every input are compared with the oracle's (relative error ‖a − b‖ / ‖b‖), and
a backend over its bound is reported FAIL and not timed. Bounds, bf16 as the op's tests hold them: 5e-3 for the
token mixers and the state pass, 2e-3 for attention's fp16 forward, twice the unfused chain's own bf16 error
plus 1e-3 for the projection chains, twice plain MLA's bf16 error on SDPA plus 1e-3 for RA+MLA (∂α: 2e-2).

    gla, ssd,         the token mixer on bf16 inputs with fp32 decays: naive, chunk, fused and fla (the peer);
    gated_delta       --chunk-sizes runs each backend at those it supports; gla's chunk and fused rows give the
                      data-movement model's floor (ops/gla/movement.py)
    state             the state pass alone, forward (chunk_fwd_h) and backward (chunk_bwd_dh): sequential
                      (`chunk`), split into S chunk ranges (`fused S=…`: --segments and the split the op picks),
                      from per-step decays, the PyTorch reference (`naive`) and fla's passes (the peer)
    proj_in, gdn_proj_in, mamba2_proj_in, proj_out
                      the projection chains as the model runs them (bf16 autocast, fp32 input and residual):
                      fused against the unfused chain (`naive`, the peer)
    ramla             RA+MLA at --seq-lens: the op (naive, fused), its attention kernels alone (`fused core`,
                      with and without the band), GPT-2's attention on SDPA (the peer; also deterministic)
    attention         the forward-only WMMA kernel (`fused`) against SDPA's kernels (`naive`)

Times are bench_ms medians (utils/timing.py: triton.testing.do_bench, warm-up 25 ms and 100 ms of repeats; the
state pass 10 / 50): the forward builds the autograd graph as training does, fwd+bwd adds torch.autograd.grad
(no .grad accumulates). `graph`: fwd+bwd replayed as a CUDA graph, the device's time alone (chains, RA+MLA,
attention). TFLOP/s: each family's FLOP formula (flops_*), fwd+bwd counting 3× the forward. GB/s: compulsory
bytes, the forward reading every input and writing every output once, the backward reading every input and
output gradient and writing every input gradient once. Peak MB: above the inputs during fwd+bwd; saved MB: what
autograd keeps for the backward, inputs excluded. `peer ÷ this` > 1: this backend is faster.

Without a GPU it runs the `tiny` shapes in fp32 under Triton's interpreter: every code path, meaningless times.
Writes <out>/<name>.{md,json,png} after every case (a run cut short keeps what it measured); the JSON rows are
long-format, each with the device, versions and commit.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import math
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, ContextManager

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ops import BACKENDS, BackendError, get_op, list_backends, require_fla
from utils.timing import bench_ms, graph_ms, kernel_table, device_ms, on_gpu, peak_mb, profile_steps

OPS = ("gla", "ssd", "gated_delta", "state", "proj_in", "gdn_proj_in", "mamba2_proj_in", "proj_out", "ramla",
       "attention")
MIXERS = ("gla", "ssd", "gated_delta")
CHAINS = ("proj_in", "gdn_proj_in", "mamba2_proj_in", "proj_out")
DEFAULT_OUT = Path("runs/bench")
STATE_C = 64
GATE_BOUND = 2e-2            # RA+MLA's ∂α: one sum over B·H·T·W terms of both signs (tests/ops/test_ramla.py)


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


# ---- token mixers ----------------------------------------------------------------------------------------------

def flops_mixer(op: str, d: dict, C: int) -> float:
    """Forward FLOPs of the chunkwise algorithm, per head and token: GLA the C×C scores over K, scores·V, q·S and
    the state update; SSD the same with N, P; the gated delta rule k kᵀ, w, scores (C·K each), u, A·v_new (C·V
    each), w·h, kᵀ·v_new, q·h (K·V each)."""
    n = 2.0 * d["B"] * d["H"] * d["T"]
    if op == "gla":
        return n * (C * d["K"] + C * d["V"] + 2 * d["K"] * d["V"])
    if op == "ssd":
        return n * (C * d["N"] + C * d["P"] + 2 * d["N"] * d["P"])
    return n * (3 * C * d["K"] + 2 * C * d["V"] + 3 * d["K"] * d["V"])


def movement_floor(op: str, d: dict, backend: str) -> tuple[float, float | None] | None:
    """The data-movement model's floor (ops/gla/movement.py, H100, C = 64) in ms of this backend's own kernels,
    forward and fwd+bwd: chunk and fused for GLA (fused: the scan where the model says it pays, as the op
    decides), chunk's forward for SSD."""
    from ops.gla.movement import H100, Shape, choose, chunk_bwd_plan, chunk_plan, fused_bwd_plan, scan_pays

    if op == "gla" and backend in ("chunk", "fused"):
        s = Shape(d["B"], d["T"], d["H"], d["K"], d["V"])
        scan = backend == "fused" and scan_pays(s.B, s.T, s.H, s.K, s.V, s.C, s.elem)
        fwd = (choose(s, H100)[0] if scan else chunk_plan(s)).floor_s(H100)
        bwd = (chunk_bwd_plan(s) if backend == "chunk" else fused_bwd_plan(s)).floor_s(H100)
        return fwd * 1e3, (fwd + bwd) * 1e3
    if op == "ssd" and backend == "chunk":
        return chunk_plan(Shape(d["B"], d["T"], d["H"], d["N"], d["P"], scalar_decay=True)).floor_s(H100) * 1e3, None
    return None


def prepare_mixer(case: Case, opts: Options, device: torch.device) -> tuple[dict, dict]:
    op = case.op
    naive = importlib.import_module(f"ops.{op}.naive")
    x = naive.make_inputs(case.dims, opts.dtype, device, decay="model", **case.knobs)
    names = ["o", *x]
    ref_in = fp32_copies(x)
    oracle_fn = get_op(op, "naive")
    oracle = Run("naive", lambda: (oracle_fn(**ref_in)[0],), list(ref_in.values()), names, [], (0, None))
    runs: dict[str, Run | str] = {}
    for backend in selected(op, opts):
        fn = backend_or_reason(op, backend)
        if isinstance(fn, str):
            runs[backend] = fn
            continue
        sizes = [None]
        if opts.chunk_sizes and backend != "naive":
            have = getattr(fn, "chunk_sizes", None)
            sizes = [C for C in opts.chunk_sizes if have is None or C in have]
            if not sizes:
                runs[backend] = f"runs chunk sizes {', '.join(map(str, have))} only"
                continue
        for C in sizes:
            kw = {} if C is None else {"chunk_size": C}
            flops = flops_mixer(op, case.dims, C or 64)
            run = Run(backend, lambda fn=fn, kw=kw: (fn(**x, **kw)[0],), list(x.values()), names, list(x.values()),
                      (flops, 3 * flops))
            run.floor = movement_floor(op, case.dims, backend) if C in (None, 64) else None
            runs[backend if C is None else f"{backend} C={C}"] = run
    return runs, {"ref": oracle}


# ---- the state pass ----------------------------------------------------------------------------------------------

def prepare_state(case: Case, opts: Options, device: torch.device) -> tuple[dict, dict]:
    """k, v, q and the output gradient from GLA's builder (the model's gates, per key or per head); the decays are
    rounded to bf16 first, so that the variants taking bf16 per-step decays compute the same function."""
    from ops.chunkwise.cumsum import chunk_cumsum_ref
    from ops.chunkwise.state import chunk_bwd_dh, chunk_bwd_dh_ref, chunk_fwd_h, chunk_fwd_h_ref, segment_plan, \
        split_segments
    from ops.gla.naive import make_inputs
    from ops.triton_utils import sm_count, tile

    d, C = case.dims, STATE_C
    x = make_inputs(d, opts.dtype, device, requires_grad=False, scalar=case.knobs.get("scalar", False))
    q, k, v = x["q"], x["k"], x["v"]
    g = x["gk"].to(torch.bfloat16).float()
    b = chunk_cumsum_ref(g, C)
    do = torch.randn(v.shape, generator=torch.Generator(device=device).manual_seed(2), device=device).to(v.dtype)
    scale = d["K"] ** -0.5
    flops = 2.0 * d["B"] * d["H"] * d["T"] * d["K"] * d["V"]
    names = ["h", "dh"]

    def run(backend, fwd, bwd, reads, bwd_reads, **kw):
        return Run(backend, fwd, [], names, reads, (flops, flops), backward=bwd, bwd_reads=bwd_reads, graph=False,
                   **kw)

    ref = run("naive", lambda: (chunk_fwd_h_ref(k, v, b, None, C)[0],),
              lambda: (chunk_bwd_dh_ref(q, do, b, None, scale, C)[0],), [k, v, b], [q, do, b])
    runs: dict[str, Run | str] = {}
    backends = selected("gla", opts)
    if "naive" in backends:
        runs["naive"] = ref
    tiles = -(-d["K"] // tile(d["K"])) * -(-d["V"] // tile(d["V"])) * d["B"] * d["H"]
    NT, sms = -(-d["T"] // C), sm_count(device)
    auto = split_segments(d["B"], d["H"], d["K"], d["V"], d["T"], C, device)
    if "chunk" in backends:
        runs["chunk"] = run("chunk", lambda: (chunk_fwd_h(k, v, b, None, False, C)[0],),
                            lambda: (chunk_bwd_dh(q, do, b, None, False, scale, C)[0],), [k, v, b], [q, do, b],
                            note=f"{tiles} programs on {sms} SMs" + (" (the op's choice)" if auto == 1 else ""))
        for dtype in (torch.bfloat16, torch.float32):
            gs = g.to(dtype)
            runs[f"chunk, {str(dtype)[6:]} step decays"] = run(
                "chunk", lambda gs=gs: (chunk_fwd_h(k, v, gs, None, False, C, step_decays=True)[0],),
                lambda gs=gs: (chunk_bwd_dh(q, do, gs, None, False, scale, C, step_decays=True)[0],), [k, v, gs],
                [q, do, gs], peer="fla, from bf16 step decays")
    if "fused" in backends:
        for S in sorted({segment_plan(NT, s)[1] for s in {auto, *opts.segments} if s > 1} - {1}):
            runs[f"fused S={S}"] = run(
                "fused", lambda S=S: (chunk_fwd_h(k, v, b, None, False, C, segments=S)[0],),
                lambda S=S: (chunk_bwd_dh(q, do, b, None, False, scale, C, segments=S)[0],), [k, v, b], [q, do, b],
                note=f"{tiles * S} programs on {sms} SMs" + (" (the op's choice)" if S == auto else ""))
    if "fla" in backends:
        runs.update(fla_state_runs(run, q, k, v, do, b, g, scale))
    return runs, {"ref": ref}


def fla_state_runs(run, q, k, v, do, b, g, scale) -> dict:
    """fla's chunk_fwd_h / chunk_bwd_dh on our cumulative decays (base 2, as its kernels take them), and from the
    bf16 per-step decays as its GLA layer runs them (its chunk_local_cumsum first)."""
    try:
        require_fla("state")
    except BackendError as e:
        return {"fla": str(e)}
    from fla.ops.common import chunk_h as fla_h
    from fla.ops.utils.cumsum import chunk_local_cumsum

    C, scalar = STATE_C, b.shape[-1] == 1
    name = "g" if scalar else "gk"
    b2 = b / math.log(2)
    decay = {name: b2[..., 0] if scalar else b2}
    gb = (g[..., 0] if scalar else g).to(torch.bfloat16)

    def steps():
        return {name: chunk_local_cumsum(gb, C, scale=1 / math.log(2))}
    return {
        "fla": run("fla",
                   lambda: (fla_h.chunk_fwd_h(k, v, h0=None, output_final_state=False, chunk_size=C, **decay)[0],),
                   lambda: (fla_h.chunk_bwd_dh(q, k, v, do, None, None, scale, chunk_size=C, **decay)[0],),
                   [k, v, b], [q, k, v, do, b]),
        "fla, from bf16 step decays": run(
            "fla", lambda: (fla_h.chunk_fwd_h(k, v, h0=None, output_final_state=False, chunk_size=C, **steps())[0],),
            lambda: (fla_h.chunk_bwd_dh(q, k, v, do, None, None, scale, chunk_size=C, **steps())[0],),
            [k, v, gb], [q, k, v, do, gb])}


# ---- projection chains -------------------------------------------------------------------------------------------

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


# ---- RA+MLA ------------------------------------------------------------------------------------------------------

def prepare_ramla(case: Case, opts: Options, device: torch.device) -> tuple[dict, dict]:
    """The op (naive: fp32 T×T scores whatever its inputs; fused: the flash kernels with W_ql and W_vu by cuBLAS),
    its attention kernels alone on precomputed latent queries [H, B, T, L] (`fused core`: what RA+MLA adds over
    GPT-2's attention; `no band`: the same kernels on plain MLA), and GPT-2's causal attention on SDPA at the same
    B, T, H, D: the peer, another op, so timed unchecked."""
    from ops.ramla import naive

    d = case.dims
    B, T, H, D, L, W = (d[n] for n in ("B", "T", "H", "D", "L", "W"))
    kw = naive.make_inputs(d, opts.dtype, device)
    leaves = [t for t in tensors_of(kw).values()]
    names = ["o", "q", "k_lat", "v_lat", "w_ql", "w_vu", "alpha"]
    ref_kw = fp32_copies(kw)
    scale = L ** -0.5
    eye = torch.eye(L, device=device).expand(H, L, L)

    def core_oracle(q_lat, k, v, alpha):
        """naive.ramla on q_lat as the queries, identity maps: the core's output [H, B, T, L]."""
        return (naive.ramla(q_lat.permute(1, 2, 0, 3), k, v, eye, eye, alpha, W, scale).permute(2, 0, 1, 3),)

    proj = 4.0 * B * T * H * D * L                                     # q W_ql and ctx W_vu
    scores = 2.0 * B * H * T * T * L                                   # q k and p v over the causal half
    band = 2.0 * B * H * T * min(W, T) * L
    fl = lambda f: (f, 3 * f)                                          # noqa: E731
    # plain MLA through SDPA in the activations' dtype (its maps too: SDPA's path takes one dtype), against the fp32
    # oracle on the same rounded values: PyTorch's own error on the nearest chain it has, which sets the bound
    plain = {n: kw[n].detach().to(opts.dtype).requires_grad_() for n in ("q", "k_lat", "v_lat", "w_ql", "w_vu")}
    plain_ref = fp32_copies(plain)
    oracles = {"ref": Run("naive", lambda: (naive.ramla(**ref_kw),), list(tensors_of(ref_kw).values()), names, [],
                          (0, None)),
               "plain": Run("naive", lambda: (naive.ramla(**plain_ref, alpha=None, window=W),),
                            list(plain_ref.values()), names[:-1], [], (0, None))}
    runs: dict[str, Run | str] = {
        "plain MLA on SDPA (sets the bound)": Run(
            "naive", lambda: (naive.ramla(**plain, alpha=None, window=W),), list(plain.values()), names[:-1],
            list(plain.values()), fl(proj + scores), oracle="plain", timed=False)}
    backends = selected("ramla", opts)
    if "naive" in backends:
        runs["naive"] = Run("naive", lambda: (naive.ramla(**kw),), leaves, names, leaves, fl(proj + scores + band),
                            graph=False, note="fp32 T×T scores whatever the inputs")
    if "fused" in backends:
        fn = backend_or_reason("ramla", "fused")
        if isinstance(fn, str):
            runs["fused"] = fn
        else:
            from ops.ramla.fused import FlashRAMLA, far_kernel, latent_queries

            runs["fused"] = Run("fused", lambda: (fn(**kw),), leaves, names, leaves, fl(proj + scores + band))
            q_lat = latent_queries(kw["q"].detach(), kw["w_ql"].detach()).requires_grad_()
            core_in = [q_lat, kw["k_lat"], kw["v_lat"], kw["alpha"]]
            ref_core = [t.detach().float().requires_grad_() for t in core_in]
            oracles["core"] = Run("naive", lambda: core_oracle(*ref_core), ref_core, [], [], (0, None))
            oracles["core, no band"] = Run("naive", lambda: core_oracle(*ref_core[:3], None), ref_core[:3], [], [],
                                           (0, None))
            core_names = ["o", "q_lat", "k_lat", "v_lat", "alpha"]
            runs["fused core"] = Run(
                "fused", lambda: (FlashRAMLA.apply(q_lat, kw["k_lat"], kw["v_lat"], kw["alpha"], W, scale,
                                                   far_kernel(q_lat)),),
                core_in, core_names, core_in, fl(scores + band), oracle="core", note="the attention kernels alone")
            runs["fused core, no band"] = Run(
                "fused", lambda: (FlashRAMLA.apply(q_lat, kw["k_lat"], kw["v_lat"], None, W, scale, None),),
                core_in[:3], core_names[:4], core_in[:3], fl(scores), oracle="core, no band",
                note="plain MLA on the same kernels")
    g = torch.Generator(device=device).manual_seed(3)
    mha = [torch.randn(B, T, H, D, generator=g, device=device).to(opts.dtype).requires_grad_() for _ in range(3)]

    def sdpa():
        return (torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in mha), is_causal=True),)
    peer = dict(checked=False, note="GPT-2's attention (H D causal): another op, unchecked")
    runs["sdpa"] = Run("sdpa", sdpa, mha, ["o", "q", "k", "v"], mha, fl(2.0 * B * H * T * T * D), **peer)
    runs["sdpa, deterministic"] = Run("sdpa", sdpa, mha, ["o", "q", "k", "v"], mha, fl(2.0 * B * H * T * T * D),
                                      context=deterministic, **peer)
    return runs, oracles


@contextlib.contextmanager
def deterministic():
    """torch.use_deterministic_algorithms for the call: SDPA's bitwise-repeatable backward (FlashAttention-2 on
    the H100), the like-for-like peer of the fused kernels' repeatable one."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


# ---- softmax attention -------------------------------------------------------------------------------------------

def prepare_attention(case: Case, opts: Options, device: torch.device) -> tuple[dict, dict]:
    """Forward only (the WMMA kernel has no backward), fp16 on a GPU. SDPA's rows take [B, H, T, D] copies made
    before timing, as a caller in SDPA's layout would; `launch floor` is one kernel writing one element: what a
    launch costs under the same timer."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ops.attention import naive

    dtype = torch.float16 if on_gpu() else torch.float32
    kw = naive.make_inputs(case.dims, dtype, device, requires_grad=False, **case.knobs)
    q, k, v, causal = kw["q"], kw["k"], kw["v"], kw["causal"]
    d = case.dims
    flops = 4.0 * d["B"] * d["H"] * d["T"] ** 2 * d["D"] / (2 if causal else 1)
    oracle = Run("naive", lambda: (naive.attention_reference(q.float(), k.float(), v.float(), causal),), [], ["o"],
                 [], (0, None))
    runs: dict[str, Run | str] = {}
    backends = selected("attention", opts)
    if "fused" in backends:
        fn = backend_or_reason("attention", "fused")
        runs["fused"] = fn if isinstance(fn, str) else Run(
            "fused", lambda: (fn(q, k, v, causal),), [], ["o"], [q, k, v], (flops, None))
    if "naive" in backends:
        qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))

        def sdpa():
            return (torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, is_causal=causal).transpose(1, 2),)
        runs["naive"] = Run("naive", sdpa, [], ["o"], [qb, kb, vb], (flops, None), note="SDPA's own choice")
        for name, kernel in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                             ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            runs[f"naive, sdpa {name}"] = Run("naive", sdpa, [], ["o"], [qb, kb, vb], (flops, None),
                                              context=lambda kernel=kernel: sdpa_kernel(kernel))
    one = torch.empty(1, device=device)
    runs["launch floor"] = Run("none", lambda: (one.fill_(1.0),), [], ["o"], [], (0.0, None), checked=False,
                               note="one kernel writing one element")
    return runs, {"ref": oracle}


FAMILIES = {
    **{op: Family(prepare_mixer, peer="fla") for op in MIXERS},
    "state": Family(prepare_state, peer="fla", warmup=10, rep=50),
    **{op: Family(prepare_chain, peer="naive", bound_from="naive", graph=True) for op in CHAINS},
    "ramla": Family(prepare_ramla, peer="sdpa", bound_from="plain MLA on SDPA (sets the bound)",
                    overrides={"dalpha": GATE_BOUND}, graph=True),
    "attention": Family(prepare_attention, peer="naive", tol=2e-3, graph=True),
}


# ---- the runner --------------------------------------------------------------------------------------------------

def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in fp64; NaN anywhere gives NaN, which fails every bound."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def evaluate(run: Run, dys: list | None = None) -> tuple[list, list, list, list]:
    """The run's outputs, its leaves' gradients for the upstream gradients dys (drawn here, seeded, when None),
    its separate backward's outputs, and the dys used."""
    with run.context():
        outs = tuple(run.forward())
        if dys is None:
            g = torch.Generator(device=outs[0].device).manual_seed(1)
            dys = [torch.randn(o.shape, generator=g, device=o.device) for o in outs]
        grads = torch.autograd.grad(outs, run.leaves, [dy.to(o.dtype) for dy, o in zip(dys, outs)]) \
            if run.leaves else ()
        bwd = tuple(run.backward()) if run.backward is not None else ()
    return [o.detach() for o in outs], list(grads), list(bwd), dys


def check_runs(runs: dict, oracles: dict) -> dict:
    """label → {name: relative error} against the run's oracle, or an exception; the oracles run once each. An
    oracle that runs out of memory raises (the caller checks at B = 1 instead)."""
    refs, out = {}, {}
    for label, run in runs.items():
        if isinstance(run, str) or not run.checked:
            continue
        if run.oracle not in refs:
            with torch.no_grad() if not oracles[run.oracle].leaves else contextlib.nullcontext():
                o, g, b, dys = evaluate(oracles[run.oracle])
            refs[run.oracle] = ([t.float() for t in o], [t.float() for t in g], [t.float() for t in b], dys)
        ref_o, ref_g, ref_b, dys = refs[run.oracle]
        try:
            o, g, b, _ = evaluate(run, dys)
            n_o, n_l = len(o), len(run.leaves)
            names = run.names[:n_o] + ["d" + n for n in run.names[n_o:n_o + n_l]] + run.names[n_o + n_l:]
            out[label] = {n: rel_err(x, y) for n, x, y in zip(names, [*o, *g, *b], [*ref_o, *ref_g, *ref_b])}
            del o, g, b
        except (RuntimeError, ValueError, TypeError) as e:     # out of memory, or a kernel this machine lacks
            out[label] = e
    return out


def bounds_for(family: Family, errs: dict, bound_errs: dict | None) -> dict:
    """name → bound: the family's flat tolerance, or 2 × the bound run's error on that name (its largest where it
    has no such name) + 1e-3; overrides win."""
    out = {}
    for name in errs:
        if name in family.overrides:
            out[name] = family.overrides[name]
        elif bound_errs:
            out[name] = 2 * bound_errs.get(name, max(bound_errs.values())) + 1e-3
        else:
            out[name] = family.tol
    return out


def measure(run: Run, family: Family, profile: bool) -> dict:
    """Times, throughput, peak memory (and with profile, the kernel table) of a run that passed its check."""
    row = {}
    with run.context():
        outs = tuple(run.forward())
        # a generator of its own: a CUDA-graph capture that failed leaves the default generator unusable
        g = torch.Generator(device=outs[0].device).manual_seed(1)
        dys = [torch.randn(o.shape, generator=g, device=o.device).to(o.dtype) for o in outs]
        out_bytes = nbytes(outs)
        del outs

        def fwd_bwd():
            return torch.autograd.grad(run.forward(), run.leaves, dys)
        second = fwd_bwd if run.leaves else run.backward
        row["fwd_ms"] = bench_ms(run.forward, family.warmup, family.rep)
        fwd_bytes = nbytes(run.reads) + out_bytes
        row["fwd_tflops"] = run.flops[0] / row["fwd_ms"] / 1e9
        row["fwd_gbs"] = fwd_bytes / row["fwd_ms"] / 1e6
        if second is not None:
            key = "fwdbwd" if run.leaves else "bwd"
            row[f"{key}_ms"] = ms = bench_ms(second, family.warmup, family.rep)
            if run.leaves:
                more = nbytes(run.reads) + 2 * out_bytes + nbytes(run.leaves)
                row["fwdbwd_gbs"] = (fwd_bytes + more) / ms / 1e6
            else:
                row["bwd_gbs"] = (nbytes(run.bwd_reads) + nbytes(run.backward())) / ms / 1e6
            if run.flops[1] is not None:
                row[f"{key}_tflops"] = run.flops[1] / ms / 1e9
        whole = fwd_bwd if run.leaves else run.forward if run.backward is None else \
            (lambda: (run.forward(), run.backward()))
        if family.graph and run.graph:
            try:
                row["graph_ms"] = graph_ms(whole, family.rep)
            except RuntimeError as e:            # a call that cannot be captured keeps its eager times
                cause = e.__context__ or e           # what broke the capture, not capture_end's own error
                row["graph_error"] = f"{type(cause).__name__}: {str(cause).splitlines()[0][:120]}"
        row["peak_mb"] = peak_mb(whole)
        if profile:
            prof = profile_steps(whole)
            row["kernel_ms"] = device_ms(prof, 5)
            row["kernel_table"] = kernel_table(prof)
    return {k: v for k, v in row.items() if v is not None}


def saved_bytes(run: Run) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of one forward, the inputs' not counted.
    Measured after every run of a case is timed: a forward under saved_tensors_hooks that is never run backward
    leaves its inputs' gradient accumulators (bound to the default stream) alive, and a later CUDA-graph capture
    using the same inputs then fails (the backward would make the default stream wait on the capturing one)."""
    seen = {t.untyped_storage().data_ptr() for t in [*run.leaves, *run.reads] if isinstance(t, torch.Tensor)}
    total = 0

    def pack(t):
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run.forward()
    return total


def run_case(case: Case, opts: Options, device: torch.device, profile: bool = False) -> list[dict]:
    """Check every variant of one case against its oracle, then time those that pass; one row each."""
    family = FAMILIES[case.op]
    runs, oracles = family.prepare(case, opts, device)
    where = ""
    try:
        errors = check_runs(runs, oracles)
    except torch.OutOfMemoryError:           # the oracle's T×T scores: check the same kernels at B = 1
        del runs, oracles
        torch.cuda.empty_cache()
        small = replace(case, dims={**case.dims, "B": 1})
        errors = check_runs(*family.prepare(small, opts, device))
        torch.cuda.empty_cache()
        runs, oracles = family.prepare(case, opts, device)
        where = f"checked at B1 (the oracle ran out of memory at B{case.dims['B']}); "
    del oracles
    bound_errs = errors.get(family.bound_from) if isinstance(errors.get(family.bound_from), dict) else None
    rows = []
    for label, run in runs.items():
        row = {"op": case.op, "shape": case.shape, "dims": {**case.dims, **case.knobs}, "variant": label,
               "backend": run.backend if isinstance(run, Run) else label.split()[0]}
        if isinstance(run, str):
            rows.append({**row, "status": "n/a", "why": run})
            continue
        row["note"] = run.note
        if run.floor:
            row |= {k: v for k, v in zip(("floor_fwd_ms", "floor_fwdbwd_ms"), run.floor) if v is not None}
        err = errors.get(label)
        if isinstance(err, Exception):
            oom = isinstance(err, torch.OutOfMemoryError)
            rows.append({**row, "status": "OOM" if oom else "error", "why": f"{type(err).__name__}: {str(err)[:200]}"})
            continue
        if err is not None and label == family.bound_from:     # the reference of the bounds: its own error
            row |= {"errors": err, "max_rel_err": max(err.values(), default=0.0)}
            row["check"] = where + f"sets the bound ({row['max_rel_err']:.1e})"
        elif err is not None:
            bounds = bounds_for(family, err, bound_errs)
            row |= {"errors": err, "bounds": bounds, "max_rel_err": max(err.values(), default=0.0)}
            bad = [n for n, e in err.items() if not e <= bounds[n]]             # NaN fails too
            if bad:
                row["check"] = "FAIL: " + ", ".join(f"{n} {err[n]:.1e} > {bounds[n]:.1e}" for n in bad)
                rows.append({**row, "status": "FAIL"})
                continue
            row["check"] = where + f"ok ({row['max_rel_err']:.1e})"
        else:
            row["check"] = "not checked"
        if not run.timed:
            rows.append({**row, "status": "bound"})
            continue
        try:
            row |= measure(run, family, profile)
            row["status"] = "ok"
        except torch.OutOfMemoryError:
            row |= {"status": "OOM", "why": "out of memory while timing"}
        except RuntimeError as e:            # e.g. an SDPA kernel this GPU or dtype lacks
            row |= {"status": "error", "why": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        rows.append(row)
        if on_gpu():
            torch.cuda.empty_cache()
    for row in rows:
        run = runs[row["variant"]]
        if row["status"] == "ok" and run.leaves:
            with run.context():
                row["saved_mb"] = saved_bytes(run) / 1e6
    add_speedups(rows, family, runs)
    return rows


def add_speedups(rows: list[dict], family: Family, runs: dict) -> None:
    """peer ÷ this for each timed row, the peer being the row's own (Run.peer) or the first of the family's."""
    ok = {r["variant"]: r for r in rows if r["status"] == "ok"}
    default = next((r for r in rows if r["status"] == "ok" and r["backend"] == family.peer), None)
    for r in ok.values():
        run = runs[r["variant"]]
        peer = ok.get(run.peer) if run.peer else default
        if peer is None or peer is r or r["backend"] == "none":
            continue
        r["peer"] = peer["variant"]
        for key in ("fwd_ms", "fwdbwd_ms", "bwd_ms", "graph_ms"):
            if key in r and key in peer:
                r["speedup_" + key[:-3]] = peer[key] / r[key]


# ---- the report --------------------------------------------------------------------------------------------------

COLUMNS = [("fwd ms", "fwd_ms", ".4g"), ("fwd+bwd ms", "fwdbwd_ms", ".4g"), ("bwd ms", "bwd_ms", ".4g"),
           ("graph ms", "graph_ms", ".4g"), ("fwd TFLOP/s", "fwd_tflops", ".1f"),
           ("fwd+bwd TFLOP/s", "fwdbwd_tflops", ".1f"), ("bwd TFLOP/s", "bwd_tflops", ".1f"),
           ("fwd GB/s", "fwd_gbs", ".0f"), ("fwd+bwd GB/s", "fwdbwd_gbs", ".0f"), ("bwd GB/s", "bwd_gbs", ".0f"),
           ("peak MB", "peak_mb", ".0f"), ("saved MB", "saved_mb", ".0f"), ("kernel ms", "kernel_ms", ".4g"),
           ("model floor fwd ms", "floor_fwd_ms", ".3f"), ("model floor fwd+bwd ms", "floor_fwdbwd_ms", ".3f"),
           ("peer ÷ this fwd", "speedup_fwd", ".2f"), ("peer ÷ this fwd+bwd", "speedup_fwdbwd", ".2f"),
           ("peer ÷ this bwd", "speedup_bwd", ".2f"), ("peer ÷ this graph", "speedup_graph", ".2f")]


def to_markdown(rows: list[dict], env: dict, command: str, notes: list[str]) -> str:
    dtype = "bf16 (attention fp16)" if env.get("gpu") else "fp32 under Triton's interpreter (times mean nothing)"
    lines = [f"# Op benchmarks — {env['date']}, {env.get('gpu') or 'CPU'}", "", f"Command: `{command}`  ",
             f"torch {env['torch']}, triton {env['triton']}, fla {env['fla']}, commit {env.get('commit')}"
             f"{' (dirty)' if env.get('dirty') else ''}; {dtype}; bench_ms medians (do_bench), fwd+bwd by "
             "torch.autograd.grad; checks against the fp32 oracle before timing.", ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    for op in dict.fromkeys(r["op"] for r in rows):
        ours = [r for r in rows if r["op"] == op]
        cols = [c for c in COLUMNS if any(c[1] in r for r in ours)]
        peer = FAMILIES[op].peer
        heads = " | ".join(h.replace("peer", peer) for h, _, _ in cols)
        lines += [f"## {op}", "", f"| shape | variant | check | {heads} | notes |", "|" + "---|" * (len(cols) + 4)]
        for r in ours:
            dims = " ".join(f"{k}{v}" for k, v in r["dims"].items() if not isinstance(v, bool)) + \
                "".join(f" {k}" for k, v in r["dims"].items() if v is True)
            done = r["status"] in ("ok", "FAIL", "bound")
            check = r.get("check", "") if done else f"{r['status']}: {r.get('why', '')}"
            if r["status"] == "bound":
                check += ", not timed"
            cells = [format(r[k], f) if isinstance(r.get(k), (int, float)) else "" for _, k, f in cols]
            note = "; ".join(x for x in (r.get("note"), r.get("graph_error") and f"graph: {r['graph_error']}") if x)
            lines.append(f"| {r['shape']} ({dims}) | {r['variant']} | {check} | " + " | ".join(cells) + f" | {note} |")
        lines.append("")
    tables = [r for r in rows if "kernel_table" in r]
    if tables:
        lines += ["## Kernel tables (torch.profiler, 5 steps of fwd+bwd after 3)", ""]
        for r in tables:
            lines += [f"### {r['op']} {r['shape']} {r['variant']}", "", "```", r["kernel_table"], "```", ""]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """fwd+bwd (or bwd, or fwd for forward-only ops) ms per shape and variant, one panel per op, log scale."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    ops = list(dict.fromkeys(r["op"] for r in ok)) or ["(nothing timed)"]
    fig, axes = plt.subplots(1, len(ops), figsize=(5.5 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        mine = [r for r in ok if r["op"] == op]
        key = next((k for k in ("fwdbwd_ms", "bwd_ms", "fwd_ms") if any(k in r for r in mine)), "fwd_ms")
        shapes = list(dict.fromkeys(r["shape"] for r in mine))
        variants = list(dict.fromkeys(r["variant"] for r in mine))
        w = 0.8 / max(1, len(variants))
        for i, v in enumerate(variants):
            ys = [next((r.get(key, math.nan) for r in mine if r["shape"] == s and r["variant"] == v), math.nan)
                  for s in shapes]
            ax.bar([j + i * w for j in range(len(shapes))], ys, w, label=v)
        ax.set_xticks([j + w * (len(variants) - 1) / 2 for j in range(len(shapes))], shapes, rotation=15)
        ax.set(yscale="log", ylabel=key.replace("_ms", " ms").replace("fwdbwd", "fwd+bwd"), title=op)
        if variants:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def force_fla_backward() -> str | None:
    """fla 0.6 refuses its gated backward on Hopper with Triton < 3.7.1 (a Triton miscompile, its issue #640): lift
    the refusal so that it can be timed, and return the note that says its backward numbers are timing-only."""
    try:
        import fla.ops.common.chunk_o as chunk_o
    except ImportError:
        return None
    if getattr(chunk_o, "TRITON_ABOVE_3_7_1", True) or not getattr(chunk_o, "IS_NVIDIA_HOPPER", False):
        return None
    chunk_o.TRITON_ABOVE_3_7_1 = True
    return ("fla's gated backward forced on (fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1, Triton < 3.7.1 on Hopper): "
            "its backward times are timing-only, though checked against the oracle like every row")


def environment(device: torch.device) -> dict:
    from utils.runinfo import environment as run_environment

    env = run_environment(device)
    return {**env, "gpu": env.get("gpu"), "date": datetime.date.today().isoformat()}


def write(rows: list[dict], env: dict, command: str, notes: list[str], stem: Path) -> None:
    stem.with_suffix(".md").write_text(to_markdown(rows, env, command, notes))
    long = [{**{k: v for k, v in r.items() if k != "kernel_table"}, "device": env.get("gpu") or "cpu",
             "torch": env["torch"], "triton": env["triton"], "fla": env["fla"], "commit": env.get("commit"),
             "dirty": env.get("dirty"), "date": env["date"]} for r in rows]
    stem.with_suffix(".json").write_text(json.dumps({"command": command, "notes": notes, "env": env, "rows": long},
                                                    indent=1, default=str))
    plot(rows, stem.with_suffix(".png"))


def ints(spec: str, flag: str, p: argparse.ArgumentParser) -> list[int]:
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        p.error(f"{flag} {spec!r}: expected comma-separated integers")


def select(args, p: argparse.ArgumentParser) -> list[Case]:
    """The cases the flags pick: --shapes by name, else --quick's one per op, else every full shape on a GPU and
    the tiny ones without."""
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else list(OPS)
    if unknown := sorted(set(ops) - set(OPS)):
        p.error(f"unknown op(s) {', '.join(unknown)}; ops: {', '.join(OPS)}")
    seq_lens = ints(args.seq_lens, "--seq-lens", p)
    cases = [c for c in registry(seq_lens) if c.op in ops]
    if args.shapes:
        names = [s.strip() for s in args.shapes.split(",") if s.strip()]
        if unknown := sorted(set(names) - {c.shape for c in cases}):
            p.error(f"unknown shape(s) {', '.join(unknown)} for {', '.join(ops)}; --list shows the registry")
        return [c for c in cases if c.shape in names]
    if not on_gpu():
        return [c for c in cases if c.shape == "tiny"]
    if args.quick:
        first_t = f"T{seq_lens[0]}" if seq_lens else None
        return [c for c in cases if c.shape == QUICK.get(c.op, first_t)]
    return [c for c in cases if c.shape != "tiny"]


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="", help=f"comma-separated, of {', '.join(OPS)} (default: all)")
    p.add_argument("--backends", default="", help=f"comma-separated, of {', '.join(BACKENDS)} (default: all); the "
                   "chains' unfused naive, RA+MLA's SDPA peer and the bound's run are always run")
    p.add_argument("--shapes", default="", help="comma-separated shape names (--list); default: every shape on a "
                   "GPU, `tiny` without one")
    p.add_argument("--quick", action="store_true", help="one shape per op")
    p.add_argument("--chunk-sizes", default="", help="token mixers: run each backend at these chunk sizes, e.g. "
                   "32,64,128,256 (each where the backend supports it)")
    p.add_argument("--segments", default="2,4,8", help="state pass: split counts to time besides the op's own "
                   "choice ('' for that alone)")
    p.add_argument("--seq-lens", default="2048,4096,8192", help="RA+MLA: the sequence lengths (shapes T<len>)")
    p.add_argument("--profile", action="store_true", help="also torch.profiler's kernel table and summed kernel "
                   "time per timed row (5 fwd+bwd steps after 3)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder for the results (default {DEFAULT_OUT})")
    p.add_argument("--name", default="", help="file stem of <out>/<name>.{md,json,png} (default: ops-<ops>)")
    p.add_argument("--list", action="store_true", help="print the case registry and exit")
    args = p.parse_args(argv)
    if args.list:
        for c in registry(ints(args.seq_lens, "--seq-lens", p)):
            print(f"{c.op:<15} {c.shape:<14} " + " ".join(f"{k}={v}" for k, v in {**c.dims, **c.knobs}.items()))
        return []
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if unknown := sorted(set(backends) - set(BACKENDS)):
        p.error(f"unknown backend(s) {', '.join(unknown)}; backends: {', '.join(BACKENDS)}")
    cases = select(args, p)
    opts = Options(backends, ints(args.chunk_sizes, "--chunk-sizes", p), ints(args.segments, "--segments", p),
                   torch.bfloat16 if on_gpu() else torch.float32)
    device = torch.device("cuda" if on_gpu() else "cpu")
    notes = [n for n in [force_fla_backward()] if n]
    if not on_gpu():
        notes.append("no GPU: fp32 under Triton's interpreter; the checks hold, the times are the interpreter's")
    env = environment(device)
    ops = list(dict.fromkeys(c.op for c in cases))
    stem = args.out / (args.name or "ops-" + "-".join(ops or ["none"]))
    stem.parent.mkdir(parents=True, exist_ok=True)
    command = "python scripts/bench_ops.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    rows: list[dict] = []
    for case in cases:
        for r in run_case(case, opts, device, args.profile):
            rows.append(r)
            print(f"{r['op']:<14} {r['shape']:<14} {r['variant']:<34} {r['status']:<5} "
                  + (f"fwd {r['fwd_ms']:.4g} ms" + "".join(f"  {k[:-3]} {r[k]:.4g} ms" for k in ("fwdbwd_ms", "bwd_ms")
                                                           if k in r) + f"  {r.get('check', '')}"
                     if r["status"] == "ok" else r.get("check") or r.get("why", "")), flush=True)
        write(rows, env, command.strip(), notes, stem)
    if not cases:
        write(rows, env, command.strip(), notes, stem)
    print(stem.with_suffix(".md").read_text())
    return rows


if __name__ == "__main__":
    main()
