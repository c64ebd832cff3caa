"""Gated DeltaNet's fused input side (ops/gdn_proj_in/fused.py) against its naive oracle: every output
(q, k, v, g, β, r) and the gradient of every input (x, the six projection weights, the three conv weights, A_log,
dt_bias); fp32 under the Triton interpreter at ragged sizes with poisoned allocations, bf16 on the GPU at the GDN
configs' layer shapes; the registry wiring. (The model with `proj` fused against the naive model, fp32 and bf16:
tests/model/test_equivalence.py, backend `fused`, which for Gated DeltaNet is chunk's mixer and this chain.)"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bench.chains import normed_input
from ops import BackendError, get_op
from ops.gdn_proj_in import fused, naive
from tests.helpers import rel_err, saved_bytes

# every test: the fp32 oracle without TF32 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("exact_fp32_matmuls")

OUTS = ["q", "k", "v", "g", "beta", "r"]
INS = ["x", "w_q", "w_k", "w_v", "w_r", "w_b", "w_a", "conv_q", "conv_k", "conv_v", "A_log", "dt_bias"]


def make_inputs(B, T, d, H, K, V, W=4, device="cpu", seed=0):
    """x and the parameters from the op's builder (ops.gdn_proj_in.naive.make_inputs): fp32 leaves in nn.Linear's
    / nn.Conv1d's layouts, scaled so activations are O(1); A_log and dt_bias as model.common.init_ssm_decay_ draws
    them, stretched a little."""
    kw = naive.make_inputs(dict(B=B, T=T, d=d, H=H, K=K, V=V, W=W), device=device, seed=seed)
    return [kw[n] for n in INS]


def run(fn, inputs, H, dys=None):
    """The six outputs and the gradients of all twelve inputs against random output gradients (each in its
    output's dtype)."""
    outs = fn(*inputs, H)
    if dys is None:
        g = torch.Generator().manual_seed(1)
        dys = [torch.randn(o.shape, generator=g).to(o.device) for o in outs]
    grads = torch.autograd.grad(outs, inputs, [dy.to(o.dtype) for dy, o in zip(dys, outs)])
    return dict(zip(OUTS, outs)), dict(zip(INS, grads)), dys


# (B, T, d, H, K, V, W): T ragged against the conv kernel's interpreter tiles, T < W, K ≠ V, B = H = 1, W = 2
SHAPES = [(2, 13, 40, 2, 16, 8, 4), (1, 3, 24, 1, 16, 16, 4), (1, 21, 33, 3, 8, 12, 2), (2, 1, 16, 2, 16, 16, 4)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}d{}H{}K{}V{}W{}".format(*s))
def test_fused_matches_naive_fp32(shape, device, poison_empty):
    """fp32, exact dots: every output and gradient within 1e-5; q, k, v come out contiguous."""
    B, T, d, H, K, V, W = shape
    inputs = make_inputs(*shape, device=device)
    ref_o, ref_g, dys = run(naive.gdn_proj_in, inputs, H)
    out, grads, _ = run(fused.gdn_proj_in, inputs, H, dys)
    for name in OUTS:
        assert out[name].shape == ref_o[name].shape and out[name].dtype == ref_o[name].dtype, name
        assert rel_err(out[name], ref_o[name]) < 1e-5, name
    assert all(out[n].is_contiguous() for n in ("q", "k", "v"))
    for name in INS:
        assert grads[name].shape == inputs[INS.index(name)].shape, name
        assert rel_err(grads[name], ref_g[name]) < 1e-5, name


def test_saves_less_than_the_unfused_chain(device):
    """The fused chain keeps x once (bf16 in training), the GEMM's output and the conv inputs inside it; PyTorch's
    keeps x per linear, each conv's input and output and the norms' inputs."""
    def saved(fn):
        inputs = make_inputs(2, 32, 32, 2, 16, 16, device=device)
        return saved_bytes(lambda: fn(*inputs, 2))
    assert saved(fused.gdn_proj_in) < saved(naive.gdn_proj_in)


def test_registry_and_model_wiring():
    """`--backend fused` (all components) and `--fuse proj` take the fused chain on both sides; other backends keep
    the naive one and do not log proj ops; the mixer op has no fused component of its own, so `--fuse state` is
    refused with the remedy."""
    from model import build_model
    from model.config import ModelConfig

    assert get_op("gdn_proj_in", "fused") is fused.gdn_proj_in
    base = ModelConfig(family="gated_deltanet", vocab_size=32, n_layers=1, d_model=32, n_heads=2, head_k_dim=16,
                       head_v_dim=16)
    for backend, fuse, want in (("fused", None, True), ("fused", "proj", True), ("chunk", None, False),
                                ("naive", None, False)):
        mixer = build_model(dataclasses.replace(base, backend=backend, fuse=fuse)).blocks[0].mixer
        assert (mixer.proj_in is fused.gdn_proj_in) == want, (backend, fuse)
        assert ("gdn_proj_in" in mixer.resolved_ops) == ("proj_out" in mixer.resolved_ops) == want, (backend, fuse)
    with pytest.raises(BackendError, match="op 'gated_delta'.*no fused state component.*drop it from --fuse"):
        build_model(dataclasses.replace(base, backend="fused", fuse="state,proj"))


# ---- the GPU: bf16 at GDN-340M's layer (H8 K=V=128) and GDN-125M's, and a ragged one ----
GPU_SHAPES = {"gdn340m_B8T2048d1024H8K128": (8, 2048, 1024, 8, 128, 128, 4),
              "gdn125m_B8T2048d768H6K128": (8, 2048, 768, 6, 128, 128, 4),
              "ragged_B1T1000d200H3K32V48": (1, 1000, 200, 3, 32, 48, 4)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 at full shapes needs a CUDA GPU")
@pytest.mark.parametrize("name", list(GPU_SHAPES))
def test_fused_matches_naive_bf16_gpu(name):
    """Under bf16 autocast, as the model runs (x a non-leaf: bench.chains.normed_input), against the fp32 naive op:
    every output and gradient within twice PyTorch's own bf16 error on the same chain plus 1e-3."""
    shape = GPU_SHAPES[name]
    H = shape[3]
    inputs = make_inputs(*shape, device="cuda")
    ref_o, ref_g, dys = run(naive.gdn_proj_in, inputs, H)
    dys = [dy.cuda() for dy in dys]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        nb_o, nb_g, _ = run(normed_input(naive.gdn_proj_in), inputs, H, dys)
        out, grads, _ = run(normed_input(fused.gdn_proj_in), inputs, H, dys)
    assert [out[n].dtype for n in OUTS] == [nb_o[n].dtype for n in OUTS]
    errs = {n: (rel_err(out[n], ref_o[n]), rel_err(nb_o[n], ref_o[n])) for n in OUTS}
    errs |= {f"d{n}": (rel_err(grads[n], ref_g[n]), rel_err(nb_g[n], ref_g[n])) for n in INS}
    bad = {n: e for n, e in errs.items() if not e[0] <= 2 * e[1] + 1e-3}
    assert not bad, f"(fused, naive bf16) errors: {errs}"
