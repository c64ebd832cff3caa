"""Hugging Face interop (model/hf.py): export → transformers / fla load it → the same logits; their own
checkpoints → our model → the same logits; what does not map is refused by name.

fla's model classes call Triton kernels: the fla tests run both models on the `device` fixture (the GPU when present);
on a CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py), with the autotuner's timing stubbed (there is
no driver to time configs, so each kernel takes its first config). Logits are compared in fp32, with no TF32
matmuls or convolutions: ‖ours − theirs‖ / ‖theirs‖ ≤ 1e-5 (measured 2e-7 to 2e-6 on the CPU)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from config import Config, to_dict
from model import build_model
from model.config import ModelConfig
from model.hf import HFMappingError, export_hf, init_from_hf, load_hf
from tests.helpers import rel_err

TOL = 1e-5
VOCAB = 64
TINY = dict(d_model=32, n_layers=2, vocab_size=VOCAB)
# one config per family; each sets something off its default (untied head, K ≠ V, an MLP width, ...)
FAMILIES = {
    "gla": ModelConfig(family="gla", n_heads=2, head_k_dim=8, head_v_dim=16, mlp_hidden=48, tie_embeddings=False,
                       **TINY),
    "gated_deltanet": ModelConfig(family="gated_deltanet", n_heads=2, head_k_dim=16, head_v_dim=24, norm_eps=1e-5,
                                  o_norm_eps=1e-5, **TINY),
    "mamba2": ModelConfig(family="mamba2", ssm_head_dim=16, ssm_state=8, conv_size=3, **TINY),
}
GPT2 = ModelConfig(family="gpt2", n_heads=4, max_seq_len=48, norm_eps=1e-5, mlp_hidden=96, **TINY)
RUNTIME = ("backend", "fuse", "chunk_size")       # how our model runs, not what it computes: not in HF configs


@pytest.fixture
def fla_ready(monkeypatch):
    """fla importable, and its autotuned Triton kernels runnable: on the GPU as they are, on a CPU under the
    interpreter (see the docstring)."""
    pytest.importorskip("fla.models", reason="needs flash-linear-attention (pip install flash-linear-attention==0.6.0)")
    if not torch.cuda.is_available():
        from triton.runtime.autotuner import Autotuner

        monkeypatch.setattr(Autotuner, "_bench", lambda self, *a, config, **k: [1.0, 1.0, 1.0])


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights of trained-model scale drawn fresh (not the init: zero biases and unit norms would hide a
    swapped bias or norm): N(0, 0.2), norm gains 1 + N(0, 0.2), A_log ∈ [0, 1.5)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 1.5)
            elif p.dim() == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def ours_of(cfg: ModelConfig, state: dict | None = None, seed: int = 0) -> torch.nn.Module:
    model = build_model(cfg)
    if state is None:
        return randomize_(model, seed)
    model.load_state_dict(state, strict=True)
    return model.eval()


@torch.no_grad()
def logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if hasattr(model, "blocks"):                  # ours; else a transformers model
        return model(x)[0]
    return model(input_ids=x).logits


def same_model(a: ModelConfig, b: ModelConfig) -> None:
    """The same model: every field but the runtime ones equal, o_norm_eps as the eps it means (0 → norm_eps)."""
    a, b = (dataclasses.replace(c, o_norm_eps=c.o_norm_eps or c.norm_eps) for c in (a, b))
    diff = {k: (v, getattr(b, k)) for k, v in dataclasses.asdict(a).items() if k not in RUNTIME and getattr(b, k) != v}
    assert not diff, f"configs differ (ours, imported): {diff}"


def round_trip(cfg: ModelConfig, tmp_path, x: torch.Tensor, device: str = "cpu") -> None:
    """ours → export → AutoModelForCausalLM: same logits; that model's own save_pretrained → load_hf → ours: the
    same config and logits. The models are built, exported and loaded on the CPU and run on `device`."""
    from transformers import AutoModelForCausalLM

    ours = ours_of(cfg)
    export_hf(ours, cfg, tmp_path / "exported")
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "exported")).eval().to(device)
    x = x.to(device)
    ref = logits(theirs, x)
    assert rel_err(logits(ours.to(device), x), ref) <= TOL
    theirs.save_pretrained(str(tmp_path / "saved"))
    back_cfg, state = load_hf(tmp_path / "saved")
    same_model(cfg, back_cfg)
    assert rel_err(logits(ours_of(back_cfg, state).to(device), x), ref) <= TOL


@pytest.mark.parametrize("tied", [True, False])
def test_gpt2_round_trip(tmp_path, tied):
    round_trip(dataclasses.replace(GPT2, tie_embeddings=tied), tmp_path, torch.randint(0, VOCAB, (2, 40)))


def test_gpt2_from_transformers(tmp_path):
    """A GPT2LMHeadModel of transformers' own making (its init, its config.json) → ours."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    theirs = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=40, n_embd=48, n_layer=2, n_head=3)).eval()
    theirs.save_pretrained(str(tmp_path))
    cfg, state = load_hf(tmp_path)
    assert (cfg.family, cfg.d_model, cfg.n_heads, cfg.max_seq_len, cfg.norm_eps, cfg.mlp_hidden) == (
        "gpt2", 48, 3, 40, 1e-5, 0)
    x = torch.randint(0, VOCAB, (2, 33))
    assert rel_err(logits(ours_of(cfg, state), x), logits(theirs, x)) <= TOL


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.usefixtures("exact_fp32_matmuls", "exact_fp32_convs")
def test_fla_round_trip(tmp_path, fla_ready, device, family):
    # T ≤ 64: fla's layers pick their recurrent kernels for short inputs, which the interpreter runs (its chunk
    # kernels do not: a loop index's .to() fails there) and which compute the same function
    round_trip(FAMILIES[family], tmp_path, torch.randint(0, VOCAB, (1, 20)), device)


@pytest.mark.usefixtures("exact_fp32_matmuls", "exact_fp32_convs")
def test_fla_native_checkpoints(tmp_path, fla_ready, device):
    """Checkpoints fla configures its own way → ours: GLA with fla's default MLP width (hidden_ratio), unfused
    norms (the output norm's weight is then g_norm) and its gate's defaults; Mamba-2 with its default eps."""
    import fla.models as fm

    cases = [(fm.GLAConfig(hidden_size=32, num_hidden_layers=2, num_heads=4, vocab_size=VOCAB, fuse_norm=False),
              fm.GLAForCausalLM, dict(n_heads=4, head_k_dim=4, head_v_dim=8, mlp_hidden=0, tie_embeddings=False)),
             (fm.Mamba2Config(hidden_size=32, num_hidden_layers=2, head_dim=8, state_size=4, vocab_size=VOCAB,
                              tie_word_embeddings=True), fm.Mamba2ForCausalLM,
              dict(ssm_head_dim=8, ssm_state=4, norm_eps=1e-5, tie_embeddings=True))]
    x = torch.randint(0, VOCAB, (1, 20), device=device)
    for i, (hc, cls, want) in enumerate(cases):
        theirs = randomize_(cls(hc), seed=i)
        theirs.save_pretrained(str(tmp_path / hc.model_type))
        cfg, state = load_hf(tmp_path / hc.model_type)
        assert {k: getattr(cfg, k) for k in want} == want
        assert rel_err(logits(ours_of(cfg, state).to(device), x), logits(theirs.to(device), x)) <= TOL


@pytest.mark.parametrize("family, field, value", [
    ("gla", "gate_normalizer", 8.0), ("gla", "gate_low_rank", 32), ("gla", "o_norm_eps", 1e-3),
    ("gated_deltanet", "o_norm_eps", 1e-3), ("mamba2", "ssm_groups", 2), ("mamba2", "mlp_hidden", 64),
    ("gpt2", "attention", "ramla")])
def test_export_refuses_what_does_not_map(tmp_path, family, field, value):
    cfg = dataclasses.replace(FAMILIES.get(family, GPT2), **{field: value})
    with pytest.raises(HFMappingError, match=f"{field}={value!r}"):
        export_hf(build_model(cfg), cfg, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()


def test_import_refuses_what_does_not_map(tmp_path):
    """A field ours lacks names itself (transformers' GPT-2 needs no fla); so do a tensor we would drop and a
    tied head that differs from the embedding."""
    from transformers import GPT2Config

    GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, activation_function="gelu").save_pretrained(
        str(tmp_path / "gelu"))
    with pytest.raises(HFMappingError, match="activation_function='gelu'"):
        load_hf(tmp_path / "gelu")
    export_hf(ours_of(GPT2), GPT2, tmp_path / "ok")
    weights = tmp_path / "ok" / "model.safetensors"
    state = load_file(str(weights))
    save_file({**state, "transformer.h.0.attn.extra.weight": torch.zeros(2)}, str(weights))
    with pytest.raises(HFMappingError, match="'transformer.h.0.attn.extra.weight' has no place"):
        load_hf(tmp_path / "ok")
    save_file({**state, "lm_head.weight": torch.zeros(VOCAB, 32)}, str(weights))
    with pytest.raises(HFMappingError, match="lm_head.weight differs"):
        load_hf(tmp_path / "ok")


@pytest.mark.parametrize("family, field, value", [("gla", "use_short_conv", True),
                                                  ("gated_deltanet", "allow_neg_eigval", True),
                                                  ("mamba2", "n_groups", 2)])
def test_import_refuses_fla_fields(tmp_path, fla_ready, family, field, value):
    export_hf(ours_of(FAMILIES[family]), FAMILIES[family], tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(HFMappingError, match=f"{field}={value!r}"):
        load_hf(tmp_path)


def test_cli_export_and_perplexity_loader(tmp_path):
    """python -m model.export on a checkpoint folder, then eval/perplexity.py's load_model on hf:DIR."""
    from eval.perplexity import load_model
    from model.export import main
    from utils.checkpoint import STATE_FILE, WEIGHTS_FILE

    ckpt = tmp_path / "step_00000001"
    ckpt.mkdir()
    ours = ours_of(GPT2)
    save_file(ours.state_dict(), str(ckpt / WEIGHTS_FILE))
    (ckpt / STATE_FILE).write_text(json.dumps({"step": 1, "config": to_dict(Config(model=GPT2))}))
    out = tmp_path / "hf"
    main(["--ckpt", str(ckpt), "--out", str(out)])
    with pytest.raises(FileExistsError, match="--overwrite"):
        main(["--ckpt", str(ckpt), "--out", str(out)])
    main(["--ckpt", str(ckpt), "--out", str(out), "--overwrite"])
    model, cfg, path = load_model(f"hf:{out}")
    same_model(GPT2, cfg.model)
    assert path == out
    x = torch.randint(0, VOCAB, (2, 30))
    assert torch.equal(logits(model, x), logits(ours, x))


def test_init_from_keeps_the_runs_settings(tmp_path):
    """train.py's --init_from hf:DIR: the folder's model, the run's backend, chunk size and init scale."""
    export_hf(ours_of(GPT2), GPT2, tmp_path)
    run = ModelConfig(family="gla", chunk_size=32, init_std=0.01)
    cfg, state, changed = init_from_hf(f"hf:{tmp_path}", run)
    same_model(dataclasses.replace(GPT2, init_std=0.01), cfg)
    assert (cfg.backend, cfg.chunk_size, cfg.init_std) == ("naive", 32, 0.01)
    assert "model.family: 'gla' → 'gpt2'" in changed and not any("chunk_size" in c for c in changed)
    build_model(cfg).load_state_dict(state, strict=True)
    with pytest.raises(HFMappingError, match="expected hf:DIR"):
        init_from_hf(str(tmp_path), run)
