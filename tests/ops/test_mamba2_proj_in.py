"""Mamba-2's fused input side (ops/mamba2_proj_in/fused.py) against its naive oracle: every output
(z, x, B, C, dt) and the gradient of every input (u, W_in, the conv's weight and bias, dt_bias); fp32 under the
Triton interpreter at ragged sizes with poisoned allocations, bf16 on the GPU at the Mamba-2 configs' layer
shapes; the model with `proj` fused (both sides: proj_out's gate-first form) against the naive model."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from ops import get_op
from ops.mamba2_proj_in import fused, naive
from tests.helpers import assert_proj_model_equals_naive_fp32, rel_err

# every test: the fp32 oracle without TF32 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("exact_fp32_matmuls")

OUTS = ["z", "x", "B", "C", "dt"]
INS = ["u", "w_in", "conv_w", "conv_b", "dt_bias"]


def make_inputs(Bsz, T, d, d_inner, d_state, H, W=4, bias=True, device="cpu", seed=0):
    """u and the parameters from the op's builder (ops.mamba2_proj_in.naive.make_inputs), conv_b None without bias."""
    kw = naive.make_inputs(dict(B=Bsz, T=T, d=d, d_inner=d_inner, d_state=d_state, H=H, W=W), device=device,
                           seed=seed, bias=bias)
    return [kw[n] for n in INS]


def run(fn, inputs, d_inner, d_state, dys=None):
    outs = fn(*inputs, d_inner, d_state)
    if dys is None:
        g = torch.Generator().manual_seed(1)
        dys = [torch.randn(o.shape, generator=g).to(o.device) for o in outs]
    have = [x for x in inputs if x is not None]
    grads = torch.autograd.grad(outs, have, [dy.to(o.dtype) for dy, o in zip(dys, outs)])
    return dict(zip(OUTS, outs)), dict(zip([n for n, x in zip(INS, inputs) if x is not None], grads)), dys


# (B, T, d, d_inner, d_state, H, W, bias): T ragged, T < W, B = 1, a single head, W = 2, no conv bias
SHAPES = [(2, 13, 24, 32, 8, 4, 4, True), (1, 3, 16, 16, 16, 1, 4, True), (1, 19, 20, 24, 4, 3, 2, False)]


@pytest.mark.parametrize("shape", SHAPES,
                         ids=lambda s: "B{}T{}d{}di{}ds{}H{}W{}{}".format(*s[:7], "" if s[7] else "-nob"))
def test_fused_matches_naive_fp32(shape, device, poison_empty):
    """fp32, exact dots: every output and gradient within 1e-5."""
    *dims, W, bias = shape
    Bsz, T, d, d_inner, d_state, H = dims
    inputs = make_inputs(*dims, W=W, bias=bias, device=device)
    ref_o, ref_g, dys = run(naive.mamba2_proj_in, inputs, d_inner, d_state)
    out, grads, _ = run(fused.mamba2_proj_in, inputs, d_inner, d_state, dys)
    for name in OUTS:
        assert out[name].shape == ref_o[name].shape and out[name].dtype == ref_o[name].dtype, name
        assert rel_err(out[name], ref_o[name]) < 1e-5, name
    for name, ref in ref_g.items():
        assert rel_err(grads[name], ref) < 1e-5, name


def test_registry_and_model_wiring():
    from model import build_model
    from model.config import ModelConfig

    assert get_op("mamba2_proj_in", "fused") is fused.mamba2_proj_in
    base = ModelConfig(family="mamba2", vocab_size=32, n_layers=1, d_model=16, expand=2, ssm_head_dim=8,
                       ssm_state=8, ssm_groups=1)
    for backend, fuse, want in (("fused", None, True), ("fused", "proj", True), ("fused", "state", False),
                                ("naive", None, False)):
        mixer = build_model(dataclasses.replace(base, backend=backend, fuse=fuse)).blocks[0].mixer
        assert (mixer.proj_in is fused.mamba2_proj_in) == want, (backend, fuse)
        assert ("mamba2_proj_in" in mixer.resolved_ops) == ("proj_out" in mixer.resolved_ops) == want, (backend, fuse)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fp32 model check runs on CPU (the interpreter's exact dots)")
def test_model_with_fused_proj_equals_naive_fp32():
    """A Mamba-2 model with only `proj` fused (the SSD on `chunk`'s stages) against the naive model (tests.helpers),
    the gate-first norm over d_inner included. T ragged, 2 groups."""
    from model.config import ModelConfig

    assert_proj_model_equals_naive_fp32(ModelConfig(family="mamba2", vocab_size=61, n_layers=2, d_model=16, expand=2,
                                                    ssm_head_dim=8, ssm_state=8, ssm_groups=2), 20)


# ---- the GPU: bf16 at Mamba2-370M's layer (d 1024, d_inner 2048, N 128, 32 heads), 130M's and a ragged one ----
GPU_SHAPES = {"mamba2_370m_B8T2048d1024": (8, 2048, 1024, 2048, 128, 32),
              "mamba2_130m_B8T2048d768": (8, 2048, 768, 1536, 128, 24),
              "ragged_B1T1000d200": (1, 1000, 200, 400, 24, 5)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 at full shapes needs a CUDA GPU")
@pytest.mark.parametrize("name", list(GPU_SHAPES))
def test_fused_matches_naive_bf16_gpu(name):
    """Under bf16 autocast, as the model runs, against the fp32 naive op: every output and gradient within twice
    PyTorch's own bf16 error on the same chain plus 1e-3."""
    dims = GPU_SHAPES[name]
    d_inner, d_state = dims[3], dims[4]
    inputs = make_inputs(*dims, device="cuda")
    ref_o, ref_g, dys = run(naive.mamba2_proj_in, inputs, d_inner, d_state)
    dys = [dy.cuda() for dy in dys]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        nb_o, nb_g, _ = run(naive.mamba2_proj_in, inputs, d_inner, d_state, dys)
        out, grads, _ = run(fused.mamba2_proj_in, inputs, d_inner, d_state, dys)
    assert [out[n].dtype for n in OUTS] == [nb_o[n].dtype for n in OUTS]
    errs = {n: (rel_err(out[n], ref_o[n]), rel_err(nb_o[n], ref_o[n])) for n in OUTS}
    errs |= {f"d{n}": (rel_err(grads[n], ref_g[n]), rel_err(nb_g[n], ref_g[n])) for n in ref_g}
    bad = {n: e for n, e in errs.items() if not e[0] <= 2 * e[1] + 1e-3}
    assert not bad, f"(fused, naive bf16) errors: {errs}"
