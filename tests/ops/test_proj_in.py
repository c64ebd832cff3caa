"""The fused input projection (ops/proj_in/fused.py) against its naive oracle: every output (q, k, v,
gk, r) and the gradient of every input (x and all seven weights and the bias); fp32 under the Triton
interpreter at ragged sizes with poisoned allocations, bf16 on the GPU at the seed's and the GLA configs' layer
shapes; the registry wiring, saved memory and refusals. (The model-level fp32 check with `proj` fused, both
sides, is tests/ops/test_proj_out.py::test_gla_model_with_fused_proj_equals_naive_fp32.)"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bench.chains import normed_input
from ops import BackendError, get_op, parse_fuse
from ops.proj_in import fused, naive
from tests.helpers import rel_err, saved_bytes

# every test: the fp32 oracle without TF32 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("exact_fp32_matmuls")

OUTS = ["q", "k", "v", "gk", "r"]
INS = ["x", "w_q", "w_k", "w_v", "w_r", "w_down", "w_up", "b_up"]


def make_inputs(B, T, d, H, K, V, L, device="cpu", bias_scale=1.0, seed=0):
    """x and the seven parameters from the op's builder (ops.proj_in.naive.make_inputs): fp32 leaves, scaled so
    that z = low W_upᵀ + b is O(1) (bias_scale stretches it: logsigmoid's saturated tails)."""
    kw = naive.make_inputs(dict(B=B, T=T, d=d, H=H, K=K, V=V, L=L), device=device, seed=seed, bias_scale=bias_scale)
    return [kw[n] for n in INS]


def run(fn, inputs, H, normalizer, dys=None):
    """The five outputs and the gradients of all eight inputs against random output gradients dys
    (each in its output's dtype, as the mixer and proj_out hand them back)."""
    outs = fn(*inputs, H, normalizer)
    if dys is None:
        g = torch.Generator().manual_seed(1)
        dys = [torch.randn(o.shape, generator=g).to(o.device) for o in outs]
    grads = torch.autograd.grad(outs, inputs, [dy.to(o.dtype) for dy, o in zip(dys, outs)])
    return dict(zip(OUTS, outs)), dict(zip(INS, grads)), dys


# (B, T, d, H, K, V, L). Interpreter tiles (fused.INTERPRET_*): GEMMs 16×16×16, gk kernels 16 rows × 16 columns.
# B·T, d ragged against them; HK = 24, 36 and HV = 36, 20 put slice boundaries inside column tiles (the
# per-column epilogue), HK = HV = 32 keeps every tile inside one slice (the vectorised one) and then the low
# slice starts its own tile; L = 16, 4, 5, 1 (padded to 16 inside the gk kernels); K ≠ V.
SHAPES = [(2, 13, 40, 3, 8, 12, 4), (1, 21, 33, 2, 16, 16, 16), (1, 9, 24, 1, 20, 24, 5), (2, 7, 17, 3, 12, 12, 1),
          (1, 19, 48, 4, 9, 5, 16)]


# every engine pair (ops/proj_in/fused.py): the library's, all-Triton, cuBLAS dx over concatenated gradients
ENGINES = {"library": fused.proj_in, "triton": fused.proj_in_triton, "cat": fused.proj_in_cat}


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}d{}H{}K{}V{}L{}".format(*s))
def test_fused_matches_naive_fp32(shape, engine, device, poison_empty):
    """fp32 with exact dots (input_precision ieee): every output and gradient within 1e-5; NaN-filled
    allocations make any element a kernel leaves unwritten fail. q, k, v, r come out contiguous: the mixer's
    .contiguous() is free."""
    H = shape[3]
    inputs = make_inputs(*shape, device=device)
    ref_o, ref_g, dys = run(naive.proj_in, inputs, H, 16.0)
    out, grads, _ = run(ENGINES[engine], inputs, H, 16.0, dys)
    for name in OUTS:
        assert out[name].shape == ref_o[name].shape and out[name].dtype == ref_o[name].dtype, name
        assert out[name].is_contiguous(), name
        assert rel_err(out[name], ref_o[name]) < 1e-5, name
    for name in INS:
        assert grads[name].shape == inputs[INS.index(name)].shape, name
        assert rel_err(grads[name], ref_g[name]) < 1e-5, name


@pytest.mark.parametrize("normalizer", [1.0, 5.0])
def test_normalizer_and_saturated_gate(normalizer, device):
    """A normalizer other than the default reaches both gk kernels, and a bias 25× larger drives z deep into
    logsigmoid's tails (|z| ≳ 10: the series branch of log1p and σ(−z) → 0 or 1)."""
    shape = (1, 11, 24, 2, 16, 8, 16)
    inputs = make_inputs(*shape, device=device, bias_scale=25.0)
    ref_o, ref_g, dys = run(naive.proj_in, inputs, 2, normalizer)
    out, grads, _ = run(fused.proj_in, inputs, 2, normalizer, dys)
    assert rel_err(out["gk"], ref_o["gk"]) < 1e-5
    for name in ("x", "w_down", "w_up", "b_up"):
        assert rel_err(grads[name], ref_g[name]) < 1e-5, name


def test_saves_less_than_the_unfused_chain(device):
    """The fused op keeps one copy of x, low and W_cat; PyTorch's chain keeps what each linear and logsigmoid needs."""
    def saved(fn):
        inputs = make_inputs(*shape, device=device)
        return saved_bytes(lambda: fn(*inputs, 2, 16.0))

    shape = B, T, d, H, K, V, L = (2, 32, 64, 2, 16, 16, 4)
    fused_bytes, naive_bytes = saved(fused.proj_in), saved(naive.proj_in)
    w_cat = (2 * H * K + 2 * H * V + L) * d * 4
    assert fused_bytes <= (B * T * d + B * T * L + H * K * L + H * K) * 4 + w_cat, fused_bytes
    assert fused_bytes < naive_bytes, (fused_bytes, naive_bytes)


def test_refusals_name_op_backend_and_remedy():
    """int32 overflow and a rank the gk kernels do not hold are refused before anything runs (meta tensors)."""
    def meta(B, T, d, HK, HV, L):
        return [torch.empty(*s, device="meta") for s in ((B, T, d), (HK, d), (HK, d), (HV, d), (HV, d), (L, d),
                                                          (HK, L), (HK,))]
    with pytest.raises(BackendError, match="op 'proj_in', backend 'fused': .*int32.*--fuse"):
        fused.proj_in(*meta(64, 8192, 2048, 2048, 2048, 16), 16)
    with pytest.raises(BackendError, match="op 'proj_in', backend 'fused': gate low rank 96.*--fuse"):
        fused.proj_in(*meta(1, 8, 64, 32, 32, 96), 2)
    with pytest.raises(ValueError, match="proj_in: shapes"):
        fused.proj_in(*meta(1, 8, 64, 32, 32, 16)[:-1], torch.empty(31, device="meta"), 2)


@pytest.mark.parametrize("half", [False, True])
def test_prologue_casts_x_once(half, device, poison_empty):
    """The prologue's three outputs: xc is x rounded to the GEMMs' dtype (x itself when already in it), low the
    rank-L product of xc, gk from low; at ragged rows and d (37 × 40 against 16 × 16 tiles), L = 5. The 16-bit
    dtype is bf16 on the GPU and fp16 on the CPU, whose interpreter (Triton 3.9) gets bf16 dots wrong by 1e10."""
    dtype = (torch.bfloat16 if device == "cuda" else torch.float16) if half else torch.float32
    M, d, HK, L = 37, 40, 24, 5
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, d, generator=g).to(device)
    w_down, w_up = (torch.randn(*s, generator=g).to(device, dtype) / 3 for s in ((L, d), (HK, L)))
    b = torch.randn(HK, generator=g).to(device)
    xc, low, gk = fused.prologue(x, w_down, w_up, b, 1 / 16, dtype)
    assert torch.equal(xc, x.to(dtype)) and (xc is x) == (not half)
    want_low = xc.double() @ w_down.double().t()
    assert low.dtype == dtype and rel_err(low, want_low) < (1e-2 if half else 1e-6)
    want_gk = torch.nn.functional.logsigmoid(low.double() @ w_up.double().t() + b.double()) / 16
    assert gk.dtype == torch.float32 and rel_err(gk, want_gk) < 1e-5


@pytest.mark.parametrize("programs", [1, 6, 512])
def test_gk_backward_partials(programs, device, monkeypatch, poison_empty):
    """gk's backward kernel against autograd of logsigmoid(low W_upᵀ + b)/16, with the row ranges per column block
    forced to 1 (every program loops over all row tiles), 2 (a ragged last range) and one tile each, so a
    partial that a loop drops or double-counts fails. M = 100 rows, HK = 40 (ragged column blocks), L = 5."""
    monkeypatch.setattr(fused, "GK_BWD_PROGRAMS", programs)
    M, HK, L = 100, 40, 5
    g = torch.Generator().manual_seed(0)
    low, w_up, b, dgk = (torch.randn(*s, generator=g).to(device) for s in ((M, L), (HK, L), (HK,), (M, HK)))
    dlow, dw_up, db = fused.gk_bwd(low, w_up, b, dgk, 1 / 16, torch.float32)
    ref = [t.clone().requires_grad_() for t in (low, w_up, b)]
    gk = torch.nn.functional.logsigmoid(ref[0] @ ref[1].t() + ref[2]) / 16
    want = torch.autograd.grad(gk, ref, dgk)
    for name, got, w in zip(("dlow", "dW_up", "db"), (dlow, dw_up, db), want):
        assert got.shape == w.shape and rel_err(got, w) < 1e-5, name


# (HK, HV, L, d). TMA needs 16-byte rows: on the CPU (fp32) widths that are multiples of 4, on the GPU (bf16)
# multiples of 8, so (24, 40, 8, 56) takes TMA on both, with slices ending inside a K block and ragged columns;
# d = 33, L = 5 and HV = 18 take the pointer kernel on both.
DGRAD_WIDTHS = [(24, 36, 4, 40), (32, 32, 16, 48), (24, 40, 8, 56), (24, 24, 16, 33), (32, 32, 5, 40),
                (16, 18, 16, 32)]


@pytest.mark.parametrize("widths", DGRAD_WIDTHS, ids=lambda w: "HK{}HV{}L{}d{}".format(*w))
def test_dgrad_engines_match_a_concatenated_product(widths, device, poison_empty):
    """dx by tensor descriptors where every operand is TMA-addressable, else by pointer loads: each equals
    [dq | dk | dv | dr | dlow] W_cat at ragged rows (M = 37) and K steps (a slice ending inside a BK block);
    tma_addressable decides by the widths, so both kernels are exercised."""
    HK, HV, L, d = widths
    M = 37
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(M, n, generator=g).to(device, dtype) for n in (HK, HK, HV, HV, L)]
    w_cat = torch.randn(2 * HK + 2 * HV + L, d, generator=g).to(device, dtype)
    dx = fused.triton_dgrad(grads, w_cat, HK, HV, torch.float32)
    want = torch.cat(grads, 1).double() @ w_cat.double()
    aligned = all(n * grads[0].element_size() % 16 == 0 for n in (HK, HV, L, d))
    if device == "cpu" or torch.cuda.get_device_capability()[0] >= 9:
        assert fused.tma_addressable([*grads, w_cat, dx]) == aligned
    assert rel_err(dx, want) < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="TMA needs a GPU of compute capability 9.0")
def test_tma_only_for_16_bit_operands_on_hopper():
    """fp32 operands would need 263 KB of shared memory at TMA_CONFIGS' tiles: the pointer kernel takes them."""
    def tensors(dtype):
        operands = [torch.zeros(64, 64, device="cuda", dtype=dtype) for _ in range(6)]
        return operands + [torch.zeros(64, 64, device="cuda")]                                # dx, fp32
    assert fused.tma_addressable(tensors(torch.bfloat16)) and not fused.tma_addressable(tensors(torch.float32))


def test_gemm_autotune_is_small_and_ignores_rows():
    """≤ 6 configs per GEMM, keyed on the widths, never on B·T."""
    assert len(fused.GEMM_CONFIGS) <= 6 and len(fused.TMA_CONFIGS) <= 6
    assert set(fused._gemm_tuned.keys) == {"D", "HK", "HV"}
    assert set(fused._dgrad_tuned.keys) == set(fused._dgrad_tma_tuned.keys) == {"D", "HK", "HV", "L"}


def test_registry_and_model_wiring():
    """The proj component resolves GLA's input side exactly as it does its output side."""
    from model import build_model
    from model.config import ModelConfig

    assert get_op("proj_in", "fused") is fused.proj_in
    assert get_op("proj_in", "fused", parse_fuse("proj")) is fused.proj_in
    with pytest.raises(BackendError, match="op 'proj_in'.*no fused state component"):
        get_op("proj_in", "fused", parse_fuse("state"))
    cfg = ModelConfig(family="gla", d_model=32, n_layers=1, n_heads=2, head_k_dim=8, head_v_dim=16, vocab_size=64)
    for (backend, fuse), want in {("fused", None): fused.proj_in, ("fused", "proj"): fused.proj_in,
                                  ("fused", "chunk,state"): naive.proj_in, ("chunk", None): naive.proj_in,
                                  ("naive", None): naive.proj_in}.items():
        mixer = build_model(dataclasses.replace(cfg, backend=backend, fuse=fuse)).blocks[0].mixer
        assert mixer.proj_in is want, (backend, fuse)
        assert ("proj_in" in mixer.resolved_ops) == (want is fused.proj_in), (backend, fuse)


# ---- the GPU: bf16 at the seed's shape, GLA-340M's (K 128, V 256) and GLA-125M's layers, a ragged one ----
GPU_SHAPES = {"seed_B8T4096d2048H16K128": (8, 4096, 2048, 16, 128, 128, 16),
              "gla340m_B8T2048d1024H4K128V256": (8, 2048, 1024, 4, 128, 256, 16),
              "gla125m_B8T2048d768H12K64": (8, 2048, 768, 12, 64, 64, 16),
              "ragged_B1T1000d200H3K40V24L5": (1, 1000, 200, 3, 40, 24, 5)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 at full shapes needs a CUDA GPU")
@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("name", list(GPU_SHAPES))
def test_fused_matches_naive_bf16_gpu(name, engine):
    """Under bf16 autocast, as the model runs (fp32 x from the block's norm: a non-leaf, bench.chains.normed_input,
    so the naive chain casts it at each F.linear as the model does), against the fp32 naive op. Bound:
    twice PyTorch's own bf16 error on the same chain (naive under the same autocast) plus 1e-3 of rounding slack
    for every output and every gradient."""
    shape = GPU_SHAPES[name]
    H = shape[3]
    inputs = make_inputs(*shape, device="cuda")
    ref_o, ref_g, dys = run(naive.proj_in, inputs, H, 16.0)            # fp32, no TF32 in the naive linears
    dys = [dy.cuda() for dy in dys]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        nb_o, nb_g, _ = run(normed_input(naive.proj_in), inputs, H, 16.0, dys)
        out, grads, _ = run(normed_input(ENGINES[engine]), inputs, H, 16.0, dys)
    assert [out[n].dtype for n in OUTS] == [nb_o[n].dtype for n in OUTS]
    errs = {n: (rel_err(out[n], ref_o[n]), rel_err(nb_o[n], ref_o[n])) for n in OUTS}
    errs |= {f"d{n}": (rel_err(grads[n], ref_g[n]), rel_err(nb_g[n], ref_g[n])) for n in INS}
    bad = {n: e for n, e in errs.items() if not e[0] <= 2 * e[1] + 1e-3}
    assert not bad, f"(fused, naive bf16) errors: {errs}"
