"""RA+MLA: the reciprocal band against an explicit double loop, α = 0 against latent attention on
SDPA, gradients of every input including α, and gradcheck on a tiny case."""
from __future__ import annotations

import math

import pytest
import torch

from ops.ramla.naive import make_inputs as ramla_inputs
from ops.ramla.naive import mla_sdpa, ramla
from tests.helpers import rel_err


def make_inputs(B, T, H, D, L, dtype=torch.float64, seed=0):
    """q, k_lat, v_lat, w_ql / √D, w_vu / √L from the op's builder (α and the band are each test's)."""
    kw = ramla_inputs(dict(B=B, T=T, H=H, D=D, L=L), dtype, seed=seed, requires_grad=False)
    return tuple(kw[n] for n in ("q", "k_lat", "v_lat", "w_ql", "w_vu"))


def double_loop(q, k_lat, v_lat, w_ql, w_vu, alpha, W):
    """Every score written out by hand: s_ij = q_lat,i·K_j/√L (+ α q_lat,j·K_i/√L on the band)."""
    B, T, H, D = q.shape
    L = k_lat.shape[-1]
    out = torch.zeros(B, T, H, D, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            q_lat = [q[b, t, h] @ w_ql[h] for t in range(T)]
            for i in range(T):
                s = []
                for j in range(i + 1):
                    score = q_lat[i] @ k_lat[b, j] / math.sqrt(L)
                    if i - j <= W:
                        score = score + alpha * (q_lat[j] @ k_lat[b, i]) / math.sqrt(L)
                    s.append(score)
                p = torch.stack(s).softmax(0)
                ctx = sum(p[j] * v_lat[b, j] for j in range(i + 1))
                out[b, i, h] = ctx @ w_vu[h]
    return out


@pytest.mark.parametrize("W", [0, 1, 3, 100])
def test_band_matches_double_loop(W):
    inputs = make_inputs(2, 9, 2, 3, 4)
    alpha = torch.tensor(0.7, dtype=torch.float64)
    assert rel_err(ramla(*inputs, alpha, W), double_loop(*inputs, 0.7, W)) < 1e-12


def test_alpha_zero_is_plain_mla():
    inputs = make_inputs(2, 37, 3, 8, 16)
    zero = torch.tensor(0.0, dtype=torch.float64)
    ref = mla_sdpa(*inputs)
    assert rel_err(ramla(*inputs, zero, 5), ref) < 1e-12


def test_reciprocal_term_changes_the_output():
    inputs = make_inputs(1, 16, 2, 4, 4)
    a = ramla(*inputs, torch.tensor(0.5, dtype=torch.float64), 4)
    assert rel_err(a, mla_sdpa(*inputs)) > 1e-3


def test_gradients_match_double_loop():
    inputs = [x.requires_grad_() for x in make_inputs(1, 6, 2, 3, 4)]
    alpha = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    ref_inputs = [x.detach().clone().requires_grad_() for x in inputs]
    ref_alpha = alpha.detach().clone().requires_grad_()
    do = torch.randn(1, 6, 2, 3, dtype=torch.float64)
    (ramla(*inputs, alpha, 2) * do).sum().backward()
    (double_loop(*ref_inputs, ref_alpha, 2) * do).sum().backward()
    for x, y in zip(inputs + [alpha], ref_inputs + [ref_alpha]):
        assert rel_err(x.grad, y.grad) < 1e-10


def test_gradcheck_tiny():
    inputs = tuple(x.requires_grad_() for x in make_inputs(1, 5, 2, 2, 3))
    alpha = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: ramla(*a, 2), inputs + (alpha,))


# ---- the `fused` backend (flash kernels) against the naive oracle ----

@pytest.fixture(params=["sdpa", "triton"])
def far_mode(request, device, monkeypatch):
    """Both forms of the fused op: the far field on SDPA's kernel with the band in Triton ('sdpa'), and
    every score in the Triton kernels ('triton'). The fp32 tests take the first on the CPU only: SDPA's
    GPU kernels are half precision (test_fused_split_half_precision covers them)."""
    if request.param == "sdpa" and device == "cuda":
        pytest.skip("SDPA's far-field kernels take fp16/bf16 on a GPU; test_fused_split_half_precision runs them")
    monkeypatch.setattr("ops.ramla.fused.FAR", request.param)
    return request.param


def fused_vs_naive(B, T, H, D, L, W, alpha, device="cpu", dtype=torch.float32, q_mult=1.0, seed=1, op=None,
                   k_ramp=0.0):
    """Relative errors of the fused output and of every gradient (q, k_lat, v_lat, w_ql, w_vu, α)
    against naive on the same inputs, rounded to `dtype`; naive runs in fp32 whatever `dtype` the fused op (or
    `op`) gets, so the errors are the op's own, not its inputs' rounding. k_ramp scales key j by
    1 + k_ramp·j/T, so that later keys score ever higher."""
    from ops.ramla import fused

    op = fused.ramla if op is None else op
    inputs = [x.float().to(device) for x in make_inputs(B, T, H, D, L, seed=seed)]
    inputs[0] = inputs[0] * q_mult
    inputs[1] = inputs[1] * (1 + k_ramp * torch.arange(T, device=device) / T)[:, None]
    inputs = [x.to(dtype).float() for x in inputs]
    do = torch.randn(B, T, H, D, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    results = []
    for fn, dt in ((ramla, torch.float32), (op, dtype)):
        xs = [x.to(dt).clone().requires_grad_() for x in inputs]   # fresh leaves: separate .grad
        a = None if alpha is None else torch.tensor(alpha, device=device, requires_grad=True)
        o = fn(*xs, a, W)
        (o.float() * do).sum().backward()
        results.append([o] + [x.grad for x in xs] + ([a.grad] if a is not None else []))
    return [rel_err(got, ref) for got, ref in zip(*reversed(results))]


@pytest.mark.parametrize("B,T,H,D,L,W,alpha", [
    (1, 37, 1, 8, 16, 5, 0.7),        # T < the 64-row tile, B = H = 1
    (2, 100, 2, 8, 16, 70, 0.5),      # T not a multiple of the tile; the band spans two key blocks
    (1, 130, 2, 12, 32, 0, -0.3),     # W = 0: the band is the diagonal; D ≠ L
    (1, 70, 3, 8, 16, 3, None),       # plain MLA: no band
    (1, 100, 2, 8, 16, 200, 0.9),     # band wider than the sequence
    (2, 13, 2, 8, 16, 10, 0.5),       # T = W + 3: the split's smallest far field, two rows (one is all Triton)
])
def test_fused_matches_naive(B, T, H, D, L, W, alpha, device, far_mode, poison_empty):
    errs = fused_vs_naive(B, T, H, D, L, W, alpha, device)
    names = ["o", "dq", "dk_lat", "dv_lat", "dw_ql", "dw_vu", "dalpha"]   # all(): max() would skip a NaN
    assert all(e < 2e-5 for e in errs), dict(zip(names, errs))


def test_fused_large_logits(device, far_mode):
    """Scores of a few hundred: the online softmax must neither overflow nor lose the gradients."""
    errs = fused_vs_naive(1, 100, 2, 8, 16, 10, 0.5, device, q_mult=30.0)
    assert all(e < 1e-4 for e in errs), errs


def test_fused_rising_scores(device, far_mode, monkeypatch):
    """Keys that score ever higher along the sequence, so that the forward's running max grows by several
    units at every key block and each rescaling of the online softmax matters (with near-flat scores only the
    first does). Small key blocks give the unmasked loop many of them. A lazy rescaling (FlashAttention-4's)
    that skipped acc's correction passed every other test here and failed this one."""
    monkeypatch.setattr("ops.ramla.fused.TILES", {"fwd": dict(BM=32, BN=16, num_warps=4, num_stages=2),
                                                  "dkv": dict(BM=16, BN=32, num_warps=4, num_stages=2),
                                                  "dq": dict(BM=32, BN=16, num_warps=4, num_stages=2)})
    errs = fused_vs_naive(1, 200, 2, 8, 16, 10, 0.5, device, k_ramp=40.0)
    # dα sums terms of both signs that grow with the scores: 5.4e-4 from fp32 rounding alone here
    assert all(e < 2e-5 for e in errs[:6]) and errs[6] < 2e-3, errs


def test_fused_register_cap_only_without_band(device, monkeypatch):
    """PLAIN_MAXNREG reaches both backward kernels' launches on plain MLA and neither with the band, where a cap
    measured far slower on the H100 (the results are tested above; this checks where the cap goes)."""
    from ops.ramla import fused

    seen = []

    class Recording:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            launch = self.kernel[grid]
            return lambda *a, **kw: seen.append((self.kernel.__name__, kw.get("maxnreg"))) or launch(*a, **kw)

    for name in ("ramla_bwd_dkv_kernel", "ramla_bwd_dq_kernel"):
        monkeypatch.setattr(fused, name, Recording(getattr(fused, name)))
    monkeypatch.setattr(fused, "FAR", "triton")
    for alpha, cap in ((None, fused.PLAIN_MAXNREG), (0.5, None)):
        seen.clear()
        errs = fused_vs_naive(1, 70, 2, 8, 16, 3, alpha, device)
        assert all(e < 2e-5 for e in errs), errs
        assert seen == [("ramla_bwd_dkv_kernel", cap), ("ramla_bwd_dq_kernel", cap)], (alpha, seen)


def test_fused_band_is_used(device):
    """The fused op with α differs from it without (so the band path above is exercised)."""
    from ops.ramla import fused

    inputs = [x.float().to(device) for x in make_inputs(1, 80, 2, 8, 16)]
    with_band = fused.ramla(*inputs, torch.tensor(0.5, device=device), 8)
    assert rel_err(with_band, fused.ramla(*inputs, None, 8)) > 1e-3


def test_fused_rejects_unsupported_latent_dim(device):
    from ops import BackendError
    from ops.ramla import fused

    with pytest.raises(BackendError, match="latent dim L=24"):
        fused.ramla(*[x.float().to(device) for x in make_inputs(1, 8, 1, 4, 24)], None, 2)


def test_fused_split_uses_sdpa(device, monkeypatch):
    """The split form runs the far field through far.forward/backward, and the all-Triton form never does;
    both give naive's result (so neither test above passes by one form standing in for the other)."""
    from ops.ramla import far

    calls = []
    for name in ("forward", "backward"):
        real = getattr(far, name)
        monkeypatch.setattr(far, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for mode, expected in (("sdpa", ["forward", "backward"]), ("triton", [])):
        monkeypatch.setattr("ops.ramla.fused.FAR", mode)
        calls.clear()
        errs = fused_vs_naive(1, 100, 2, 8, 16, 10, 0.5, device, dtype)
        assert calls == expected and all(e < (2e-2 if device == "cuda" else 2e-5) for e in errs), (mode, calls, errs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="SDPA's cuDNN and flash kernels need a CUDA GPU")
@pytest.mark.parametrize("kernel", ["cudnn", "flash"])
@pytest.mark.parametrize("B,T,H,D,L,W,alpha", [
    (1, 37, 1, 8, 16, 5, 0.7), (2, 100, 2, 8, 16, 70, 0.5), (1, 130, 2, 12, 32, 0, -0.3),
    (1, 70, 3, 8, 16, 3, None), (2, 333, 4, 64, 64, 64, 0.5), (2, 13, 2, 8, 16, 10, 0.5),
    (2, 12, 2, 8, 16, 10, 0.5),
])
def test_fused_split_half_precision(kernel, B, T, H, D, L, W, alpha, monkeypatch):
    """The split form on each SDPA kernel at odd shapes, bf16 against naive in fp32: the output and the tensor
    gradients as close as SDPA's own bf16 error allows (below), and dα, a sum that nearly cancels, no further off
    than the all-Triton form's."""
    monkeypatch.setattr("ops.ramla.fused.FAR", "triton")
    ref = fused_vs_naive(B, T, H, D, L, W, alpha, "cuda", torch.bfloat16)
    monkeypatch.setattr("ops.ramla.fused.FAR", "sdpa")
    monkeypatch.setattr("ops.ramla.fused.FAR_KERNEL", kernel)
    errs = fused_vs_naive(B, T, H, D, L, W, alpha, "cuda", torch.bfloat16)
    assert_within_sdpa_bf16_error((B, T, H, D, L, W), ref, errs)
    assert alpha is None or errs[6] < 2 * ref[6] + 1e-2, (errs[6], ref[6])


def test_fused_split_refuses_fp32_on_gpu(monkeypatch):
    """FAR = 'sdpa' on an fp32 GPU tensor is an error naming the remedy, not a quiet switch to Triton."""
    from ops import BackendError
    from ops.ramla import fused

    class FakeCudaFp32:   # far_kernel reads only device, dtype and shape, so no GPU is needed
        device, dtype = torch.device("cuda"), torch.float32
        shape = (1, 1, fused.FAR_MIN_T, 16)   # long enough that 'auto' declines for the dtype, not the length

    monkeypatch.setattr("ops.ramla.fused.FAR", "sdpa")
    with pytest.raises(BackendError, match="FAR = 'triton'"):
        fused.far_kernel(FakeCudaFp32())
    monkeypatch.setattr("ops.ramla.fused.FAR", "auto")
    assert fused.far_kernel(FakeCudaFp32()) is None


def test_fused_auto_splits_long_sequences_only(monkeypatch):
    """'auto' keeps every score in Triton below FAR_MIN_T (where the split saved too little to give up a
    bitwise-repeatable backward) and splits from it."""
    from ops.ramla import fused

    monkeypatch.setattr("ops.ramla.fused.FAR", "auto")
    short, long = (torch.empty(1, 1, t, 16) for t in (fused.FAR_MIN_T - 1, fused.FAR_MIN_T))
    assert fused.far_kernel(short) is None and fused.far_kernel(long) == "cpu"


def test_deterministic_mode_keeps_cudnn_out(monkeypatch):
    """Under torch.use_deterministic_algorithms 'auto' stays all Triton at any length, a forced split takes
    FlashAttention-2 (torch runs its backward deterministically then), and asking for cuDNN's backward, which
    is not bitwise repeatable, is an error naming the remedy."""
    from ops import BackendError
    from ops.ramla import far, fused

    class FakeHopperBf16:   # far_kernel and choose read only device, dtype and shape
        device, dtype, shape = torch.device("cuda"), torch.bfloat16, (1, 1, fused.FAR_MIN_T, 16)

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    q = FakeHopperBf16()
    monkeypatch.setattr("ops.ramla.fused.FAR", "auto")
    assert fused.far_kernel(q) == "cudnn"                     # the control: the same call splits on cuDNN
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert fused.far_kernel(q) is None
    monkeypatch.setattr("ops.ramla.fused.FAR", "sdpa")
    assert fused.far_kernel(q) == "flash"
    with pytest.raises(BackendError, match="FAR_KERNEL = 'flash'"):
        far.choose(q, "cudnn")
    monkeypatch.setattr(torch.backends.cuda, "flash_sdp_enabled", lambda: False)   # then only cuDNN is left
    with pytest.raises(BackendError, match="flash kernel enabled"):
        far.choose(q, "auto")
    monkeypatch.setattr(torch, "is_deterministic_algorithms_warn_only_enabled", lambda: True)
    with pytest.warns(UserWarning, match="not deterministic"):
        assert far.choose(q, "cudnn") == "cudnn"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="full shapes need a CUDA GPU")
@pytest.mark.parametrize("far", ["sdpa", "triton"])
@pytest.mark.parametrize("alpha", [0.5, None])
def test_fused_bf16_full_shape(alpha, far, monkeypatch):
    """GPT-2 124M's shape (B8 T2048 H12 D64 L64 W64) in bf16 against naive in fp32, in both forms. dα, one sum
    over B·H·T·W terms of both signs, has no SDPA counterpart: within 2e-2 (1.0e-2 on the H100)."""
    monkeypatch.setattr("ops.ramla.fused.FAR", far)
    errs = fused_vs_naive(8, 2048, 12, 64, 64, 64, alpha, "cuda", torch.bfloat16)
    assert_within_sdpa_bf16_error((8, 2048, 12, 64, 64, 64), errs)
    assert alpha is None or errs[6] < 2e-2, errs[6]


def assert_within_sdpa_bf16_error(shape: tuple, *runs: list[float]) -> None:
    """Each run's output and tensor-gradient errors (bf16, at shape (B, T, H, D, L, W)) within twice PyTorch's own
    bf16 error on the nearest chain it has, measured once for all runs: plain MLA on SDPA's bf16 kernel (naive with
    α = None) against the same fp32 oracle and inputs, plus 1e-3 of rounding slack: the projections' rule
    (tests/ops/test_proj_out.py). A flat 5e-3 would leave no room: SDPA's own error reaches 4.5e-3 (∂q at
    B1 T37 H1 on the H100), fused's 4.9e-3."""
    sdpa = fused_vs_naive(*shape, None, "cuda", torch.bfloat16, op=ramla)
    names = ["o", "dq", "dk_lat", "dv_lat", "dw_ql", "dw_vu"]
    for errs in runs:
        bad = {n: (e, r) for n, e, r in zip(names, errs, sdpa) if not e <= 2 * r + 1e-3}
        assert not bad, f"(op, SDPA bf16) errors: {dict(zip(names, zip(errs, sdpa)))}"


@pytest.mark.parametrize("heads_per_program", [2, 6])
def test_fused_head_groups(heads_per_program, device, far_mode, monkeypatch):
    """The backward's head groups (several heads summed on chip per program) change nothing."""
    monkeypatch.setattr("ops.ramla.fused.HEADS_PER_PROGRAM", heads_per_program)
    errs = fused_vs_naive(1, 90, 6, 8, 16, 20, 0.5, device)
    assert all(e < 2e-5 for e in errs), errs


def test_fused_other_tiles(device, far_mode, monkeypatch):
    """Tiles the sweep tries (BM ≠ BN in every kernel) give the same results."""
    monkeypatch.setattr("ops.ramla.fused.TILES", {"fwd": dict(BM=32, BN=16, num_warps=4, num_stages=2),
                                                  "dkv": dict(BM=16, BN=32, num_warps=4, num_stages=2),
                                                  "dq": dict(BM=32, BN=16, num_warps=4, num_stages=2)})
    errs = fused_vs_naive(2, 75, 2, 8, 16, 20, 0.5, device)
    assert all(e < 2e-5 for e in errs), errs


def test_fused_alpha_shapes_and_no_double_backward(device):
    """α of shape [1] or without requires_grad works as in naive; a second-order gradient is an error."""
    from ops.ramla import fused

    inputs = [x.float().to(device).requires_grad_() for x in make_inputs(1, 40, 2, 8, 16)]
    for alpha in (torch.tensor([0.5], device=device, requires_grad=True), torch.tensor(0.5, device=device)):
        ref = ramla(*inputs, alpha, 6)
        assert rel_err(fused.ramla(*inputs, alpha, 6), ref) < 2e-5
    o = fused.ramla(*inputs, torch.tensor(0.5, device=device), 6)
    (dq,) = torch.autograd.grad(o.square().sum(), inputs[:1], create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|double backward|second"):
        dq.sum().backward()
