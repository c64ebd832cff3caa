"""The fused GLA kernels (ops/gla/scan.py, scan_bwd.py) through the op, against the fp64
recurrence: each of their two paths alone (the factorised scores; the exact one, forced with
max_range < 0), both in one sequence (tame chunks next to chunks whose decay exceeds the threshold,
so the backward's two launches must cover every chunk between them), and the split-state mode.
tests/ops/test_gla.py runs the `fused` backend over every shape, decay and chunk size besides."""
from __future__ import annotations

import pytest
import torch

from ops.gla import scan as fused_scan
from ops.gla.fused import fused_chunk_gla
from ops.gla.naive import gla_recurrent
from tests.helpers import rel_err
from tests.ops.test_gla import assert_matches_recurrence, fp32_bound, make_inputs


def tame_chunks(gk: torch.Tensor, chunk: int) -> torch.Tensor:
    """Per (batch, chunk, head): whether the kernels factorise it, −Σ gk ≤ MAX_RANGE for every key dim."""
    B, T, H, K = gk.shape
    pad = torch.nn.functional.pad(gk.double().cpu(), (0, 0, 0, 0, 0, -T % chunk))
    return (-pad.view(B, -1, chunk, H, K).sum(2) <= fused_scan.MAX_RANGE).all(-1)


def tame_inputs(shape, chunk: int, seed: int) -> list[torch.Tensor]:
    """Decays in (−5/16, 0], the range of GLA's logsigmoid/16 gate: every chunk factorised (asserted)."""
    q, k, v, gk, h0 = make_inputs(*shape, "realistic", seed=seed)
    gk = gk / 16
    assert tame_chunks(gk, chunk).all()
    return [x.float() for x in (q, k, v, gk, h0)]


def switching_inputs(device: str, B=1, T=150, H=2, K=8, V=12, chunk=32):
    """Tame decays, except odd chunks, whose steps of −3 sum past MAX_RANGE: both paths in one sequence."""
    q, k, v, gk, h0 = tame_inputs((B, T, H, K, V), chunk, seed=0)
    wild = ((torch.arange(T) // chunk) % 2 == 1).view(1, T, 1, 1)
    gk = torch.where(wild, torch.full_like(gk, -3.0), gk)
    tame = tame_chunks(gk, chunk)
    assert tame.any() and not tame.all()
    return [x.to(device) for x in (q, k, v, gk, h0)]


@pytest.fixture(autouse=True)
def scan(monkeypatch):
    """The scan forward at these small shapes, where the model would take chunk's (launch-bound either way);
    tests that mean the other path say so."""
    monkeypatch.setattr("ops.gla.fused.scan_pays", lambda *a: True)


def op(chunk_size: int = 64, max_range: float = fused_scan.MAX_RANGE, split_state: bool = False):
    return lambda q, k, v, gk, initial_state, output_final_state: fused_chunk_gla(
        q, k, v, gk, q.shape[-1] ** -0.5, initial_state, output_final_state, chunk_size, split_state, max_range)


@pytest.mark.parametrize("max_range", [fused_scan.MAX_RANGE, -1.0], ids=["factorised", "exact"])
@pytest.mark.parametrize("shape", [(2, 50, 2, 8, 6), (1, 5, 1, 4, 4), (1, 130, 1, 20, 12), (1, 70, 1, 80, 20)],
                         ids=lambda s: "B{}T{}H{}K{}V{}".format(*s))
def test_each_path_matches_recurrence(max_range, shape, device, poison_empty):
    """K = 80 spans two key tiles of the backward, so dv comes from its own kernel."""
    inputs = [x.to(device) for x in tame_inputs(shape, 32, seed=1)]
    assert_matches_recurrence(op(32, max_range), inputs, 1e-5)


def test_tame_and_wild_chunks_in_one_sequence(device, poison_empty):
    assert_matches_recurrence(op(32), switching_inputs(device), 1e-5)


def test_exact_path_at_extreme_decays(device, poison_empty):
    """Steps of −50: every chunk takes the exact path, forward and backward."""
    inputs = [x.float().to(device) for x in make_inputs(1, 70, 1, 8, 6, "extreme", seed=2)]
    assert not tame_chunks(inputs[3], 16).any()
    assert_matches_recurrence(op(16), inputs, 1e-5)


def test_split_states_mode(device, poison_empty, short_segments):
    """With the `state` component at a split length the forward is chunk's stages after the split scan
    (ops.gla.fused.scan_forward), and the backward the fused one."""
    from ops.chunkwise.state import split_segments

    assert split_segments(1, 1, 8, 6, 600, 64, torch.device(device)) == 2
    inputs = switching_inputs(device, B=1, T=600, H=1, K=8, V=6, chunk=64)
    assert_matches_recurrence(op(64, split_state=True), inputs, 1e-5)


def test_parallel_forward_where_the_scan_does_not_pay(device, poison_empty, monkeypatch):
    """Where the model prefers chunk's parallel forward (movement.scan_pays), the backward is the fused
    one all the same."""
    monkeypatch.setattr("ops.gla.fused.scan_pays", lambda *a: False)
    assert_matches_recurrence(op(32), switching_inputs(device, K=20), 1e-5)


@pytest.mark.parametrize("forward,inputs", [("scan", "mixed"), ("parallel", "switching")])    # each forward, each input
def test_chunks_of_256_keep_every_fourth_state(forward, inputs, device, poison_empty, monkeypatch):
    """C = 256: 64-row sub-blocks, states kept at 256-row boundaries and the other three recomputed in the
    backward (ops.gla.fused.SUB_BLOCK). T = 300 ends in a ragged interval; tame sub-blocks alternate with
    wild ones, or all are wild (`mixed`: half the key dims at −50 per step, half barely decaying, so the
    kept states still carry), so both paths run inside one interval, forward and every gradient."""
    from ops.chunkwise import state as chunk_h

    monkeypatch.setattr("ops.gla.fused.scan_pays", lambda *a: forward == "scan")
    kept = []
    real = chunk_h.chunk_fwd_h_from
    monkeypatch.setattr("ops.gla.fused.chunk_fwd_h_from", lambda k, v, b, h, *a, **kw: kept.append(h.shape[1]) or
                        real(k, v, b, h, *a, **kw))
    if inputs == "switching":
        args, tol = switching_inputs(device, B=1, T=300, H=1, K=20, V=6, chunk=64), 1e-5
    else:   # steps of −50 sum to |b| ~ 3200 within a sub-block, whose fp32 ulp fp32_bound adds (as at C = 64)
        args = [x.float().to(device) for x in make_inputs(1, 300, 1, 8, 6, "mixed", seed=5)]
        tol = fp32_bound("mixed", args[3], 64)
    assert_matches_recurrence(op(256), args, tol)
    assert kept == [2]


def test_chunks_of_256_with_the_split_state(device, poison_empty, short_segments):
    """The `state` component splits the sub-blocks' scan (two segments of five 64-row chunks at T = 600)
    under 256-row state intervals."""
    from ops.chunkwise.state import split_segments

    assert split_segments(1, 1, 8, 6, 600, 64, torch.device(device)) == 2
    assert_matches_recurrence(op(256, split_state=True), switching_inputs(device, B=1, T=600, H=1, K=8, V=6,
                                                                          chunk=64), 1e-5)


def test_the_model_decides_the_forward():
    """The scan at the MVE shape and the gla_340m layer; chunk's forward at K = 256 and for one long sequence."""
    from ops.gla.movement import scan_pays

    assert scan_pays(16, 2048, 12, 64, 64, 64, 2) and scan_pays(8, 2048, 4, 128, 256, 64, 2)
    assert not scan_pays(8, 2048, 4, 256, 512, 64, 2) and not scan_pays(1, 32768, 4, 128, 128, 64, 2)


def test_no_backward_state_without_grad(device, monkeypatch):
    """Without gradients the forward stores neither b nor the chunk states."""
    seen = []
    real = fused_scan.fused_scan_fwd

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out[2:])
        return out

    monkeypatch.setattr("ops.gla.fused.fused_scan_fwd", spy)
    q, k, v, gk, h0 = [x.float().to(device) for x in make_inputs(1, 20, 1, 4, 4, "realistic", seed=3)]
    with torch.no_grad():
        fused_chunk_gla(q.requires_grad_(), k, v, gk, 0.5, h0, False)
    fused_chunk_gla(q, k, v, gk, 0.5, h0, False)
    assert seen[0] == (None, None) and all(x is not None for x in seen[1])


@pytest.mark.parametrize("shape", [(2, 150, 2, 8, 6), (1, 200, 3, 16, 150)], ids=["V6", "V150"])
def test_forward_without_grad_matches_recurrence(shape, device, poison_empty):
    """Evaluation's path: no b or h stored (SAVE off), one V tile and several; the outputs as the recurrence's.
    On the H100 this path once went wrong by 16 while the one with stores was right (movement.MIN_BV)."""
    q, k, v, gk, h0 = [x.to(device) for x in tame_inputs(shape, 32, seed=4)]
    ref, ref_s = gla_recurrent(*(x.double() for x in (q, k, v, gk)), initial_state=h0.double(),
                               output_final_state=True)
    with torch.no_grad():
        o, s = op(32)(q, k, v, gk, h0, True)
    assert rel_err(o, ref) < 1e-5 and rel_err(s, ref_s) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the miscompile this guards against is Hopper's")
@pytest.mark.parametrize("save", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("K, V, BV, warps", [(64, 64, 64, 4), (64, 64, 64, 8), (64, 48, 64, 4), (128, 256, 64, 8),
                                             (128, 256, 128, 8), (128, 256, 128, 4)])
def test_every_candidate_launch_on_the_gpu(K, V, BV, warps, save):
    """Each V tile and warp count the model can pick (movement.candidates), with and without the backward's
    stores, bf16: the output within 5e-3 of the fp32 oracle."""
    from ops.gla.naive import gla

    torch.manual_seed(0)
    q, k = (torch.randn(3, 1000, 4, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(3, 1000, 4, V, device="cuda", dtype=torch.bfloat16)
    gk = torch.nn.functional.logsigmoid(torch.randn(3, 1000, 4, K, device="cuda")) / 16
    o, *_ = fused_scan.fused_scan_fwd(q, k, v, gk, K ** -0.5, None, False, 64, save, BV=BV, num_warps=warps)
    ref, _ = gla(q.float(), k.float(), v.float(), gk, K ** -0.5)
    assert rel_err(o, ref) < 5e-3


def test_narrow_v_tiles_refused_on_a_gpu(monkeypatch):
    """BV below MIN_BV would miscompile on Hopper: a launch override asking for it is an error there."""
    from ops.gla.movement import MIN_BV

    x = torch.zeros(1, 4, 1, 16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with pytest.raises(ValueError, match=f"BV >= {MIN_BV}"):
        fused_scan.fused_scan_fwd(x, x, x, x, 1.0, None, False, 16, False, BV=32, num_warps=4)


def test_key_dim_limit():
    x = torch.zeros(1, 4, 1, 260)
    with pytest.raises(ValueError, match="K ≤ 256"):
        fused_scan.fused_scan_fwd(x, x, x, x, 1.0, None, False, 16, False)
