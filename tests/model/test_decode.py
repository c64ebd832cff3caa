"""Recurrent generation: prefill + N decode steps give the full-sequence forward's logits at every position, for
every family on every backend that runs here (Triton on the GPU, or under TRITON_INTERPRET=1 on a CPU; plain GPT-2's
fused attention is a CUDA kernel), for a batch of prompts of different lengths (odd, and a single token) left-padded in
one tensor; and the fused decode kernel against the naive step at extreme decays. fp32 throughout: ‖a − b‖ / ‖b‖ ≤ 1e-5 (the step recurrence against the chunkwise
form sums the same terms in another order)."""
from __future__ import annotations

import importlib

import pytest
import torch

from model import build_model
from model.config import ModelConfig
from ops import get_op
from tests.helpers import rel_err

TOL = 1e-5          # fp32, relative RMS, logits of a 2-layer model; observed ~3e-7

FAMILIES = {"gla": {}, "gated_deltanet": {}, "mamba2": {}, "gpt2": {},
            "ramla": dict(family="gpt2", attention="ramla", ra_window=3),
            "mla": dict(family="gpt2", attention="ramla", ra_alpha=0.0, ra_learnable=False)}


def tiny_cfg(name: str, backend: str) -> ModelConfig:
    kw = dict(family=name, backend=backend, vocab_size=64, d_model=32, n_layers=2, n_heads=2, head_k_dim=8,
              head_v_dim=16, mlp_hidden=64, chunk_size=16, ssm_head_dim=16, ssm_state=8, ssm_groups=2,
              max_seq_len=64, latent_dim=8)
    return ModelConfig(**{**kw, **FAMILIES[name]})


def check_decode(model, lengths: list[int], n_new: int, seed: int, pad: int = 0) -> None:
    """Row b's text is idx[b, :len_b + n_new]: its prompt (left-padded into a [B, max len] tensor) is prefilled, the
    rest fed one token per step; every logit row is compared with one full forward of idx (causal, so each row's
    tokens past its own text do not matter). pad: padding columns beyond the longest prompt. The tokens are drawn on
    the CPU and moved to the model's device."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths) + pad
    idx = torch.randint(0, model.cfg.vocab_size, (B, T + n_new), generator=g)
    prompt = torch.randint(0, model.cfg.vocab_size, (B, T), generator=g)      # the padding: arbitrary tokens
    for b, n in enumerate(lengths):
        prompt[b, T - n:] = idx[b, :n]
    device = next(model.parameters()).device
    idx, prompt = idx.to(device), prompt.to(device)
    with torch.no_grad():
        ref = model(idx)[0]                                                     # [B, T + n_new, vocab]
        logits, cache = model.prefill(prompt, lengths, all_logits=True)
        for b, n in enumerate(lengths):
            assert (err := rel_err(logits[b, T - n:], ref[b, :n])) <= TOL, ("prefill", b, err)
        for s in range(n_new):
            step = model.step(torch.stack([idx[b, n + s] for b, n in enumerate(lengths)]), cache)
            for b, n in enumerate(lengths):
                assert (err := rel_err(step[b], ref[b, n + s])) <= TOL, ("step", s, b, err)
    assert cache.pos.tolist() == [n + n_new for n in lengths]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_naive_decode_equals_forward(name):
    torch.manual_seed(0)
    model = build_model(tiny_cfg(name, "naive")).eval()
    check_decode(model, [9, 1, 4, 9], n_new=6, seed=torch.seed() % 2**31)     # W = 3 < the band's reach
    check_decode(model, [1], n_new=3, seed=torch.seed() % 2**31)               # a one-token prompt, batch 1
    check_decode(model, [3, 3], n_new=3, seed=torch.seed() % 2**31, pad=2)    # equal lengths, all rows padded


TRITON = [("gla", "fused"), ("gated_deltanet", "fused"), ("mamba2", "fused"), ("gla", "chunk"),
          ("gated_deltanet", "chunk"), ("mamba2", "chunk"), ("ramla", "fused")]   # plain GPT-2's fused is CUDA


@pytest.mark.parametrize("name, backend", TRITON, ids=[f"{n}-{b}" for n, b in TRITON])
@pytest.mark.usefixtures("exact_fp32_matmuls", "exact_fp32_convs")
def test_triton_decode_equals_forward(name, backend, device):
    """Prefill on the chunk / fused ops (and on `fused`, the fused projection chains), decode on the step kernel;
    on `device` (the GPU when present, else the CPU under the interpreter)."""
    torch.manual_seed(0)
    cfg = tiny_cfg(name, backend)
    cfg.n_layers = 1                                  # the interpreter is slow: one layer, few tokens
    cfg.latent_dim = 16                               # the flash RA+MLA kernel's smallest L
    model = build_model(cfg).to(device).eval()
    if name != "ramla":                               # RA+MLA decodes in PyTorch on every backend
        assert set(model.decode_backends().values()) == {"fused" if backend == "fused" else "fused (decode of chunk)"}
    check_decode(model, [5, 1], n_new=2, seed=torch.seed() % 2**31)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 tensor-core paths need a CUDA GPU")
@pytest.mark.parametrize("name, backend", TRITON, ids=[f"{n}-{b}" for n, b in TRITON])
@pytest.mark.usefixtures("exact_fp32_matmuls", "exact_fp32_convs")
def test_bf16_decode_is_within_the_forwards_bf16_error(name, backend):
    """Under bf16 autocast (as eval/generate.py decodes), prefill + steps against the fp32 full forward: no further
    from it than twice the bf16 full forward is (the step rounds the same operands as the chunked form, summed in
    another order). A wrong state or conv tail would be O(1) away."""
    torch.manual_seed(0)
    cfg = tiny_cfg(name, backend)
    cfg.latent_dim = 16
    model = build_model(cfg).cuda().eval()
    idx = torch.randint(0, cfg.vocab_size, (3, 48), device="cuda")
    P = 29
    with torch.no_grad():
        ref = model(idx)[0][:, P - 1:].float()                                  # fp32, positions P-1 … 47
        with torch.autocast("cuda", torch.bfloat16):
            fwd = model(idx)[0][:, P - 1:].float()
            logits, cache = model.prefill(idx[:, :P])
            dec = [logits.float()] + [model.step(idx[:, t], cache).float() for t in range(P, idx.shape[1])]
    err_dec, err_fwd = rel_err(torch.stack(dec, 1), ref), rel_err(fwd, ref)
    assert err_dec <= max(2 * err_fwd, 1e-3), (err_dec, err_fwd)


STEP_CASES = [("gla_step", dict(B=2, H=3, K=12, V=40), dict(decay=d)) for d in ("model", "near0", "extreme", "mixed")]
STEP_CASES += [("gated_delta_step", dict(B=2, H=1, K=16, V=24), dict(decay=d, beta=b))
               for d, b in (("model", "model"), ("extreme", "near1"), ("near0", "near0"))]
STEP_CASES += [("ssd_step", dict(B=3, H=4, P=20, G=2, N=6), dict(decay=d)) for d in ("model", "large")]


@pytest.mark.parametrize("op, shape, regime", STEP_CASES, ids=[f"{c[0]}-{'-'.join(c[2].values())}" for c in STEP_CASES])
@pytest.mark.usefixtures("exact_fp32_matmuls")
def test_fused_step_kernel_equals_naive_step(op, shape, regime, device, poison_empty):
    """Output and in-place state of the Triton step against the PyTorch step: K ≠ V, a ragged last V-tile, H = 1,
    grouped B/C, decays from none to the state wiped in one step; q, k as strided views of a wider buffer."""
    naive = importlib.import_module(f"ops.{op}.naive")
    kw = naive.make_inputs(shape, device=device, seed=torch.seed() % 2**31, **regime)
    first = next(iter(kw))
    wide = torch.cat([kw[first], torch.randn_like(kw[first])], -1)            # a strided view, as from a GEMM
    kw[first] = wide[..., :kw[first].shape[-1]]
    got_kw = {n: t.clone() if n == "state" else t for n, t in kw.items()}
    o_ref, s_ref = get_op(op, "naive")(**kw)
    o, s = get_op(op, "fused")(**got_kw)
    assert s is got_kw["state"]                                                # updated in place
    assert rel_err(o, o_ref) <= TOL and rel_err(s, s_ref) <= TOL, (rel_err(o, o_ref), rel_err(s, s_ref))


def test_step_is_the_recurrence():
    """T naive steps from a state equal the ops' own token-by-token oracles (fp64: the same sums, ≤ 1e-12)."""
    from ops.gated_delta.naive import gated_delta_recurrent, make_inputs
    from ops.gated_delta_step.naive import gated_delta_step

    kw = make_inputs(dict(B=2, T=5, H=2, K=6, V=7), torch.float64, seed=torch.seed() % 2**31, requires_grad=False,
                     initial_state=True)
    o_ref, s_ref = gated_delta_recurrent(**kw, output_final_state=True)
    S = kw["initial_state"].clone()
    o = torch.stack([gated_delta_step(*(kw[n][:, t] for n in ("q", "k", "v", "g", "beta")), S)[0] for t in range(5)], 1)
    assert rel_err(o, o_ref) <= 1e-12 and rel_err(S, s_ref) <= 1e-12


def test_generate_greedy_equals_the_uncached_loop():
    """CausalLM.generate (greedy) against re-running the whole text for every token."""
    from eval.generate import sample

    torch.manual_seed(0)
    model = build_model(tiny_cfg("gated_deltanet", "naive")).eval()
    idx = torch.randint(0, 64, (2, 5))
    new = model.generate(idx, 7)
    assert torch.equal(torch.cat([idx, new], 1), sample(model, idx, 7, window=64, temperature=0))


def test_decode_labels_name_the_backend_that_runs():
    assert get_op("gla_step", "fused").__module__ == "ops.gla_step.fused"
    for name in ("gla", "gated_deltanet", "mamba2"):
        labels = build_model(tiny_cfg(name, "naive")).decode_backends()
        assert list(labels.values()) == ["naive"], labels
