"""The fused short causal conv (ops/proj/short_conv.py) against model.common.ShortConv (F.conv1d + SiLU) and
F.normalize: the output and the gradients of x, the weight and the bias; fp32 at ragged sizes under the Triton
interpreter (tiles BT = 8 rows × 16 channels or one head there), strided column slices, bf16, a zero-norm head."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.common import ShortConv
from ops.proj.short_conv import short_conv, short_conv_ref
from tests.helpers import rel_err


@pytest.fixture(autouse=True)
def exact_fp32_convs():
    """The oracle's conv1d in true fp32 on the GPU (cuDNN may otherwise use TF32)."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old


def make_conv(C, W, bias, device, seed=0):
    torch.manual_seed(seed)
    conv = ShortConv(C, W, bias=bias).to(device)
    if bias:
        with torch.no_grad():
            conv.conv.bias.normal_()                                 # not nn.Conv1d's small uniform init
    return conv


def oracle(conv, x, head_dim):
    y = conv(x)                                                      # the model's own module
    if head_dim is None:
        return y
    B, T, C = y.shape
    return F.normalize(y.view(B, T, C // head_dim, head_dim), dim=-1, eps=1e-6).view(B, T, C)


def grads(y, leaves, dy):
    return torch.autograd.grad(y, leaves, dy)


# (B, T, C, W, head_dim, bias, strided). T ragged against BT = 8, below W, = 1; C ragged against the 16-channel
# block; head_dim 8 (two heads per block, the last block half-empty), 12 and 24 (padded to 16 / 32 lanes), 32
# (wider than 16); W = 4, 3, 2, 1. strided: x = wide[:, 2:, 8:8 + C] of a [B, T + 2, C + 24] tensor, so the
# rows before t = 0 hold data that a halo read past the start would pick up, and the gradient flows to `wide`.
SHAPES = [(2, 19, 40, 4, None, True, False), (1, 3, 24, 4, None, False, False), (1, 1, 16, 4, 16, True, False),
          (2, 21, 48, 2, 16, True, True), (1, 17, 40, 4, 8, False, True), (2, 13, 36, 4, 12, True, False),
          (1, 9, 64, 3, 32, False, True), (1, 10, 20, 1, None, True, True), (2, 11, 48, 4, 24, True, True),
          (1, 26, 33, 4, None, False, True)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}C{}W{}hd{}{}{}".format(
    *s[:5], "-bias" if s[5] else "", "-strided" if s[6] else ""))
def test_matches_shortconv_fp32(shape, device, poison_empty):
    """fp32: the output and every gradient within 1e-5 (no dots, only sums of ≤ W + head_dim terms)."""
    B, T, C, W, head_dim, bias, strided = shape
    conv = make_conv(C, W, bias, device)
    if strided:
        wide = torch.randn(B, T + 2, C + 24, device=device, requires_grad=True)
        x, leaf = wide[:, 2:, 8:8 + C], wide
    else:
        x = leaf = torch.randn(B, T, C, device=device, requires_grad=True)
    leaves = [leaf, conv.conv.weight] + ([conv.conv.bias] if bias else [])
    ref = oracle(conv, x, head_dim)
    y = short_conv(x, conv.conv.weight, conv.conv.bias, head_dim=head_dim)
    assert y.shape == (B, T, C) and y.dtype == torch.float32 and y.is_contiguous()
    assert rel_err(y, ref) < 1e-5
    dy = torch.randn_like(ref)
    for name, g, r in zip(["x", "weight", "bias"], grads(y, leaves, dy), grads(ref, leaves, dy)):
        assert g.shape == r.shape, name
        assert rel_err(g, r) < 1e-5, name


def test_zero_and_tiny_norm_heads(device, poison_empty):
    """A head whose inputs are all zero and one whose ‖y‖ is positive but below eps (no bias): F.normalize
    divides both by eps, and its gradient there is dn / eps with no projection term. Each head is compared on
    its own (these heads' gradients are ~1e6 times larger than the others')."""
    B, T, C, W, hd = 2, 11, 64, 4, 16
    conv = make_conv(C, W, False, device)
    base = torch.randn(B, T, C, device=device)
    base[..., hd:2 * hd] = 0
    base[..., 2 * hd:3 * hd] *= 3e-8
    x = base.requires_grad_()
    ref, y = oracle(conv, x, hd), short_conv(x, conv.conv.weight, head_dim=hd)
    norms = conv(x.detach()).reshape(B, T, C // hd, hd).norm(dim=-1)                  # ‖y‖ per head
    assert (norms[..., 1] == 0).all() and (norms[..., 2] > 0).all() and (norms[..., 2] < 1e-6).all()
    dy = torch.randn_like(ref)
    (gx, gw), (rx, rw) = grads(y, [x, conv.conv.weight], dy), grads(ref, [x, conv.conv.weight], dy)
    for h in range(C // hd):
        cs = slice(h * hd, (h + 1) * hd)
        assert rel_err(y[..., cs], ref[..., cs]) < 1e-5, h                      # 0 against 0 in the zero head
        assert rel_err(gx[..., cs], rx[..., cs]) < 1e-5, h
        assert rel_err(gw[cs], rw[cs]) < 1e-5, h


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_bf16(x_dtype, device):
    """out_dtype bf16: y is the fp32 result rounded once to bf16, an error below 2⁻⁷ of each element even when
    the rounding truncates (the interpreter's fp32 → bf16 casts do; the GPU's round to nearest, half that). The
    backward gets a bf16 dy; against the fp32 oracle fed that same dy, dweight and dbias (fp32, fp32 math) stay
    within 1e-5, and dx within 1e-5 in fp32 or one bf16 rounding (2⁻⁷) when x is bf16."""
    B, T, C, W, hd = 2, 19, 48, 4, 16
    conv = make_conv(C, W, True, device)
    x = torch.randn(B, T, C, device=device).to(x_dtype).requires_grad_()
    leaves = [x, conv.conv.weight, conv.conv.bias]
    y = short_conv(x, conv.conv.weight, conv.conv.bias, head_dim=hd, out_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16
    ref = oracle(conv, x.float(), hd)
    assert rel_err(y, ref) < 2 ** -7
    dy = torch.randn(B, T, C, device=device).bfloat16()
    (gx, gw, gb), (rx, rw, rb) = grads(y, leaves, dy), grads(ref, leaves, dy.float())
    assert gx.dtype == x_dtype and gw.dtype == gb.dtype == torch.float32
    assert rel_err(gx, rx) < (1e-5 if x_dtype == torch.float32 else 2 ** -7)
    assert rel_err(gw, rw) < 1e-5 and rel_err(gb, rb) < 1e-5


def test_a_wrong_shift_would_be_caught(device):
    """The oracle tells causal from shifted by one step: the kernel matches the first and not the second."""
    B, T, C, W = 1, 12, 16, 4
    x, w = torch.randn(B, T, C, device=device), torch.randn(C, W, device=device)
    y = short_conv(x, w)
    shifted = F.silu(F.conv1d(x.transpose(1, 2), w[:, None], padding=W - 1, groups=C)[..., 1:T + 1].transpose(1, 2))
    assert rel_err(y, short_conv_ref(x, w)) < 1e-5 and rel_err(y, shifted) > 0.1


def test_rejects_bad_arguments(device):
    x, w = torch.randn(1, 4, 32, device=device), torch.randn(32, 4, device=device)
    with pytest.raises(ValueError, match="unit channel stride"):
        short_conv(x.transpose(1, 2).contiguous().transpose(1, 2), w)
    with pytest.raises(ValueError, match="W ≤ 4 .*--fuse without proj"):
        short_conv(x, torch.randn(32, 5, device=device))
    with pytest.raises(ValueError, match="head_dim 12 must divide"):
        short_conv(x, w, head_dim=12)
    with pytest.raises(ValueError, match="bias must be"):
        short_conv(x, w, torch.randn(16, device=device))
