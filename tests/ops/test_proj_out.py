"""The fused output projection (ops/proj_out/fused.py) against its naive oracle: the output and
the gradient of every input (o, r, the norm weight, W_o, the residual), in both orderings of the norm and
the gate (GLA's norm first, Mamba-2's gate_first); fp32 under the Triton interpreter at ragged sizes, bf16 on
the GPU at the seed's and the models' shapes; the registry and model wiring; saved memory."""
from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
import torch.nn.functional as F

from ops import BackendError, get_op, parse_fuse
from ops.proj_out import fused, naive
from tests.helpers import assert_proj_model_equals_naive_fp32, rel_err, saved_bytes

# every test: the fp32 oracle without TF32 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("exact_fp32_matmuls")

NAMES = ["o", "r", "norm_weight", "w_o", "residual"]


def make_inputs(B, T, H, V, d, residual=True, device="cpu", dtype=torch.float32, seed=0):
    """o (the mixer output), r (x W_r, before its SiLU), the norm weight (not all ones: its gradient matters), W_o
    and the residual (None without) from the op's builder (ops.proj_out.naive.make_inputs), fp32 leaves."""
    kw = naive.make_inputs(dict(B=B, T=T, H=H, V=V, d=d), dtype, device, seed=seed, residual=residual)
    return [kw[n] for n in NAMES]


def run(fn, inputs, dy):
    """The output and the gradients of every input that has one."""
    y = fn(*inputs)
    have = [x for x in inputs if x is not None]
    return y, dict(zip([n for n, x in zip(NAMES, inputs) if x is not None], torch.autograd.grad(y, have, dy)))


# (B, T, H, V, d, residual). Under the interpreter (fused.INTERPRET_*) the GEMM's tiles are 16×16×16 and the
# elementwise kernels take 64 elements per step, two steps per backward program: B·T, d and K = H·V ragged
# against them; V = 24, 20 and 40 (not powers of two) pad a head with masked channels; V = 64 is one head-row
# per step; V = 96 and 40 with H = 1 are Mamba-2's case (one head of V = d_inner channels) in miniature: a
# head wider than the step (BR = 1; on the GPU, V = 2048 gives two rows a step), 96 also padded to 128.
# There is no K here (the op sees only V), so K ≠ V is the model test's business. Each shape runs in both
# orderings.
SHAPES = [(2, 37, 2, 16, 40, True), (1, 21, 1, 32, 24, True), (2, 19, 3, 64, 33, False), (1, 5, 2, 16, 16, True),
          (1, 9, 1, 24, 40, True), (2, 7, 3, 20, 17, False), (2, 13, 1, 40, 24, True), (1, 11, 1, 96, 20, False)]
ORDER = {"norm-first": False, "gate-first": True}


@pytest.mark.parametrize("order", ORDER)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}V{}d{}{}".format(*s[:5], "" if s[5] else "-nores"))
def test_fused_matches_naive_fp32(shape, order, device, poison_empty):
    """fp32 with exact dots (input_precision ieee): the output and every gradient within 1e-5."""
    *dims, residual = shape
    inputs = make_inputs(*dims, residual=residual, device=device)
    dy = torch.randn(*dims[:2], dims[4], device=device)
    ref_y, ref_g = run(lambda *a: naive.proj_out(*a, gate_first=ORDER[order]), inputs, dy)
    y, grads = run(lambda *a: fused.proj_out(*a, gate_first=ORDER[order]), inputs, dy)
    assert y.dtype == ref_y.dtype and y.shape == ref_y.shape
    assert rel_err(y, ref_y) < 1e-5
    for name, ref in ref_g.items():
        assert rel_err(grads[name], ref) < 1e-5, name


@pytest.mark.parametrize("shape", [(1, 9, 2, 16, 24), (2, 13, 1, 40, 24)], ids=lambda s: "B{}T{}H{}V{}d{}".format(*s))
def test_the_orderings_differ(shape, device):
    """The two orderings are far apart (in the output and every gradient) next to the 1e-5 above, so a
    kernel that ignored or swapped gate_first fails the test above; and the oracle's gate-first
    ordering is Mamba-2's own chain, model.common.RMSNorm of o ⊙ silu(r), op for op."""
    from model.common import RMSNorm

    B, T, H, V, d = shape
    inputs = make_inputs(B, T, H, V, d, device=device)
    dy = torch.randn(B, T, d, device=device)
    first_y, first_g = run(lambda *a: naive.proj_out(*a, gate_first=True), inputs, dy)
    after_y, after_g = run(lambda *a: naive.proj_out(*a, gate_first=False), inputs, dy)
    res = inputs[4]
    assert rel_err(after_y - res, first_y - res) > 1e-2
    for name, ref in first_g.items():
        if name != "residual":                        # dy in both
            assert rel_err(after_g[name], ref) > 1e-2, name
    o, r, nw, w, _ = inputs
    norm = RMSNorm(V, 1e-6).to(device)
    norm.weight.data.copy_(nw.detach())
    model_y = res + F.linear(norm(o * F.silu(r.view(B, T, H, V))).reshape(B, T, H * V), w)
    assert torch.equal(model_y, first_y)


@pytest.mark.parametrize("order", ORDER)
def test_eps_reaches_the_kernels(order, device):
    """A small-magnitude head, where eps is most of the mean square: a dropped or doubled eps shows."""
    o, r, nw, w, res = make_inputs(1, 7, 2, 16, 16, device=device)
    o = (o.detach() * 1e-3).requires_grad_()
    kw = dict(eps=1e-6, gate_first=ORDER[order])
    y, grads = run(lambda *a: fused.proj_out(*a, **kw), [o, r, nw, w, res], dy := torch.randn_like(res))
    ref_y, ref_g = run(lambda *a: naive.proj_out(*a, **kw), [o, r, nw, w, res], dy)
    assert rel_err(y - res, ref_y - res) < 1e-5 and rel_err(grads["o"], ref_g["o"]) < 1e-5
    assert rel_err(grads["r"], ref_g["r"]) < 1e-5 and rel_err(grads["norm_weight"], ref_g["norm_weight"]) < 1e-5


def test_backends_share_one_signature():
    """naive and fused take the same arguments, gate_first keyword-only in both."""
    sig = inspect.signature(naive.proj_out)
    assert sig == inspect.signature(fused.proj_out)
    assert sig.parameters["gate_first"].kind is inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["gate_first"].default is False


def test_saves_less_than_the_unfused_chain(device):
    """The fused op keeps o and r for its backward (and recomputes g from them); PyTorch's chain keeps more."""
    def saved(fn):
        inputs = make_inputs(2, 32, 2, 16, 32, device=device)
        return saved_bytes(lambda: fn(*inputs))

    act = 2 * 32 * 2 * 16 * 4                         # one [B, T, H·V] fp32 tensor
    fused_bytes, naive_bytes = saved(fused.proj_out), saved(naive.proj_out)
    assert fused_bytes <= 2 * act + 2 * 32 * 16 * 4 + 16 * 4, fused_bytes    # o, r (+ the weights it holds)
    assert fused_bytes < naive_bytes, (fused_bytes, naive_bytes)


@pytest.mark.parametrize("order", ORDER)
def test_r_read_in_place_from_a_wider_output(order, device, poison_empty):
    """r as Gated DeltaNet and Mamba-2 pass it, a column slice of their input projection's output: the same
    output and gradients as a contiguous r, and the backward keeps that output, not a copy of r."""
    B, T, H, V, d = 2, 13, 3, 16, 24
    o, r, nw, w, res = make_inputs(B, T, H, V, d, device=device)
    wide = torch.randn(B, T, 7 + H * V + 5, device=device, requires_grad=True)      # [.., q | r | β] in miniature
    r_view = wide[..., 7:7 + H * V]
    assert not r_view.is_contiguous()
    dy = torch.randn(B, T, d, device=device)
    ref_y, ref_g = run(lambda *a: fused.proj_out(*a, gate_first=ORDER[order]), [o, r_view.detach().contiguous()
                                                                               .requires_grad_(), nw, w, res], dy)
    y, grads = run(lambda *a: fused.proj_out(*a, gate_first=ORDER[order]), [o, r_view, nw, w, res], dy)
    assert rel_err(y, ref_y) < 1e-6 and all(rel_err(grads[n], ref_g[n]) < 1e-6 for n in ref_g)
    kept = []

    def pack(t):
        kept.append(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fused.proj_out(o, r_view, nw, w, res, gate_first=ORDER[order])
    assert wide.untyped_storage().data_ptr() in kept      # r itself, from inside `wide`: no copy saved


def test_int32_overflow_is_refused():
    """Shapes whose flat offsets overflow int32 are refused before anything runs (meta tensors: no memory)."""
    o, r = torch.empty(64, 8192, 16, 256, device="meta"), torch.empty(64, 8192, 4096, device="meta")
    w, nw = torch.empty(4096, 4096, device="meta"), torch.empty(256, device="meta")
    with pytest.raises(BackendError, match="op 'proj_out', backend 'fused': .*int32.*--fuse"):
        fused.proj_out(o, r, nw, w)


def test_gemm_autotune_is_small_and_ignores_rows():
    """≤ 6 GEMM configs, keyed on d and H·V (and the residual switch), never on B·T."""
    assert len(fused.GEMM_CONFIGS) <= 6
    assert set(fused._gemm_tuned.keys) == {"N", "K", "HAS_RES"}


def test_registry_and_model_wiring():
    """`--backend fused` (all components) and `--fuse proj` give GLA the fused op and log it; other
    choices keep the naive chain and do not log it; a family without the component refuses it."""
    from model import build_model
    from model.config import ModelConfig

    assert get_op("proj_out", "fused") is fused.proj_out
    assert get_op("proj_out", "fused", parse_fuse("proj")) is fused.proj_out
    with pytest.raises(BackendError, match="op 'proj_out'.*no fused chunk component"):
        get_op("proj_out", "fused", parse_fuse("chunk"))
    cfg = ModelConfig(family="gla", d_model=32, n_layers=1, n_heads=2, head_k_dim=8, head_v_dim=16, vocab_size=64)
    cases = {("fused", None): ("fused[chunk,state]", fused.proj_out), ("fused", "proj"): ("fused[]", fused.proj_out),
             ("fused", "chunk,state"): ("fused[chunk,state]", naive.proj_out), ("chunk", None): ("chunk", naive.proj_out),
             ("naive", None): ("naive", naive.proj_out)}
    for (backend, fuse), (gla_label, proj) in cases.items():
        model = build_model(dataclasses.replace(cfg, backend=backend, fuse=fuse))
        mixer = model.blocks[0].mixer
        assert mixer.proj_out is proj, (backend, fuse)
        logged = dict((op, b) for _, op, b in model.backends())
        # the input side (ops/proj_in) is resolved and logged with it (tests/ops/test_proj_in.py checks its op)
        fused_proj = {"proj_in": "fused[proj]", "proj_out": "fused[proj]"}
        want = {"gla": gla_label, **(fused_proj if proj is fused.proj_out else {})}
        assert logged == want, (backend, fuse, logged)
    with pytest.raises(BackendError, match="backend is 'chunk'.*--backend fused"):
        build_model(dataclasses.replace(cfg, backend="chunk", fuse="proj"))
    with pytest.raises(BackendError, match="op 'attention' \\(gpt2\\).*'proj' component.*drop it from --fuse"):
        build_model(ModelConfig(family="gpt2", d_model=32, n_layers=1, n_heads=2, vocab_size=64, backend="fused",
                                fuse="proj"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fp32 model check runs on CPU")
def test_gla_model_with_fused_proj_equals_naive_fp32():
    """A GLA model with only `proj` fused against the naive model (tests.helpers). K ≠ V, T ragged."""
    from model.config import ModelConfig

    assert_proj_model_equals_naive_fp32(ModelConfig(family="gla", vocab_size=61, n_layers=2, mlp_hidden=64, d_model=32,
                                                    n_heads=2, head_k_dim=8, head_v_dim=16, gate_low_rank=4), 23)


# ---- the GPU: bf16 at the seed's shape, GLA-340M's (V = 256: 16-row elementwise tiles) and GLA-125M's; ----
# Mamba-2-370M's gate-first output side (one head of V = d_inner = 2048: two-row tiles, 32-row backward
# programs) and Mamba-2-130M's (V = 1536, padded to 2048). (B, T, H, V, d, gate_first)
GPU_SHAPES = {"seed_B8T4096H16V128": (8, 4096, 16, 128, 2048, False),
              "gla340m_B8T2048H4V256": (8, 2048, 4, 256, 1024, False),
              "gla125m_B8T2048H12V64": (8, 2048, 12, 64, 768, False),
              "ragged_B1T1000H3V64d200": (1, 1000, 3, 64, 200, False),
              "mamba2_370m_B8T2048H1V2048d1024_gatefirst": (8, 2048, 1, 2048, 1024, True),
              "mamba2_130m_B4T1000H1V1536d768_gatefirst": (4, 1000, 1, 1536, 768, True)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 at full shapes needs a CUDA GPU")
@pytest.mark.parametrize("name", list(GPU_SHAPES))
def test_fused_matches_naive_bf16_gpu(name):
    """Under bf16 autocast, as the model runs (fp32 residual stream), against the fp32 naive op. Bound:
    twice PyTorch's own bf16 error on the same chain (naive under the same autocast) plus 1e-3 of
    rounding slack, for the output and every gradient."""
    B, T, H, V, d, gate_first = GPU_SHAPES[name]
    inputs = make_inputs(B, T, H, V, d, device="cuda")
    dy = torch.randn(B, T, d, device="cuda")
    nv, fu = (lambda *a: op.proj_out(*a, gate_first=gate_first) for op in (naive, fused))
    ref_y, ref_g = run(nv, inputs, dy)                                 # fp32, no TF32 in the naive linear
    with torch.autocast("cuda", dtype=torch.bfloat16):
        nb_y, nb_g = run(nv, inputs, dy)
        y, grads = run(fu, inputs, dy)
    assert y.dtype == nb_y.dtype == torch.float32
    errs = {"out": (rel_err(y, ref_y), rel_err(nb_y, ref_y))}
    errs |= {n: (rel_err(grads[n], ref_g[n]), rel_err(nb_g[n], ref_g[n])) for n in ref_g}
    bad = {n: e for n, e in errs.items() if not e[0] <= 2 * e[1] + 1e-3}
    assert not bad, f"(fused, naive bf16) errors: {errs}"
