"""The token mixers (gla, ssd, gated_delta) and the state pass alone (`state`): their FLOP formulas, the
data-movement model's floor, and each case's runs and oracle from the op's builder."""
from __future__ import annotations

import importlib
import math

import torch

from bench.cases import Case, Options, Run, backend_or_reason, fp32_copies, selected
from ops import BackendError, get_op, require_fla

STATE_C = 64


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
