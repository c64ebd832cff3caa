"""Packed documents (cu_seqlens): a packed row equals its documents run one by one, output, final state and every
gradient, on every backend (naive, fla; chunk and fused against naive's documents run alone, in the chunk-aligned
layout with per-chunk resets); the Triton backends that still lack packing (attention, ramla fused) refuse it with
an error naming op, backend and remedy. Tolerance: relative RMS ‖a − b‖/‖b‖ ≤ 1e-5 in fp32 (the two sides run the
same fp32 arithmetic in a different order). Whatever may run a Triton kernel runs on the `device` fixture (the GPU
when present: fla's cells need it), the rest on the CPU."""
from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch

from ops import BackendError
from ops.gated_delta import naive as gdn_naive
from ops.gla import naive as gla_naive
from ops.ssd import naive as ssd_naive

C = 16
# shorter than a chunk, exactly one, length 1, spanning two chunk boundaries, ragged
LENGTHS = [5, C, 1, 2 * C + 3, 7]
TOL = 1e-5
TF32_TOL = 4 * 2.0 ** -11       # four TF32 unit roundoffs: fla's fp32 dots round their operands to TF32


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def fla_ready() -> bool:
    return importlib.util.find_spec("fla") is not None and torch.cuda.is_available()


@pytest.fixture
def first_config_only(monkeypatch):
    """Triton's autotuner runs each kernel's first config instead of benchmarking them all: fla's kernels autotune
    every new shape (minutes for one cell's dozen kernels), and its results must hold for every config."""
    from triton.runtime import autotuner

    prune = autotuner.Autotuner.prune_configs
    monkeypatch.setattr(autotuner.Autotuner, "prune_configs", lambda self, kwargs: prune(self, kwargs)[:1])


# op → (naive module, fn name, recurrent oracle, make_inputs shape, sequence-indexed inputs, state shape)
OPS = {
    "gla": (gla_naive, gla_naive.gla_recurrent, dict(B=1, H=2, K=8, V=4), ("q", "k", "v", "gk"), (2, 8, 4)),
    "ssd": (ssd_naive, ssd_naive.ssd_recurrent, dict(B=1, H=2, P=4, G=1, N=8), ("x", "dt", "B", "C"), (2, 8, 4)),
    "gated_delta": (gdn_naive, gdn_naive.gated_delta_recurrent, dict(B=1, H=2, K=8, V=4),
                    ("q", "k", "v", "g", "beta"), (2, 8, 4)),
}


# fla's kernels take tl.dot over head dimensions, which Triton needs ≥ 16 (at V = 4 its GLA backward does not compile)
FLA_DIM = 16
FLA_HEAD_DIMS = {"gla": ("K", "V"), "ssd": ("P", "N"), "gated_delta": ("K", "V")}


def backend_fn(op: str, backend: str):
    """op's function on one backend (naive at chunk size C, its step-by-step recurrence, or fla at 64)."""
    mod, recurrent = OPS[op][:2]
    if backend == "naive":
        return lambda **kw: getattr(mod, op)(**kw, chunk_size=C)
    if backend == "recurrent":
        return recurrent
    fla = importlib.import_module(f"ops.{op}.fla")
    return lambda **kw: getattr(fla, op)(**kw, chunk_size=64)


def packed(fn, inputs: dict, h0: torch.Tensor | None, cu: torch.Tensor, final: bool, cotangents=None):
    """o, the final state (or None) and the gradients of every input (and h0) of fn on the packed row, under the
    cotangents (do, dS) given or fresh ones. Returns o, S, grads, cotangents."""
    o, S = fn(**inputs, initial_state=h0, output_final_state=final, cu_seqlens=cu)
    do, dS = cotangents or (torch.randn_like(o), torch.randn_like(S) if final else None)
    leaves = list(inputs.values()) + ([h0] if h0 is not None else [])
    loss = (o * do).sum() + ((S * dS).sum() if final else 0.0)
    return o, S, torch.autograd.grad(loss, leaves), (do, dS)


def alone(fn, op: str, inputs: dict, h0: torch.Tensor | None, cu: torch.Tensor, final: bool, cotangents):
    """What `packed` returns, from fn run on each document by itself (the parameters' gradients summed)."""
    seq = OPS[op][3]
    do, dS = cotangents
    leaves = list(inputs) + (["h0"] if h0 is not None else [])
    ref_o, ref_S, ref_g = [], [], [torch.zeros_like(x) for x in list(inputs.values()) + [h0] if x is not None]
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        part = {k: (x[:, a:b] if k in seq else x).detach().requires_grad_() for k, x in inputs.items()}
        s0 = h0[n:n + 1].detach().requires_grad_() if h0 is not None else None
        o_n, S_n = fn(**part, initial_state=s0, output_final_state=True)
        loss = (o_n * do[:, a:b]).sum() + ((S_n * dS[n:n + 1]).sum() if final else 0.0)
        g = torch.autograd.grad(loss, list(part.values()) + ([s0] if s0 is not None else []))
        ref_o.append(o_n)
        ref_S.append(S_n)
        for i, k in enumerate(leaves):
            if k in seq:
                ref_g[i][:, a:b] = g[i]
            elif k == "h0":
                ref_g[i][n:n + 1] = g[i]
            else:
                ref_g[i] += g[i]                                      # parameters shared by documents (SSD's A)
    return torch.cat(ref_o, 1), torch.cat(ref_S) if final else None, ref_g


def assert_matches(name: str, names: list[str], got, ref) -> None:
    o, S, grads = got
    ref_o, ref_S, ref_g = ref
    assert rel(o, ref_o) <= TOL, f"{name}: o {rel(o, ref_o):.2e}"
    assert (S is None) == (ref_S is None) and (S is None or rel(S, ref_S) <= TOL), f"{name}: final state"
    for k, g, r in zip(names, grads, ref_g):
        assert rel(g, r) <= TOL, f"{name}: d{k} {rel(g, r):.2e}"


@pytest.mark.parametrize("backend", ["naive", "recurrent", "fla"])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.usefixtures("exact_fp32_matmuls")
def test_packed_equals_documents_one_by_one(op, with_state, backend, device, request):
    """naive and the recurrence: packed equals alone within TOL. fla's fp32 kernels round their dot operands to
    TF32, so its packed and lone runs differ at that scale: the packed run must be no further from naive's
    documents alone than twice fla's own lone run, or than TF32_TOL where that is smaller; a leaked state is off
    by O(1)."""
    if backend == "fla" and not fla_ready():
        pytest.skip("fla's cells need flash-linear-attention and a CUDA GPU")
    mod, recurrent, shape, seq, state = OPS[op]
    if backend == "fla":
        request.getfixturevalue("first_config_only")
        shape, state = {**shape, **dict.fromkeys(FLA_HEAD_DIMS[op], FLA_DIM)}, (state[0], FLA_DIM, FLA_DIM)
    L, N = sum(LENGTHS), len(LENGTHS)
    inputs = mod.make_inputs({**shape, "T": L}, device=device, seed=None, decay="realistic")
    h0 = torch.randn(N, *state, device=device, requires_grad=True) if with_state else None
    cu = offsets(LENGTHS).to(device)
    fn, names = backend_fn(op, backend), list(inputs) + ["h0"]
    try:
        o, S, grads, cot = packed(fn, inputs, h0, cu, True)
        lone = alone(fn, op, inputs, h0, cu, True, cot)
    except RuntimeError as e:
        if backend == "fla" and "3.7.1" in str(e):             # its gated backward on Hopper (fla issue #640)
            pytest.skip(f"fla refuses this backward here: {str(e).splitlines()[0]}")
        raise
    if backend != "fla":
        assert_matches(backend, names, (o, S, grads), lone)
        return
    truth = alone(backend_fn(op, "naive"), op, inputs, h0, cu, True, cot)
    for k, got, own, ref in zip(["o", "S"] + names, [o, S, *grads], [lone[0], lone[1], *lone[2]],
                                [truth[0], truth[1], *truth[2]]):
        bound = max(2 * rel(own, ref), TF32_TOL)
        assert rel(got, ref) <= bound, f"fla {k}: packed {rel(got, ref):.2e}, alone {rel(own, ref):.2e}"


def triton_fns(op: str) -> dict:
    """The chunk and fused backends of op as functions of its keyword arguments (chunk size bound)."""
    from ops.gated_delta import chunk as gdn_chunk, fused as gdn_fused
    from ops.gla import chunk as gla_chunk, fused as gla_fused
    from ops.ssd import chunk as ssd_chunk, fused as ssd_fused

    mods = {"gla": (gla_chunk, gla_fused), "ssd": (ssd_chunk, ssd_fused), "gated_delta": (gdn_chunk, gdn_fused)}[op]
    return {"chunk": getattr(mods[0], op), "fused": getattr(mods[1], op)}


# (op, backend, chunk size, per-document initial state, final state, lengths, scan forward): every state pass
# with its reset once with and once without an initial state. GLA fused: the one-launch scan and the parallel
# stages (scan forward False), and C = 128, whose 64-row sub-blocks put a document start inside a kept-state
# interval (the backward's seeded recompute restarts there: lengths 70, 1, 60 → sub-blocks 0-1, 2, 3).
TRITON_CELLS = [("gla", "chunk", C, True, True, LENGTHS, None), ("gla", "fused", C, False, True, LENGTHS, True),
                ("gla", "fused", C, True, False, LENGTHS, False), ("gla", "fused", 128, True, True, [70, 1, 60], True),
                ("ssd", "chunk", C, False, True, LENGTHS, None), ("ssd", "fused", C, True, True, LENGTHS, None),
                ("gated_delta", "chunk", C, True, True, LENGTHS, None),
                ("gated_delta", "fused", C, False, False, LENGTHS, None)]


@pytest.mark.parametrize("cell", TRITON_CELLS, ids=lambda c: "{}-{}-C{}{}{}{}".format(
    *c[:3], "-h0" if c[3] else "", "-ht" if c[4] else "", {True: "-scan", False: "-stages", None: ""}[c[6]]))
def test_triton_packed_equals_naive_documents(cell, device, poison_empty, monkeypatch):
    """chunk and fused on a packed row against naive on each document alone: documents shorter than a chunk,
    exactly one, of one token, spanning chunk boundaries; o, the final states and every gradient within 1e-5."""
    op, backend, chunk_size, with_h0, final, lengths, scan = cell
    if scan is not None:
        monkeypatch.setattr("ops.gla.fused.scan_forward", lambda *a: scan)
    mod, _, shape, _, state = OPS[op]
    if chunk_size > C:
        shape = {**shape, "H": 1}                                   # the long cell at one head: interpreter time
        state = (1, *state[1:])
    cu, N = offsets(lengths).to(device), len(lengths)
    inputs = mod.make_inputs({**shape, "T": sum(lengths)}, seed=None, decay="realistic", device=device)
    h0 = torch.randn(N, *state, device=device, requires_grad=True) if with_h0 else None
    fn = triton_fns(op)[backend]
    o, S, grads, cot = packed(lambda **kw: fn(**kw, chunk_size=chunk_size), inputs, h0, cu, final)
    ref = alone(lambda **kw: getattr(mod, op)(**kw, chunk_size=C), op, inputs, h0, cu, final, cot)
    assert_matches(f"{op} {backend}", list(inputs) + ["h0"], (o, S, grads), ref)


@pytest.mark.parametrize("op, backend", [("gla", "chunk"), ("gla", "fused"), ("gated_delta", "chunk")])
def test_without_resets_the_documents_leak(op, backend, device, monkeypatch):
    """The test above can fail: with the layout's reset flags dropped (every chunk continuing the first document),
    each state pass (chunkwise, GLA's scan, the delta rule's) carries state across documents and o is far off
    (with them, the same call is within 1e-5: test_triton_packed_equals_naive_documents)."""
    from ops import varlen

    mod, _, shape, _, _ = OPS[op]
    cu = offsets(LENGTHS).to(device)
    inputs = mod.make_inputs({**shape, "T": sum(LENGTHS)}, seed=None, decay="near0", device=device,
                             requires_grad=False)
    ref = torch.cat([getattr(mod, op)(**{k: (x[:, a:b] if k in OPS[op][3] else x) for k, x in inputs.items()},
                                      chunk_size=C)[0] for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())], 1)
    fn = triton_fns(op)[backend]
    layout = varlen.chunk_layout
    monkeypatch.setattr(varlen, "chunk_layout", lambda *a: (*layout(*a)[:2], {0: 0}, layout(*a)[3]))
    assert rel(fn(**inputs, chunk_size=C, cu_seqlens=cu)[0], ref) > 1e-2


@pytest.mark.parametrize("op", list(OPS))
def test_packed_rejects_batches_and_bad_offsets(op):
    mod, _, shape, _, _ = OPS[op]
    inputs = mod.make_inputs({**shape, "B": 2, "T": 8}, requires_grad=False)
    with pytest.raises(ValueError, match="one row"):
        getattr(mod, op)(**inputs, cu_seqlens=offsets([8]))
    inputs = mod.make_inputs({**shape, "T": 8}, requires_grad=False)
    with pytest.raises(ValueError, match="rise strictly from 0 to T = 8"):
        getattr(mod, op)(**inputs, cu_seqlens=offsets([3, 3]))


def test_short_conv_and_proj_in_chains_restart_at_documents():
    from ops.gdn_proj_in import naive as gdn_in
    from ops.mamba2_proj_in import naive as m2_in

    cu, L = offsets(LENGTHS), sum(LENGTHS)
    pairs = ((gdn_in.gdn_proj_in, gdn_in.make_inputs(dict(B=1, T=L, d=16, H=2, K=8, V=4, W=4), seed=None), "x"),
             (m2_in.mamba2_proj_in, m2_in.make_inputs(dict(B=1, T=L, d=16, d_inner=8, d_state=4, H=2, W=4),
                                                      seed=None), "u"))
    for fn, inputs, xname in pairs:
        outs = fn(**inputs, cu_seqlens=cu)
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            alone = fn(**{**inputs, xname: inputs[xname][:, a:b]})
            for got, ref in zip(outs, alone):
                assert rel(got[:, a:b], ref) <= TOL, fn.__name__


def test_attention_and_ramla_stay_inside_documents():
    from ops.attention import naive as att
    from ops.ramla import naive as ramla

    cu, L = offsets(LENGTHS), sum(LENGTHS)
    qkv = att.make_inputs(dict(B=1, T=L, H=2, D=8), seed=None, requires_grad=False)
    for fn in (att.attention, att.attention_reference):
        o = fn(**qkv, cu_seqlens=cu)
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            ref = fn(**{k: (v[:, a:b] if torch.is_tensor(v) else v) for k, v in qkv.items()})
            assert rel(o[:, a:b], ref) <= TOL
    for alpha in (0.5, None):
        inputs = ramla.make_inputs(dict(B=1, T=L, H=2, D=8, L=4, W=3), seed=None, requires_grad=False, alpha=alpha)
        o = ramla.ramla(**inputs, cu_seqlens=cu)
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            part = {k: (v[:, a:b] if k in ("q", "k_lat", "v_lat") else v) for k, v in inputs.items()}
            assert rel(o[:, a:b], ramla.ramla(**part)) <= TOL, alpha


def triton_refusals(device: str) -> list[tuple[str, str, object, dict]]:
    """(op, backend, function, its inputs on `device`): every Triton entry point that takes cu_seqlens and has no
    packed path."""
    from ops.attention import fused as att_fused, naive as att
    from ops.ramla import fused as ramla_fused, naive as ramla

    return [("attention", "fused", att_fused.attention, att.make_inputs(dict(B=1, T=8, H=1, D=64), device=device)),
            ("ramla", "fused", ramla_fused.ramla,
             ramla.make_inputs(dict(B=1, T=8, H=1, D=16, L=16, W=2), device=device))]


def test_triton_backends_refuse_packed_documents(device):
    for op, backend, fn, inputs in triton_refusals(device):
        with pytest.raises(BackendError, match=f"op '{op}', backend '{backend}'.*cu_seqlens.*--backend naive or "
                                               "fla.*--data.varlen=false"):
            fn(**inputs, cu_seqlens=offsets([3, 5]).to(device))


@pytest.mark.parametrize("head_dim, bias", [(None, True), (8, False)])
def test_fused_short_conv_restarts_at_documents(head_dim, bias, device, poison_empty):
    """The fused short conv on a packed row against short_conv_ref on each document alone: y, dx, dweight, dbias
    (W = 4 > the one-token document; documents end inside the kernels' 8-row blocks)."""
    from ops.proj.short_conv import short_conv, short_conv_ref

    cu, L, Cc = offsets(LENGTHS).to(device), sum(LENGTHS), 24
    x = torch.randn(1, L, Cc, device=device, requires_grad=True)
    w = torch.randn(Cc, 4, device=device, requires_grad=True)
    b = torch.randn(Cc, device=device, requires_grad=True) if bias else None
    leaves = [x, w] + ([b] if bias else [])
    y = short_conv(x, w, b, head_dim=head_dim, cu_seqlens=cu)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad((y * dy).sum(), leaves)
    ref_y, ref_g = [], [torch.zeros_like(t) for t in leaves]
    for a_, b_ in zip(cu[:-1].tolist(), cu[1:].tolist()):
        y_n = short_conv_ref(x[:, a_:b_], w, b, head_dim=head_dim)
        g = torch.autograd.grad((y_n * dy[:, a_:b_]).sum(), leaves)
        ref_y.append(y_n)
        ref_g = [r + gi for r, gi in zip(ref_g, g)]
    assert rel(y, torch.cat(ref_y, 1)) <= TOL
    for name, got, ref in zip(("x", "weight", "bias"), grads, ref_g):
        assert rel(got, ref) <= TOL, name


def test_fused_proj_in_chains_restart_at_documents(device):
    """gdn_proj_in and mamba2_proj_in fused on a packed row: every output and every gradient (x, the projection
    and conv weights, A_log, dt_bias) as naive's packed chain (itself checked against documents alone above)."""
    from ops.gdn_proj_in import fused as gdn_fused, naive as gdn_in
    from ops.mamba2_proj_in import fused as m2_fused, naive as m2_in

    cu, L = offsets(LENGTHS).to(device), sum(LENGTHS)
    cases = ((gdn_in.gdn_proj_in, gdn_fused.gdn_proj_in,
              gdn_in.make_inputs(dict(B=1, T=L, d=16, H=2, K=8, V=4, W=4), seed=None, device=device)),
             (m2_in.mamba2_proj_in, m2_fused.mamba2_proj_in,
              m2_in.make_inputs(dict(B=1, T=L, d=16, d_inner=8, d_state=4, H=2, W=4), seed=None, device=device)))
    for ref_fn, fn, inputs in cases:
        leaves = {k: t for k, t in inputs.items() if torch.is_tensor(t) and t.requires_grad}
        outs, refs = fn(**inputs, cu_seqlens=cu), ref_fn(**inputs, cu_seqlens=cu)
        cots = [torch.randn_like(o) for o in refs]
        grads = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs, cots)), list(leaves.values()))
        ref_grads = torch.autograd.grad(sum((o * c).sum() for o, c in zip(refs, cots)), list(leaves.values()))
        for got, ref in zip(outs, refs):
            assert rel(got, ref) <= TOL, fn.__name__
        for k, got, ref in zip(leaves, grads, ref_grads):
            assert rel(got, ref) <= TOL, f"{fn.__name__}: d{k}"
