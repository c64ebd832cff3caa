"""Packed documents (cu_seqlens): a packed row equals its documents run one by one, output, final state and every
gradient, on every backend that supports packing; the Triton backends refuse it with an error naming op, backend
and remedy. Tolerance: relative RMS ‖a − b‖/‖b‖ ≤ 1e-5 in fp32 (the two sides run the same fp32 arithmetic in a
different order). Whatever may run a Triton kernel runs on the `device` fixture (the GPU when present: fla's cells
need it), the rest on the CPU."""
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


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def fla_ready() -> bool:
    return importlib.util.find_spec("fla") is not None and torch.cuda.is_available()


# op → (naive module, fn name, recurrent oracle, make_inputs shape, sequence-indexed inputs, state shape)
OPS = {
    "gla": (gla_naive, gla_naive.gla_recurrent, dict(B=1, H=2, K=8, V=4), ("q", "k", "v", "gk"), (2, 8, 4)),
    "ssd": (ssd_naive, ssd_naive.ssd_recurrent, dict(B=1, H=2, P=4, G=1, N=8), ("x", "dt", "B", "C"), (2, 8, 4)),
    "gated_delta": (gdn_naive, gdn_naive.gated_delta_recurrent, dict(B=1, H=2, K=8, V=4),
                    ("q", "k", "v", "g", "beta"), (2, 8, 4)),
}


def backend_fns(op: str) -> list[tuple[str, object]]:
    mod, recurrent = OPS[op][:2]
    fns = [("naive", lambda **kw: getattr(mod, op)(**kw, chunk_size=C)), ("recurrent", recurrent)]
    if fla_ready():
        fla = importlib.import_module(f"ops.{op}.fla")
        fns.append(("fla", lambda **kw: getattr(fla, op)(**kw, chunk_size=64)))
    return fns


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.usefixtures("exact_fp32_matmuls")
def test_packed_equals_documents_one_by_one(op, with_state, device):
    mod, recurrent, shape, seq, state = OPS[op]
    L, N = sum(LENGTHS), len(LENGTHS)
    inputs = mod.make_inputs({**shape, "T": L}, device=device, seed=None, decay="realistic")
    h0 = torch.randn(N, *state, device=device, requires_grad=True) if with_state else None
    cu = offsets(LENGTHS).to(device)
    for name, fn in backend_fns(op):
        o, S = fn(**inputs, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        do, dS = torch.randn_like(o), torch.randn_like(S)
        leaves = list(inputs.values()) + ([h0] if with_state else [])
        grads = torch.autograd.grad((o * do).sum() + (S * dS).sum(), leaves)
        ref_o, ref_S, ref_g = [], [], [torch.zeros_like(x) for x in leaves]
        for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
            part = {k: (x[:, a:b] if k in seq else x).detach().requires_grad_() for k, x in inputs.items()}
            s0 = h0[n:n + 1].detach().requires_grad_() if with_state else None
            o_n, S_n = fn(**part, initial_state=s0, output_final_state=True)
            g = torch.autograd.grad((o_n * do[:, a:b]).sum() + (S_n * dS[n:n + 1]).sum(),
                                    list(part.values()) + ([s0] if with_state else []))
            ref_o.append(o_n)
            ref_S.append(S_n)
            for i, k in enumerate(list(inputs) + (["h0"] if with_state else [])):
                if k in seq:
                    ref_g[i][:, a:b] = g[i]
                elif k == "h0":
                    ref_g[i][n:n + 1] = g[i]
                else:
                    ref_g[i] += g[i]                                  # parameters shared by documents (SSD's A)
        assert rel(o, torch.cat(ref_o, 1)) <= TOL, name
        assert rel(S, torch.cat(ref_S)) <= TOL, name
        for k, got, ref in zip(list(inputs) + ["h0"], grads, ref_g):
            assert rel(got, ref) <= TOL, f"{name}: d{k}"


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
    """(op, backend, function, its inputs on `device`): every Triton entry point that takes cu_seqlens."""
    from ops.attention import fused as att_fused, naive as att
    from ops.gated_delta import chunk as gdn_chunk, fused as gdn_fused
    from ops.gdn_proj_in import fused as gdn_in_fused, naive as gdn_in
    from ops.gla import chunk as gla_chunk, fused as gla_fused
    from ops.mamba2_proj_in import fused as m2_fused, naive as m2_in
    from ops.proj.short_conv import short_conv
    from ops.ramla import fused as ramla_fused, naive as ramla
    from ops.ssd import chunk as ssd_chunk, fused as ssd_fused

    gla_in = gla_naive.make_inputs(dict(B=1, T=8, H=1, K=16, V=16), device=device, requires_grad=False)
    ssd_in = ssd_naive.make_inputs(dict(B=1, T=8, H=1, P=16, G=1, N=16), device=device, requires_grad=False)
    gdn_in_ = gdn_naive.make_inputs(dict(B=1, T=8, H=1, K=16, V=16), device=device, requires_grad=False)
    return [("gla", "chunk", gla_chunk.gla, gla_in), ("gla", "fused", gla_fused.gla, gla_in),
            ("gla", "fused", gla_fused.build(frozenset({"state"})), gla_in),
            ("ssd", "chunk", ssd_chunk.ssd, ssd_in), ("ssd", "fused", ssd_fused.ssd, ssd_in),
            ("gated_delta", "chunk", gdn_chunk.gated_delta, gdn_in_),
            ("gated_delta", "fused", gdn_fused.gated_delta, gdn_in_),
            ("gdn_proj_in", "fused", gdn_in_fused.gdn_proj_in,
             gdn_in.make_inputs(dict(B=1, T=8, d=16, H=1, K=16, V=16, W=4), device=device, requires_grad=False)),
            ("mamba2_proj_in", "fused", m2_fused.mamba2_proj_in,
             m2_in.make_inputs(dict(B=1, T=8, d=16, d_inner=16, d_state=8, H=1, W=4), device=device,
                               requires_grad=False)),
            ("short_conv", "fused", short_conv,
             dict(x=torch.randn(1, 8, 16, device=device), weight=torch.randn(16, 4, device=device))),
            ("attention", "fused", att_fused.attention, att.make_inputs(dict(B=1, T=8, H=1, D=64), device=device)),
            ("ramla", "fused", ramla_fused.ramla,
             ramla.make_inputs(dict(B=1, T=8, H=1, D=16, L=16, W=2), device=device))]


def test_triton_backends_refuse_packed_documents(device):
    for op, backend, fn, inputs in triton_refusals(device):
        with pytest.raises(BackendError, match=f"op '{op}', backend '{backend}'.*cu_seqlens.*--backend naive or "
                                               "fla.*--data.varlen=false"):
            fn(**inputs, cu_seqlens=offsets([3, 5]).to(device))
