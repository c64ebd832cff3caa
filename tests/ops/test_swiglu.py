"""The fused SwiGLU middle (ops/swiglu/fused.py) against its naive oracle (model.common.SwiGLU's chain): the output
and the gradient of gu, in fp32 (within 1e-5) and bf16 (within bf16 rounding) at widths ragged against the tiles,
with leading batch dims, gu read in place from a column slice of a wider tensor, gates of large magnitude; the
errors for an odd width and an unsupported dtype; what the backward saves; the registry and model wiring."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from ops import BackendError, get_op, parse_fuse
from ops.swiglu import fused, naive
from tests.helpers import rel_err, saved_bytes


def run(fn, gu, dh):
    """The output and the gradient of gu."""
    h = fn(gu)
    (dgu,) = torch.autograd.grad(h, gu, dh)
    return h, dgu


def draw(*shape, device, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(shape, generator=g, device=device) * scale).to(dtype)


# (leading dims, F). Under the interpreter (fused.INTERPRET_*) a tile is 64 elements of at most 16 columns: F = 3
# (one tile of 4 columns, 16 rows), 40 and 130 (3 and 9 column blocks, the last ragged) against 37 rows (ragged
# row blocks); one row; F = 16 exactly one column block; a leading batch dim [2, 19].
SHAPES = [((37,), 3), ((37,), 40), ((37,), 130), ((1,), 40), ((5,), 16), ((2, 19), 40), ((3, 1, 7), 24)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[0])) + f"-F{s[1]}")
def test_fused_matches_naive_fp32(shape, device, poison_empty):
    """fp32: h and dgu within 1e-5 (a handful of fp32 operations per element), same shape, dtype and layout."""
    lead, F = shape
    gu = draw(*lead, 2 * F, device=device).requires_grad_()
    dh = draw(*lead, F, device=device, seed=1)
    ref_h, ref_dgu = run(naive.swiglu, gu, dh)
    h, dgu = run(fused.swiglu, gu, dh)
    assert h.shape == ref_h.shape == (*lead, F) and h.dtype == torch.float32 and h.is_contiguous()
    assert dgu.shape == gu.shape
    assert rel_err(h, ref_h) < 1e-5 and rel_err(dgu, ref_dgu) < 1e-5


@pytest.mark.parametrize("F", [3, 40, 130])
def test_gu_read_in_place_from_a_wider_tensor(F, device, poison_empty):
    """gu as a column slice of a wider [B, T, W] tensor (row stride W ≠ 2F): the same h and gradient as a
    contiguous gu, the gradient reaching the wide tensor's columns only, and the backward saving the wide tensor
    itself, not a copy of the slice."""
    B, T, lo, hi = 2, 13, 5, 7
    wide = draw(B, T, lo + 2 * F + hi, device=device).requires_grad_()
    gu = wide[..., lo:lo + 2 * F]
    assert not gu.is_contiguous()
    dh = draw(B, T, F, device=device, seed=1)
    ref_h, ref_dgu = run(naive.swiglu, gu.detach().clone().requires_grad_(), dh)
    h = fused.swiglu(gu)
    (dwide,) = torch.autograd.grad(h, wide, dh)
    assert rel_err(h, ref_h) < 1e-5 and rel_err(dwide[..., lo:lo + 2 * F], ref_dgu) < 1e-5
    assert not dwide[..., :lo].any() and not dwide[..., lo + 2 * F:].any()
    kept = []

    def pack(t):
        kept.append(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fused.swiglu(gu)
    assert kept == [wide.untyped_storage().data_ptr()]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")   # the interpreter's e^100
def test_large_gates_stay_finite_and_exact(device):
    """Gates across ±30 (σ saturating in fp32) and a few at ±100 (e^100 overflows fp32 to inf, σ → 0): h and dgu
    finite and within 1e-5 of the oracle, elementwise too."""
    M, F = 37, 40
    gu = draw(M, 2 * F, device=device)
    gu[:, :F] = torch.linspace(-30, 30, M * F, device=device).view(M, F)[torch.randperm(M)]
    gu[0, :4] = torch.tensor([-100.0, 100.0, -88.0, 89.0])
    gu.requires_grad_()
    dh = draw(M, F, device=device, seed=1)
    ref_h, ref_dgu = run(naive.swiglu, gu, dh)
    h, dgu = run(fused.swiglu, gu, dh)
    assert torch.isfinite(h).all() and torch.isfinite(dgu).all()
    assert rel_err(h, ref_h) < 1e-5 and rel_err(dgu, ref_dgu) < 1e-5
    torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dgu, ref_dgu, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [((37,), 40), ((2, 19), 130), ((37,), 3)], ids=lambda s: f"{s[0]}-F{s[1]}")
def test_fused_matches_naive_bf16(shape, device):
    """bf16 gu and dh: against the fp32 oracle on the same (bf16-valued) inputs, h and dgu within one bf16 rounding
    (fp32 math, each value rounded once: ≤ 2⁻⁸ relative per element, round to nearest on the GPU; ≤ 2⁻⁷ under
    the interpreter, whose fp32 → bf16 cast truncates) and, on the GPU, no further than the PyTorch chain in bf16,
    which rounds silu(g) and dh ⊙ u first."""
    lead, F = shape
    gu = draw(*lead, 2 * F, device=device, dtype=torch.bfloat16).requires_grad_()
    dh = draw(*lead, F, device=device, seed=1, dtype=torch.bfloat16)
    ref_h, ref_dgu = run(naive.swiglu, gu.detach().float().requires_grad_(), dh.float())
    nb_h, nb_dgu = run(naive.swiglu, gu, dh)
    h, dgu = run(fused.swiglu, gu, dh)
    assert h.dtype == dgu.dtype == torch.bfloat16 and h.shape == ref_h.shape and dgu.shape == gu.shape
    errs = {"h": (rel_err(h, ref_h), rel_err(nb_h, ref_h)), "dgu": (rel_err(dgu, ref_dgu), rel_err(nb_dgu, ref_dgu))}
    gpu = torch.device(device).type == "cuda"
    unit = 2 ** -8 if gpu else 2 ** -7
    assert all(e <= unit and (not gpu or e <= n + 1e-4) for e, n in errs.values()), errs


def test_an_odd_width_is_refused():
    """[..., 2F] must split into gate and up: an odd last dim is an error naming the op, the backend and the shape
    (checked before any kernel, so meta tensors do)."""
    with pytest.raises(BackendError, match=r"op 'swiglu', backend 'fused': .*even.*\(4, 7\).*--backend naive"):
        fused.swiglu(torch.empty(4, 7, device="meta"))


def test_an_unsupported_dtype_is_refused():
    with pytest.raises(BackendError, match=r"op 'swiglu', backend 'fused': inputs in torch.float64.*--backend naive"):
        fused.swiglu(torch.empty(4, 8, dtype=torch.float64, device="meta"))


def test_no_rows(device):
    """Zero rows: an empty h and an empty gradient, no launch."""
    gu = torch.empty(0, 3, 8, device=device, requires_grad=True)
    h = fused.swiglu(gu)
    assert h.shape == (0, 3, 4)
    (dgu,) = torch.autograd.grad(h, gu, torch.empty_like(h))
    assert dgu.shape == gu.shape


def test_saves_only_gu(device):
    """The backward recomputes σ(g) from gu alone; PyTorch's chain also keeps silu(g)."""
    gu = draw(37, 80, device=device).requires_grad_()
    fused_bytes, naive_bytes = saved_bytes(lambda: fused.swiglu(gu)), saved_bytes(lambda: naive.swiglu(gu))
    assert fused_bytes == gu.numel() * 4 < naive_bytes, (fused_bytes, naive_bytes)


def test_registry_and_model_wiring():
    """`--backend fused` (all components) and `--fuse proj` give the MLP the fused op; other choices keep the
    PyTorch chain. The parameters keep their names (checkpoints unchanged). A whole model with `proj` fused, its
    MLPs' swiglu among the fused ops, is checked against the naive model in tests/ops/test_proj_out.py."""
    from model import build_model
    from model.config import ModelConfig

    assert get_op("swiglu", "fused") is fused.swiglu
    assert get_op("swiglu", "fused", parse_fuse("proj")) is fused.swiglu
    with pytest.raises(BackendError, match="op 'swiglu'.*no fused chunk component"):
        get_op("swiglu", "fused", parse_fuse("chunk"))
    gla = ModelConfig(family="gla", d_model=32, n_layers=1, n_heads=2, head_k_dim=8, head_v_dim=16, vocab_size=64,
                      mlp_hidden=48)
    mamba2 = ModelConfig(family="mamba2", d_model=16, n_layers=1, ssm_head_dim=8, ssm_state=8, vocab_size=64,
                         mlp_hidden=48)
    cases = {("fused", None): fused.swiglu, ("fused", "proj"): fused.swiglu, ("fused", "chunk,state"): naive.swiglu,
             ("chunk", None): naive.swiglu, ("naive", None): naive.swiglu}
    for cfg in (gla, mamba2):
        for (backend, fuse), want in cases.items():
            if cfg.family == "mamba2" and fuse == "chunk,state":
                fuse = "state"                             # Mamba-2's fused op has no chunk component
            mlp = build_model(dataclasses.replace(cfg, backend=backend, fuse=fuse)).blocks[0].mlp
            assert mlp.swiglu is want, (cfg.family, backend, fuse)
            assert [n for n, _ in mlp.named_parameters()] == ["gate_up.weight", "down.weight"]


# ---- the GPU: bf16 at the 340M models' MLP (F = 2816) and GLA-125M's (F = 2048), B8 T2048 rows; a ragged one ----
GPU_SHAPES = {"340m_M16384F2816": (16384, 2816), "125m_M16384F2048": (16384, 2048), "ragged_M1000F1000": (1000, 1000)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 at full shapes needs a CUDA GPU")
@pytest.mark.parametrize("name", list(GPU_SHAPES))
def test_fused_matches_naive_bf16_gpu(name):
    M, F = GPU_SHAPES[name]
    test_fused_matches_naive_bf16(((M,), F), "cuda")
