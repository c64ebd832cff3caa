"""Hugging Face interop: our models as transformers / flash-linear-attention (fla) checkpoints, and back.

    export_hf(model, cfg, "out/")    # config.json + model.safetensors: AutoModelForCausalLM.from_pretrained("out/")
    cfg, state = load_hf("out/")     # a GPT-2 or fla GLA / GatedDeltaNet / Mamba2 folder → our config and weights

| ours | HF class (model_type) | package |
|---|---|---|
| gpt2, attention mha | GPT2LMHeadModel (gpt2) | transformers |
| gla | GLAForCausalLM (gla) | fla: `import fla` registers its classes with the Auto classes |
| gated_deltanet | GatedDeltaNetForCausalLM (gated_deltanet) | fla |
| mamba2 | Mamba2ForCausalLM (mamba2) | fla |

Conventions, ours ↔ theirs (weights are nn.Linear [out, in] on both sides unless said):
- every family: embed ↔ embeddings (GPT-2: wte), final norm ↔ norm (Mamba-2: norm_f; GPT-2: ln_f), an untied
  head ↔ lm_head (tie_embeddings ↔ tie_word_embeddings; a tied head is not written), norm_eps ↔ norm_eps (GPT-2:
  layer_norm_epsilon), one eps for the block norms, the final norm and the mixer's output norm.
- GLA: H·K = d·expand_k, H·V = d·expand_v; gk_down, gk_up ↔ gk_proj.0, gk_proj.1 (gk = logsigmoid(.) / 16: fla's
  GLAConfig has no gate normalizer or low-rank field, its layer fixes both at 16); r_proj ↔ g_proj; o_norm ↔
  g_norm_swish_gate (fuse_norm) or g_norm; no short conv, no feature map, no clamp.
- Gated DeltaNet: K = head_dim, V = head_dim·expand_v; q/k/v_conv.conv ↔ q/k/v_conv1d ([C, 1, W], no bias);
  a_proj, b_proj, A_log, dt_bias by name; r_proj ↔ g_proj; o_norm ↔ o_norm.
- SwiGLU MLP (GLA, Gated DeltaNet): our gate_up [2F, d] = [gate_proj; up_proj] (gate first), down ↔ down_proj,
  F = intermediate_size (else fla's rule: hidden_ratio·d·2/3 rounded up to 256, which is our default).
- Mamba-2: in_proj [z | xBC | dt], conv (with bias), dt_bias, A_log, D [H], norm, out_proj by name; block norm ↔
  norm; P = head_dim, N = state_size, one group, the gated norm after the gate over all d_inner.
- GPT-2: transformers' Conv1D weights are [in, out] (model.gpt2's from_hf_state_dict / to_hf_state_dict).

Anything else does not map, and export and import raise HFMappingError naming the field and its value rather than
approximate it: ours (RA+MLA attention, a GLA gate_normalizer or gate_low_rank ≠ 16, an o_norm_eps ≠ norm_eps,
Mamba-2 ssm_groups > 1 (fla normalises per group) or an MLP) and theirs (short convs in GLA, GQA, hybrid attention
layers, other activations, ...). One convention differs slightly and is no field: Gated DeltaNet's q, k L2 norm is
x / max(‖x‖, 1e-6) here and x / √(‖x‖² + 1e-6) in fla, a relative 5e-7 / ‖x‖² (logits agree within 1e-5 even at
our init, where ‖q‖, ‖k‖ are smallest: 7e-6 to 9e-6 at d = 32 to 64).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from model.config import ModelConfig
from model.gpt2 import from_hf_state_dict as gpt2_from_hf, to_hf_state_dict as gpt2_to_hf
from utils.errors import UserError

HF_PREFIX = "hf:"
FLA_TYPES = {"gla": "GLA", "gated_deltanet": "GatedDeltaNet", "mamba2": "Mamba2"}   # our family = fla model_type
FLA_GATE = 16            # fla's GLA layer: gate_logit_normalizer and gate_low_rank_dim, not in GLAConfig
FLA_INSTALL = "pip install flash-linear-attention==0.6.0 einops"
# how our model runs or is initialised, not what it computes: init_from_hf keeps the run's own
KEEP_FOR_RUN = ("backend", "fuse", "chunk_size", "init_std")


class HFMappingError(UserError, ValueError):
    """A model setting, or a checkpoint's, with no exact counterpart on the other side."""


def _unmapped(family: str, field: str, value, why: str) -> HFMappingError:
    return HFMappingError(f"{family}: {field}={value!r} does not map to the Hugging Face model: {why}")


def _require_fla() -> None:
    try:
        importlib.import_module("fla.models")   # registers its configs and models with transformers' Auto classes
    except ImportError as e:
        raise HFMappingError(f"GLA, Gated DeltaNet and Mamba-2 checkpoints are flash-linear-attention's model "
                             f"classes, which need the package ({e}); install it: {FLA_INSTALL}") from None


# ---- export ------------------------------------------------------------------------------------------------------

def check_exportable(cfg: ModelConfig) -> None:
    """HFMappingError naming the first setting of `cfg` the Hugging Face model cannot express exactly."""
    f = cfg.family
    if f not in ("gpt2", *FLA_TYPES):
        raise _unmapped(f, "family", f, "no Hugging Face model class for it")
    if f == "gpt2" and cfg.attention != "mha":
        raise _unmapped(f, "attention", cfg.attention, "transformers' GPT-2 has plain multi-head attention only "
                        "(RA+MLA's latent maps and learned α have no counterpart)")
    if f in ("gla", "gated_deltanet") and cfg.o_norm_eps and cfg.o_norm_eps != cfg.norm_eps:
        raise _unmapped(f, "o_norm_eps", cfg.o_norm_eps, f"fla uses one norm_eps ({cfg.norm_eps}) for the output "
                        "norm and the block norms; set o_norm_eps to 0 or to norm_eps")
    if f == "gla":
        for name in ("gate_normalizer", "gate_low_rank"):
            if getattr(cfg, name) != FLA_GATE:
                raise _unmapped(f, name, getattr(cfg, name), f"fla's GLA layer fixes it at {FLA_GATE} (GLAConfig "
                                "has no such field)")
    if f == "gated_deltanet" and int(cfg.head_k_dim * (cfg.head_v_dim / cfg.head_k_dim)) != cfg.head_v_dim:
        raise _unmapped(f, "head_v_dim", cfg.head_v_dim, f"fla's V = int(head_dim·expand_v) does not give it "
                        f"back from head_k_dim {cfg.head_k_dim}")
    if f == "mamba2":
        if cfg.ssm_groups != 1:
            raise _unmapped(f, "ssm_groups", cfg.ssm_groups, "fla's Mamba-2 normalises y ⊙ silu(z) per group "
                            "(ours over all of d_inner), and its PyTorch scan gives head h group h mod G (ours "
                            "h // (H/G))")
        if cfg.mlp_hidden:
            raise _unmapped(f, "mlp_hidden", cfg.mlp_hidden, "fla's Mamba-2 blocks have no MLP")


def hf_config(cfg: ModelConfig, dtype: torch.dtype = torch.float32):
    """The transformers config (fla's for the recurrent families) of the same model as `cfg`."""
    check_exportable(cfg)
    eos = 50256 if cfg.vocab_size > 50256 else None      # GPT-2 BPE's <|endoftext|>, the token our data uses
    common = dict(vocab_size=cfg.vocab_size, tie_word_embeddings=cfg.tie_embeddings,
                  initializer_range=cfg.init_std, bos_token_id=eos, eos_token_id=eos, pad_token_id=None)
    if cfg.family == "gpt2":
        from transformers import GPT2Config

        c = GPT2Config(n_positions=cfg.max_seq_len, n_embd=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads,
                       n_inner=cfg.mlp_hidden or None, activation_function="gelu_new",
                       layer_norm_epsilon=cfg.norm_eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
        c.architectures = ["GPT2LMHeadModel"]
    else:
        _require_fla()
        import fla.models as fm

        common.update(hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, norm_eps=cfg.norm_eps)
        if cfg.family == "gla":
            c = fm.GLAConfig(num_heads=cfg.n_heads, expand_k=cfg.n_heads * cfg.head_k_dim / cfg.d_model,
                             expand_v=cfg.n_heads * cfg.head_v_dim / cfg.d_model, hidden_ratio=4,
                             intermediate_size=cfg.swiglu_hidden(), hidden_act="swish", **common)
        elif cfg.family == "gated_deltanet":
            c = fm.GatedDeltaNetConfig(num_heads=cfg.n_heads, head_dim=cfg.head_k_dim,
                                       expand_v=cfg.head_v_dim / cfg.head_k_dim, conv_size=cfg.conv_size,
                                       hidden_ratio=4, intermediate_size=cfg.swiglu_hidden(), hidden_act="swish",
                                       **common)
        else:
            c = fm.Mamba2Config(head_dim=cfg.ssm_head_dim, state_size=cfg.ssm_state, expand=cfg.expand,
                                n_groups=1, conv_kernel=cfg.conv_size, chunk_size=cfg.chunk_size, **common)
        c.architectures = [f"{FLA_TYPES[cfg.family]}ForCausalLM"]
    c.dtype = str(dtype).removeprefix("torch.")
    return c


def _fla_keys(cfg: ModelConfig, fuse_norm: bool = True) -> list[tuple[str, tuple[str, ...]]]:
    """(our key, fla key(s)) for every tensor of an fla family's model; several fla keys are concatenated along
    dim 0 into ours (the SwiGLU's gate_proj, up_proj → gate_up)."""
    f, root = cfg.family, "backbone" if cfg.family == "mamba2" else "model"
    keys = [("embed.weight", (f"{root}.embeddings.weight",)),
            ("norm.weight", (f"{root}.{'norm_f' if f == 'mamba2' else 'norm'}.weight",))]
    if not cfg.tie_embeddings:
        keys.append(("head.weight", ("lm_head.weight",)))
    if f == "gla":
        mixer = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "gk_down": "gk_proj.0",
                 "gk_up": "gk_proj.1", "r_proj": "g_proj", "o_norm": "g_norm_swish_gate" if fuse_norm else "g_norm",
                 "o_proj": "o_proj"}
        names = [(f"mixer.{a}.weight", f"attn.{b}.weight") for a, b in mixer.items()]
        names.append(("mixer.gk_up.bias", "attn.gk_proj.1.bias"))
    elif f == "gated_deltanet":
        names = [(f"mixer.{a}.weight", f"attn.{b}.weight") for a, b in (
            ("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"), ("q_conv.conv", "q_conv1d"),
            ("k_conv.conv", "k_conv1d"), ("v_conv.conv", "v_conv1d"), ("a_proj", "a_proj"), ("b_proj", "b_proj"),
            ("r_proj", "g_proj"), ("o_norm", "o_norm"), ("o_proj", "o_proj"))]
        names += [("mixer.A_log", "attn.A_log"), ("mixer.dt_bias", "attn.dt_bias")]
    else:
        names = [("mixer_norm.weight", "norm.weight")] + [(f"mixer.{a}", f"mixer.{b}") for a, b in (
            ("in_proj.weight", "in_proj.weight"), ("conv.conv.weight", "conv1d.weight"),
            ("conv.conv.bias", "conv1d.bias"), ("dt_bias", "dt_bias"), ("A_log", "A_log"), ("D", "D"),
            ("norm.weight", "norm.weight"), ("out_proj.weight", "out_proj.weight"))]
    for i in range(cfg.n_layers):
        ours, theirs = f"blocks.{i}.", f"{root}.layers.{i}."
        keys += [(ours + a, (theirs + b,)) for a, b in names]
        if f != "mamba2":
            keys += [(ours + "mixer_norm.weight", (theirs + "attn_norm.weight",)),
                     (ours + "mlp_norm.weight", (theirs + "mlp_norm.weight",)),
                     (ours + "mlp.gate_up.weight", (theirs + "mlp.gate_proj.weight", theirs + "mlp.up_proj.weight")),
                     (ours + "mlp.down.weight", (theirs + "mlp.down_proj.weight",))]
    return keys


def to_hf_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict → the Hugging Face model's (tensors contiguous, as safetensors needs)."""
    check_exportable(cfg)
    if cfg.family == "gpt2":
        out = gpt2_to_hf(state, cfg.n_layers)
    else:
        out = {}
        for ours, theirs in _fla_keys(cfg):
            for name, part in zip(theirs, state[ours].chunk(len(theirs), dim=0)):
                out[name] = part
    return {k: v.detach().contiguous() for k, v in out.items()}


def export_hf(model: torch.nn.Module, cfg: ModelConfig, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write `model` (built from `cfg`) as a Hugging Face folder: config.json and model.safetensors, in the
    weights' dtype. Written beside `out_dir` first and moved into place when complete; an existing non-empty
    `out_dir` is an error unless `overwrite`."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise FileExistsError(f"--out {out} exists and is not an empty folder; pass a new folder, or --overwrite")
    state = model.state_dict()
    hf_cfg = hf_config(cfg, next(iter(state.values())).dtype)
    tensors = to_hf_state_dict(state, cfg)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        hf_cfg.save_pretrained(str(tmp))
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ---- import ------------------------------------------------------------------------------------------------------

def _require(family: str, c, field: str, allowed: tuple, why: str) -> None:
    value = getattr(c, field, allowed[0])
    if value not in allowed:
        raise HFMappingError(f"{family} checkpoint: {field}={value!r} has no counterpart in our model "
                             f"(needs {' or '.join(map(repr, allowed))}): {why}")


def _int_dim(family: str, field: str, value: float, what: str) -> int:
    if not math.isclose(value, round(value), rel_tol=1e-6) or round(value) <= 0:
        raise HFMappingError(f"{family} checkpoint: {field} gives {what} = {value}, not a positive integer")
    return round(value)


def _mlp_hidden(c) -> int:
    """Our mlp_hidden for fla's GatedMLP width: intermediate_size, else hidden_ratio (default 4)·d·2/3 rounded up
    to 256; 0 (our default) where that is our default width, 8d/3 rounded up to 256."""
    ratio = c.hidden_ratio if c.hidden_ratio is not None else 4
    width = c.intermediate_size or 256 * ((int(c.hidden_size * ratio * 2 / 3) + 255) // 256)
    return 0 if width == ModelConfig(d_model=c.hidden_size).swiglu_hidden() else width


def model_config_from_hf(c) -> ModelConfig:
    """Our ModelConfig of the model a transformers config `c` describes; HFMappingError naming the first field
    that has no exact counterpart. Runtime settings (backend, fuse, chunk_size) keep ModelConfig's defaults."""
    t = c.model_type
    if t == "gpt2":
        _require(t, c, "activation_function", ("gelu_new", "gelu_pytorch_tanh"), "our GPT-2 MLP is tanh-GELU")
        _require(t, c, "scale_attn_weights", (True,), "our attention scales scores by 1/√D")
        _require(t, c, "scale_attn_by_inverse_layer_idx", (False,), "our attention has no per-layer scale")
        _require(t, c, "add_cross_attention", (False,), "a decoder-only model has no cross-attention")
        d = c.n_embd
        return ModelConfig(family="gpt2", attention="mha", vocab_size=c.vocab_size, d_model=d, n_layers=c.n_layer,
                           n_heads=c.n_head, max_seq_len=c.n_positions, norm_eps=c.layer_norm_epsilon,
                           mlp_hidden=0 if c.n_inner in (None, 4 * d) else c.n_inner,
                           tie_embeddings=bool(c.tie_word_embeddings), init_std=c.initializer_range)
    if t not in FLA_TYPES:
        raise HFMappingError(f"model_type {t!r} has no counterpart here; ours are gpt2 (transformers) and "
                             f"{', '.join(FLA_TYPES)} (flash-linear-attention)")
    if t != "mamba2":
        _require(t, c, "attn", (None,), "hybrid softmax-attention layers are not in our model")
        _require(t, c, "hidden_act", ("swish",), "our MLP is SwiGLU")
    _require(t, c, "attnres_block_size", (None,), "our blocks have plain residuals")
    common = dict(family=t, vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                  norm_eps=c.norm_eps, tie_embeddings=bool(c.tie_word_embeddings), init_std=c.initializer_range)
    if t == "gla":
        for field, allowed, why in (("num_kv_heads", (None, c.num_heads), "our GLA has no grouped keys"),
                                    ("feature_map", (None,), "our q, k have no feature map"),
                                    ("use_short_conv", (False,), "our GLA has no short convolutions"),
                                    ("use_output_gate", (True,), "our GLA has the swish output gate"),
                                    ("clamp_min", (None,), "our decay is not clamped"),
                                    ("elementwise_affine", (True,), "our output norm has a weight")):
            _require(t, c, field, allowed, why)
        H, d = c.num_heads, c.hidden_size
        return ModelConfig(**common, n_heads=H, head_k_dim=_int_dim(t, "expand_k", d * c.expand_k / H, "K"),
                           head_v_dim=_int_dim(t, "expand_v", d * c.expand_v / H, "V"),
                           mlp_hidden=_mlp_hidden(c), gate_low_rank=FLA_GATE, gate_normalizer=float(FLA_GATE))
    if t == "gated_deltanet":
        for field, allowed, why in (("num_v_heads", (None, c.num_heads), "our Gated DeltaNet has as many v heads "
                                     "as q, k heads"),
                                    ("use_gate", (True,), "our Gated DeltaNet has the swish output gate"),
                                    ("use_short_conv", (True,), "our Gated DeltaNet has short convolutions"),
                                    ("allow_neg_eigval", (False,), "our β is sigmoid(.) ∈ (0, 1)"),
                                    ("output_gate_activation", ("swish", "silu"), "our output gate is swish")):
            _require(t, c, field, allowed, why)
        return ModelConfig(**common, n_heads=c.num_heads, head_k_dim=c.head_dim,
                           head_v_dim=_int_dim(t, "expand_v", c.head_dim * c.expand_v, "V"),
                           conv_size=c.conv_size, mlp_hidden=_mlp_hidden(c))
    for field, allowed, why in (("n_groups", (1,), "fla normalises y ⊙ silu(z) per group, ours over all d_inner"),
                                ("use_bias", (False,), "our in_proj and out_proj have no bias"),
                                ("use_conv_bias", (True,), "our conv has a bias"),
                                ("D_has_hdim", (False,), "our D is one value per head"),
                                ("hidden_act", ("silu",), "our conv activation and gate are SiLU"),
                                ("rmsnorm", (True,), "our output has the gated RMSNorm"),
                                ("norm_before_gate", (False,), "ours normalises y ⊙ silu(z)"),
                                ("dt_limit", ((0.0, math.inf), [0.0, math.inf]), "our dt is not clamped")):
        _require(t, c, field, allowed, why)
    d_inner = c.expand * c.hidden_size
    if d_inner % c.head_dim or getattr(c, "num_heads", d_inner // c.head_dim) != d_inner // c.head_dim:
        raise HFMappingError(f"mamba2 checkpoint: num_heads={getattr(c, 'num_heads', None)!r} is not "
                             f"expand·hidden_size/head_dim = {d_inner}/{c.head_dim}")
    return ModelConfig(**common, expand=c.expand, ssm_head_dim=c.head_dim, ssm_state=c.state_size, ssm_groups=1,
                       conv_size=c.conv_kernel, mlp_hidden=0)


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of a Hugging Face folder: model.safetensors, its sharded index, or pytorch_model.bin."""
    if (folder / "model.safetensors").is_file():
        return load_file(str(folder / "model.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        out = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            out.update(load_file(str(folder / shard)))
        return out
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder} holds no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def from_hf_state_dict(sd: dict[str, torch.Tensor], cfg: ModelConfig,
                       fuse_norm: bool = True) -> dict[str, torch.Tensor]:
    """The Hugging Face model's state dict → ours for `cfg` (model_config_from_hf's). A tensor it lacks, or one
    it has beyond those (other than a tied lm_head equal to the embedding, and GPT-2's mask buffers), is an
    HFMappingError: a checkpoint with parts we would drop is not the same model."""
    if cfg.family == "gpt2":
        sd = {k if k.startswith("transformer.") or k == "lm_head.weight" else "transformer." + k: v
              for k, v in sd.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}   # mask buffers
        try:
            out = gpt2_from_hf(sd, cfg.n_layers, tied=cfg.tie_embeddings)
        except KeyError as e:
            raise HFMappingError(f"gpt2 checkpoint: tensor {e.args[0]!r} is missing") from None
        known = set(gpt2_to_hf(out, cfg.n_layers))
        extra = sorted(k for k in sd if k not in known)
    else:
        keys = _fla_keys(cfg, fuse_norm)
        missing = [k for _, ks in keys for k in ks if k not in sd]
        if missing:
            raise HFMappingError(f"{cfg.family} checkpoint: tensor {missing[0]!r} is missing "
                                 f"({len(missing)} missing in all)")
        out = {ours: torch.cat([sd[k] for k in theirs]) if len(theirs) > 1 else sd[theirs[0]]
               for ours, theirs in keys}
        known = {k for _, ks in keys for k in ks}
        extra = sorted(k for k in sd if k not in known)
    if cfg.tie_embeddings and "lm_head.weight" in extra:
        if torch.equal(sd["lm_head.weight"], out["embed.weight"]):
            extra.remove("lm_head.weight")
        else:
            raise HFMappingError(f"{cfg.family} checkpoint: tie_word_embeddings is true but lm_head.weight differs "
                                 "from the embedding")
    if extra:
        raise HFMappingError(f"{cfg.family} checkpoint: tensor {extra[0]!r} has no place in our model "
                             f"({len(extra)} such in all)")
    return out


def hf_dir(spec: str | Path) -> Path | None:
    """The folder of an `hf:DIR` spec, None for anything else (our checkpoints and run folders)."""
    s = str(spec)
    return Path(s[len(HF_PREFIX):]) if s.startswith(HF_PREFIX) else None


def load_hf(folder: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Our ModelConfig and state dict (load_state_dict(strict=True) takes it) from a Hugging Face folder: a
    transformers GPT-2 or an fla GLA / Gated DeltaNet / Mamba-2 (fla needed to read those)."""
    folder = Path(folder)
    config = folder / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"hf:{folder}: no {config} (a Hugging Face model folder holds config.json and its "
                                "weights; fetch a hub model with `hf download NAME --local-dir DIR`)")
    model_type = json.loads(config.read_text()).get("model_type")
    if model_type in FLA_TYPES:
        _require_fla()
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(folder))
    cfg = model_config_from_hf(c)
    return cfg, from_hf_state_dict(read_hf_weights(folder), cfg, bool(getattr(c, "fuse_norm", True)))


def init_from_hf(spec: str, cfg: ModelConfig) -> tuple[ModelConfig, dict[str, torch.Tensor], list[str]]:
    """train.py's --init_from hf:DIR: the model DIR holds (its settings replace cfg's, except KEEP_FOR_RUN's,
    which stay cfg's), its state dict, and one 'field: ours → its' line per setting that changed, for the log."""
    folder = hf_dir(spec)
    if folder is None:
        raise HFMappingError(f"--init_from {spec}: expected hf:DIR, a Hugging Face model folder")
    loaded, state = load_hf(folder)
    merged = dataclasses.replace(loaded, **{k: getattr(cfg, k) for k in KEEP_FOR_RUN})
    changed = [f"model.{f.name}: {getattr(cfg, f.name)!r} → {getattr(merged, f.name)!r}"
               for f in dataclasses.fields(ModelConfig) if getattr(cfg, f.name) != getattr(merged, f.name)]
    return merged, state, changed
