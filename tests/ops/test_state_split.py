"""The split state scan (ops/chunkwise/state.py, `segments` > 1) against the sequential
`_ref`s and against the one-segment launch, forward (h, final state) and backward (dh, dh0).

Decays from none (every carry reaches the end undiminished, so a wrong carry cannot hide) to −50
per step; ragged T; one chunk per segment; more segments asked for than there are chunks; scalar
and per-key decays; with and without initial state / final-state gradient.
"""
from __future__ import annotations

import pytest
import torch

from ops.chunkwise.state import (chunk_bwd_dh, chunk_bwd_dh_ref, chunk_fwd_h, chunk_fwd_h_from, chunk_fwd_h_ref,
                                split_segments)
from ops.chunkwise.cumsum import chunk_cumsum
from tests.helpers import rel_err

GATES = {"none": lambda s: torch.zeros(s), "slow": lambda s: -torch.rand(s) * 1e-3,
         "realistic": lambda s: -torch.rand(s) * 3 / 8, "extreme": lambda s: -torch.rand(s) * 50}
# B, T, H, K, V, C, segments
CASES = [(1, 300, 2, 16, 24, 16, 3), (2, 130, 1, 8, 40, 16, 2), (1, 100, 1, 20, 12, 32, 4),
         (1, 70, 1, 140, 12, 16, 5), (1, 50, 1, 4, 4, 16, 9)]


def inputs(case, gate, scalar, dtype, device):
    B, T, H, K, V, C, _ = case
    torch.manual_seed(0)
    g = GATES[gate]((B, T, H, 1 if scalar else K)).to(device)
    q, k = (torch.randn(B, T, H, K, device=device).to(dtype) for _ in range(2))
    v, do = (torch.randn(B, T, H, V, device=device).to(dtype) for _ in range(2))
    h0, dht = (torch.randn(B, H, K, V, device=device) for _ in range(2))
    return q, k, v, do, chunk_cumsum(g, C), h0, dht


def split_cases() -> list:
    """Every case × gate with a per-key decay; a scalar decay (another code path through the same kernels) on two
    gates a case, rotating, so that each gate meets it on two or three cases (on a GPU: on every gate)."""
    gates, gpu = list(GATES), torch.cuda.is_available()
    return [pytest.param(case, gate, scalar, id=f"{case}-{gate}-{'scalar' if scalar else 'gk'}")
            for i, case in enumerate(CASES) for j, gate in enumerate(gates)
            for scalar in (False, True) if gpu or not scalar or j in (i % 4, (i + 2) % 4)]


@pytest.mark.parametrize("case,gate,scalar", split_cases())
def test_split_scan_equals_the_sequential_one(case, gate, scalar, device, poison_empty):
    C, S = case[5], case[6]
    q, k, v, do, b, h0, dht = inputs(case, gate, scalar, torch.float32, device)
    h, ht = chunk_fwd_h(k, v, b, h0, True, C, segments=S)
    h_ref, ht_ref = chunk_fwd_h_ref(k, v, b, h0, C)
    assert rel_err(h, h_ref) < 1e-5 and rel_err(ht, ht_ref) < 1e-5
    dh, dh0 = chunk_bwd_dh(q, do, b, dht, True, 0.3, C, segments=S)
    dh_ref, dh0_ref = chunk_bwd_dh_ref(q, do, b, dht, 0.3, C)
    assert rel_err(dh, dh_ref) < 1e-5 and rel_err(dh0, dh0_ref) < 1e-5


# each case meets both gates and both decay dtypes, scalar and per-key decays paired with the dtypes the other
# way round in the second case
STEP_CASES = [pytest.param(case, gate, scalar, gdtype, id=f"{case}-{gate}-{'scalar' if scalar else 'gk'}-{name}")
              for c, case in enumerate([CASES[1], (2, 40, 2, 8, 8, 64, 1)]) for gate in ("slow", "extreme")
              for d, (name, gdtype) in enumerate([("g-fp32", torch.float32), ("g-bf16", torch.bfloat16)])
              for scalar in [(d + c) % 2 == 1]]


@pytest.mark.parametrize("case,gate,scalar,gdtype", STEP_CASES)
def test_step_decays_take_the_cumsum_in_the_kernel(case, gate, scalar, gdtype, device, poison_empty):
    """step_decays: the per-step log-decays in any dtype, the chunk-local cumsum taken in registers (fp32).
    The same states as the scan given cumsum.py's cumsum of the same values, split or not; T < C included."""
    B, T, H, K, V, C, S = case
    q, k, v, do, _, h0, dht = inputs(case, gate, scalar, torch.float32, device)
    torch.manual_seed(1)
    g = GATES[gate]((B, T, H, 1 if scalar else K)).to(device).to(gdtype)
    b = chunk_cumsum(g.float(), C)
    h_ref, ht_ref = chunk_fwd_h_ref(k, v, b, h0, C)
    dh_ref, dh0_ref = chunk_bwd_dh_ref(q, do, b, dht, 0.3, C)
    # another summation order: exp(b_L − b) of two cumsums as large as 50·C in magnitude differs by their rounding
    tol = 1e-5 + b.abs().max().item() * 2 ** -22
    for segments in sorted({1, S}):
        h, ht = chunk_fwd_h(k, v, g, h0, True, C, segments=segments, step_decays=True)
        assert rel_err(h, h_ref) < tol and rel_err(ht, ht_ref) < tol, segments
        dh, dh0 = chunk_bwd_dh(q, do, g, dht, True, 0.3, C, segments=segments, step_decays=True)
        assert rel_err(dh, dh_ref) < tol and rel_err(dh0, dh0_ref) < tol, segments
    # the flag is what makes it right: the same per-step values read as a cumsum give other states
    assert rel_err(chunk_fwd_h(k, v, g.float(), h0, True, C)[1], ht_ref) > 1e-4


# every length with both gates; per-key and scalar decays swap between the gates from one length to the next
@pytest.mark.parametrize("T, interval, gate, scalar", [
    pytest.param(T, interval, gate, (i + g) % 2 == 1, id=f"{T}-{interval}-{gate}-{'scalar' if (i + g) % 2 else 'gk'}")
    for i, (T, interval) in enumerate([(300, 64), (64, 64), (50, 64), (129, 32)])
    for g, gate in enumerate(["none", "extreme"])])
def test_states_recomputed_from_kept_ones(T, interval, gate, scalar, device, poison_empty):
    """chunk_fwd_h_from: every chunk's state from those kept every `interval` rows (what fused GLA keeps at
    C = 256), equal to the sequential scan's. Kept states are the reference's, so each interval must start
    from its own; ragged last interval, T < interval."""
    C = 16
    q, k, v, do, b, h0, dht = inputs((2, T, 2, 12, 20, C, 1), gate, scalar, torch.float32, device)
    h_ref, _ = chunk_fwd_h_ref(k, v, b, h0, C)
    kept = h_ref[:, :: interval // C].contiguous()
    h = chunk_fwd_h_from(k, v, b, kept, C, interval)
    assert h.shape == h_ref.shape and rel_err(h, h_ref) < 1e-5
    with pytest.raises(ValueError, match="cannot seed"):
        chunk_fwd_h_from(k, v, b, h_ref, C, 24)                     # not a multiple of C
    if kept.shape[1] > 1:
        with pytest.raises(ValueError, match="cannot seed"):
            chunk_fwd_h_from(k, v, b, kept[:, :1], C, interval)     # too few kept states


@pytest.mark.parametrize("with_ends", [False, True], ids=["no-h0-dht", "h0-dht"])
def test_split_without_initial_or_final_state(with_ends, device, poison_empty):
    case = (1, 200, 1, 8, 8, 16, 4)
    q, k, v, do, b, h0, dht = inputs(case, "slow", False, torch.float32, device)
    h0, dht = (h0, dht) if with_ends else (None, None)
    h, ht = chunk_fwd_h(k, v, b, h0, False, 16, segments=4)
    assert ht is None and rel_err(h, chunk_fwd_h(k, v, b, h0, False, 16)[0]) < 1e-5
    dh, dh0 = chunk_bwd_dh(q, do, b, dht, False, 0.3, 16, segments=4)
    assert dh0 is None and rel_err(dh, chunk_bwd_dh(q, do, b, dht, False, 0.3, 16)[0]) < 1e-5


def test_segments_aim_for_four_programs_per_sm():
    cpu = torch.device("cpu")                                         # planned for the H100's 132 SMs
    assert split_segments(16, 16, 64, 64, 2048, 64, cpu) == 1          # 256 programs already fill them
    assert split_segments(1, 4, 128, 128, 65536, 64, cpu) == 32        # 16 programs: 32 segments of 32 chunks
    assert split_segments(2, 2, 64, 64, 4096, 64, cpu) == 2            # 4 programs: capped at 64 // 32 chunks
    assert split_segments(4, 12, 64, 64, 2048, 64, cpu) == 1           # 48 programs, 32 chunks: too short
    assert split_segments(1, 1, 64, 64, 256, 64, cpu) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 tensor-core paths need a CUDA GPU")
@pytest.mark.parametrize("case", [(1, 8192, 4, 128, 128, 64, 9), (2, 1000, 3, 60, 100, 64, 3)], ids=["long", "odd"])
def test_split_bf16_on_the_gpu(case):
    """bf16 inputs, fp32 states: the split and the sequential scan round alike up to the order of the
    carry's additions; stored states are bf16 (2⁻⁸)."""
    C, S = case[5], case[6]
    q, k, v, do, b, h0, dht = inputs(case, "slow", False, torch.bfloat16, "cuda")
    h, ht = chunk_fwd_h(k, v, b, h0, True, C, segments=S)
    h1, ht1 = chunk_fwd_h(k, v, b, h0, True, C)
    assert rel_err(h, h1) < 1e-2 and rel_err(ht, ht1) < 1e-3
    dh, dh0 = chunk_bwd_dh(q, do, b, dht, True, 0.1, C, segments=S)
    dh1, dh01 = chunk_bwd_dh(q, do, b, dht, True, 0.1, C)
    assert rel_err(dh, dh1) < 1e-2 and rel_err(dh0, dh01) < 1e-3
