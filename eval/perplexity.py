"""Perplexity of a checkpoint on a split: token perplexity, word perplexity and bits per byte.

    python eval/perplexity.py --ckpt runs/gla_125m --split test                 # non-overlapping windows
    python eval/perplexity.py --ckpt runs/gla_125m --split test --stride 256    # sliding windows
    python eval/perplexity.py --ckpt runs/gla_125m --split test --detokenize   # as the GPT-2 paper scored WikiText
    python eval/perplexity.py --ckpt runs/smoke --backend naive --data.eval_source=DIR
    python eval/perplexity.py --ckpt hf:hf/gla_340m --backend fused             # a Hugging Face folder (model/hf.py)

Windows of `seq_len` inputs start every `stride` tokens; each target is scored exactly once, by the
first window that contains it after the targets the previous window scored, so with a stride S
every target but the first seq_len − S sees at least seq_len − S tokens of context. Text streams
get `<|endoftext|>` prepended so that every token of the text is scored.
  word_ppl            = exp(total NLL / words)              words = Σ over lines (whitespace words + 1)
  word_ppl_whitespace = exp(total NLL / words_whitespace)   whitespace-separated words only
  bits per byte       = total NLL / ln 2 / UTF-8 bytes of the raw text
`word_ppl` is WikiText-103's published word-level perplexity (Merity et al. 2017; Transformer-XL; the GPT-2
paper): the words of the official tokenised split, each line's whitespace-separated tokens plus one end-of-line
token per line of the file, empty lines included: 245,569 on test and 217,646 on valid (241,211 and 213,886
whitespace words over 4,358 and 3,760 lines). A hub dataset's row is one line.

--detokenize (WikiText sources only: local wiki.*.raw files or the hub's wikitext dataset) rewrites each line
with wikitext_detokenize before tokenization, undoing the tokenised split's artifacts (" @-@ " for "-", spaces
before punctuation and inside brackets and quotes, split contractions, spaced heading marks): the GPT-2 paper
scored WikiText through invertible detokenizers of this kind (its exact rules are unpublished). Words and bytes
stay those of the original lines, so word perplexities stay comparable with and without it; the tokens change
(they get their own cache, and the default result file name gets _detok).

The result is printed, then written (default: <run>/eval/<checkpoint>_<split>_<seq_len>_<stride>.json, beside
the run's checkpoints, not inside one: a resumed run rotates old checkpoint folders away). The output folder is
checked for writing before the evaluation starts. A checkpoint that cannot be read, weights that are not finite
and a loss that is not finite are errors (exit 1), with what to do.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import errno
import hashlib
import json
import math
import re
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

if __package__ in (None, ""):  # `python eval/perplexity.py` puts eval/ first on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tqdm import tqdm

from config import Config, ConfigError, config_from_dict, parse_overrides, parser_flags, set_dotted
from data.config import DataConfig, DataSourceError
from data.prepare import TextRewrite, prepare_split, source_for
from data.sources import is_wikitext as wikitext_source, parse_source
from model import build_model
from model.hf import hf_dir, load_hf
from utils.checkpoint import (WEIGHTS_FILE, CheckpointError, checkpoint_problem, complete_checkpoints, read_state,
                              resolve_checkpoint)
from utils.cli import run_cli
from utils.errors import UserError, write_error
from utils.runinfo import write_atomic


class NotFinite(UserError, ValueError):
    """Weights or a loss that are NaN or infinite: a result from them would be meaningless."""


def _run_of(path: Path) -> Path | None:
    """The run folder of a checkpoint folder `<run>/checkpoints/step_*`, or None for a checkpoint kept elsewhere."""
    return path.parent.parent if path.parent.name == "checkpoints" else None


def _read_checkpoint(path: Path) -> tuple[Config, dict[str, torch.Tensor]]:
    """The config and weights of checkpoint `path`, or CheckpointError naming the bad file (checkpoint_problem,
    the optimizer left out) and the newest earlier checkpoint of the run that reads back (not taken silently: its
    result would be another step's)."""
    problem = checkpoint_problem(path, optimizer=False)
    if problem is None:
        return config_from_dict(read_state(path)["config"]), load_file(str(path / WEIGHTS_FILE))
    run = _run_of(path)
    earlier = next((p for p in reversed(complete_checkpoints(run) if run else [])
                    if p.name < path.name and checkpoint_problem(p, optimizer=False) is None), None)
    instead = (f"the newest earlier checkpoint that reads back is {earlier}: pass --ckpt {earlier}" if earlier
               else "no earlier checkpoint of this run reads back either")
    raise CheckpointError(f"{problem}; {instead}")


def check_finite_weights(state: dict[str, torch.Tensor], path: Path) -> None:
    """NotFinite naming the first tensor of `state` holding NaN or inf (a run that diverged before it was saved)."""
    for name, t in state.items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            bad = int((~torch.isfinite(t)).sum())
            raise NotFinite(f"{path / WEIGHTS_FILE}: tensor {name!r} holds {bad} NaN or infinite values (the run "
                            "diverged before this checkpoint); evaluate an earlier checkpoint with --ckpt")


def load_model(ckpt: str | Path, backend: str | None = None, device: str | torch.device = "cpu",
               fuse: str | None = None) -> tuple[torch.nn.Module, Config, Path]:
    """Model and config from a checkpoint folder, a run folder's latest checkpoint, or `hf:DIR`, a Hugging Face
    folder (model/hf.py: a transformers GPT-2 or an fla GLA / Gated DeltaNet / Mamba-2; its config is the
    defaults with that model); `backend` and `fuse` (the fused backend's components, "" for all) replace the ones
    it was trained with."""
    folder = hf_dir(ckpt)
    if folder is not None:
        model_cfg, state = load_hf(folder)
        cfg, path = Config(model=model_cfg), folder
    else:
        path = resolve_checkpoint(ckpt)
        cfg, state = _read_checkpoint(path)
    check_finite_weights(state, path)
    if backend:
        cfg.model.backend = backend
    if fuse is not None:
        cfg.model.fuse = fuse
    model = build_model(cfg.model)
    model.load_state_dict(state, strict=True)
    return model.to(device).eval(), cfg, path


def _literal(old: str, new: str) -> tuple[re.Pattern, str]:
    """A plain replacement as a (pattern, replacement) rule."""
    return re.compile(re.escape(old)), new.replace("\\", "\\\\")


# WikiText's tokenisation undone, in this order (a rule may leave the spaces a later rule looks for)
_DETOKENIZE_RULES: tuple[tuple[re.Pattern, str], ...] = (
    *(_literal(f" @{c}@ ", c) for c in "-,."),                                      # 1 @,@ 000 → 1,000
    *(_literal(f" {c} ", f"{c} ") for c in ":;.!?,"),                               # word , word → word, word
    *(_literal(a, b) for a, b in (("( ", "("), (" )", ")"), ("[ ", "["), (" ]", "]"), ("{ ", "{"), (" }", "}"))),
    (re.compile(r'"[^\S\n]*([^"\n]*?)[^\S\n]*"'), r'"\1"'),                           # " quoted " → "quoted"
    (re.compile(r" ('s|'ve|n't|'m|'ll|'re|'d)(?![A-Za-z])"), r"\1"),                 # it 's → it's, do n't → don't
    *(_literal(" ".join("=" * n), "=" * n) for n in (4, 3, 2)),                     # = = Heading = = → == Heading ==
    _literal(" \n", "\n"),                                                           # the space before each newline
    (re.compile(r"(?m)^ "), ""),                                                    # and the one starting each line
)


def wikitext_detokenize(text: str) -> str:
    """WikiText's tokenised text with its tokenisation undone, line by line (the GPT-2 paper's evaluation):
    " @-@ ", " @,@ ", " @.@ " → "-", ",", "."; no space before : ; . ! ? ,; none inside ( ) [ ] { } or a pair of
    double quotes on one line; contractions 's 've n't 'm 'll 're 'd joined to the word before; heading marks
    "= = =" → "==="; no space before a newline or at the start of a line.
    " The game 's first @-@ person view ( FPV ) . \n" → "The game's first-person view (FPV).\n"."""
    for pattern, repl in _DETOKENIZE_RULES:
        text = pattern.sub(repl, text)
    return text


# its shards are keyed by the rules, so that a changed rule re-tokenizes
WIKITEXT_DETOKENIZE = TextRewrite(
    "detok", "wikitext:" + hashlib.sha256(repr([(p.pattern, p.flags, r) for p, r in _DETOKENIZE_RULES]).encode())
    .hexdigest()[:12], wikitext_detokenize)


def is_wikitext(data: DataConfig, split: str) -> bool:
    """Whether `split` under `data` comes from WikiText: local wiki.*.raw files or a hub dataset named wikitext."""
    return wikitext_source(source_for(data, split), split)


def window_plan(n_inputs: int, seq_len: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, end, first_scored) per window: inputs [start, end), scoring inputs [first_scored, end)."""
    if not 0 < stride <= seq_len:
        raise ConfigError(f"--stride must be between 1 and the window length {seq_len} (--seq_len), got {stride}")
    plan, scored_to, start = [], 0, 0
    while scored_to < n_inputs:
        end = min(start + seq_len, n_inputs)
        plan.append((start, end, scored_to))
        scored_to, start = end, start + stride
    return plan


@torch.no_grad()
def score_tokens(model: torch.nn.Module, tokens: torch.Tensor, seq_len: int, stride: int,
                 batch_size: int = 8, progress: bool = False) -> tuple[float, int]:
    """Total NLL (nats) of tokens[1:] given their windowed contexts, and how many were scored.

    tokens: 1-D int64 [n_tokens]. Full-length windows are batched; the ragged last one runs alone.
    """
    device = next(model.parameters()).device
    plan = window_plan(tokens.numel() - 1, seq_len, stride)
    total, count = 0.0, 0
    groups: dict[int, list] = {}
    for w in plan:
        groups.setdefault(w[1] - w[0], []).append(w)
    bar = tqdm(total=len(plan), disable=not progress, unit="window")
    for length, ws in groups.items():
        for i in range(0, len(ws), batch_size):
            batch = ws[i:i + batch_size]
            x = torch.stack([tokens[s:e] for s, e, _ in batch]).to(device)               # [b, length]
            y = torch.stack([tokens[s + 1:e + 1] for s, e, _ in batch]).to(device)       # [b, length]
            logits, _ = model(x)
            nll = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view_as(y)
            keep = torch.stack([torch.arange(s, e) >= f for s, e, f in batch]).to(device)
            total += nll[keep].double().sum().item()
            count += int(keep.sum())
            bar.update(len(batch))
    bar.close()
    return total, count


def evaluate_split(model, cfg: Config, split: str, seq_len: int, stride: int, batch_size: int,
                   progress: bool = True, detokenize: bool = False) -> dict:
    """Scores of `model` on `split` (see the module docstring); `detokenize` scores WikiText detokenised."""
    if detokenize and not is_wikitext(cfg.data, split):
        raise ConfigError(f"--detokenize undoes WikiText's tokenisation, but the {split} split's source "
                          f"{source_for(cfg.data, split)} is not WikiText (local wiki.*.raw files or the hub's "
                          "wikitext dataset); leave --detokenize out")
    # the plain stream whatever the run trained on: the published word perplexity has no document separators
    plain = dataclasses.replace(cfg.data, doc_separator=False, varlen=False)
    store = prepare_split(plain, split, rewrite=WIKITEXT_DETOKENIZE if detokenize else None)
    rows = getattr(getattr(model, "cfg", None), "vocab_size", None)      # the model's embedding rows
    if rows is not None and store.vocab_size > rows:
        raise ConfigError(f"the {split} split's tokens run to vocab_size {store.vocab_size}, but the model embeds "
                          f"{rows}: it was trained on other data; give the data it was trained on with --data.* "
                          "(e.g. --data.source, --data.tokenizer_file)")
    tokens = torch.from_numpy(store.get(0, len(store)))
    eot = store.meta.get("eot")
    if eot is not None:
        tokens = torch.cat([torch.tensor([eot]), tokens])
    on_gpu = next(model.parameters()).is_cuda
    bf16 = on_gpu and cfg.train.precision in ("auto", "bf16")  # evaluate as trained
    with torch.autocast("cuda", torch.bfloat16) if bf16 else nullcontext():
        nll, n = score_tokens(model, tokens, seq_len, stride, batch_size, progress)
    # a text split's word counts (data/prepare.py); None for data without text
    words, ws_words, nbytes = (store.meta.get(k) for k in ("n_words_eol", "n_words", "n_bytes"))
    return {"split": split, "shards": str(store.folder), "seq_len": seq_len, "stride": stride,
            "backend": cfg.model.backend, "detokenize": detokenize, "tokens_scored": n, "nll_sum": nll,
            "loss": nll / n, "token_ppl": math.exp(nll / n),
            "words": words, "word_ppl": math.exp(nll / words) if words else None,
            "words_whitespace": ws_words, "word_ppl_whitespace": math.exp(nll / ws_words) if ws_words else None,
            "bytes": nbytes, "bits_per_byte": nll / math.log(2) / nbytes if nbytes else None,
            "entropy_rate": store.meta.get("entropy_rate")}


def split_data(data: DataConfig, split: str) -> dict:
    """What decides the tokens of `split` under `data`: its source, and the Markov source's settings for
    synthetic data. The cache folder and the tokenizer file's path are left out: they do not change the text."""
    spec = data.source if split == "train" or not data.eval_source else data.eval_source
    try:
        src = dataclasses.asdict(parse_source(spec))  # `DIR`, `local:DIR` and a relative path name one source
    except DataSourceError:  # a folder of the training machine, say: compare the text of the spec
        src = {"spec": spec}
    if src.get("kind") == "synthetic":
        s = dataclasses.asdict(data.synthetic)
        s.pop("eval_tokens" if split == "train" else "train_tokens")
        src["synthetic"] = s
    return src


def data_tag(data: DataConfig, trained: DataConfig, split: str) -> str:
    """'' when `split` under `data` is the split the checkpoint's own config names; else a short tag of the
    source, so that a result on other data gets its own default file instead of replacing the standard one."""
    src = split_data(data, split)
    if src == split_data(trained, split):
        return ""
    name = src.get("config") or src.get("name") or src.get("kind") or src["spec"]
    name = re.sub(r"[^\w.-]+", "_", name.rstrip("/").rsplit("/", 1)[-1])[-40:]
    digest = hashlib.sha256(json.dumps(src, sort_keys=True).encode()).hexdigest()[:6]
    return f"{name}-{digest}"


def check_window(model: torch.nn.Module, cfg: Config, seq_len: int, stride: int, batch_size: int) -> None:
    """The window settings, checked before any data is prepared (tokenizing a split can take minutes)."""
    if seq_len < 1 or batch_size < 1:
        raise ConfigError(f"--seq_len and --batch_size must be positive, got {seq_len} and {batch_size}")
    window_plan(0, seq_len, stride)  # its stride check, with no windows to plan
    if getattr(model, "pos_embed", None) is not None and seq_len > cfg.model.max_seq_len:
        raise ConfigError(f"windows of {seq_len} tokens are longer than this model's learned positions "
                          f"(model.max_seq_len {cfg.model.max_seq_len}); pass --seq_len {cfg.model.max_seq_len} "
                          "or less")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint folder, a run folder (its latest checkpoint), or hf:DIR "
                   "(a Hugging Face GPT-2 or fla GLA / Gated DeltaNet / Mamba-2 folder)")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"])
    p.add_argument("--seq_len", type=int, default=0, help="window length (default: the training seq_len)")
    p.add_argument("--stride", type=int, default=0, help="window stride (default: seq_len, non-overlapping)")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--backend", help="evaluate with another backend than the one trained with")
    p.add_argument("--detokenize", action="store_true",
                   help="WikiText only: score the text detokenised (wikitext_detokenize), as the GPT-2 paper did")
    p.add_argument("--out", help="JSON output (default: <run>/eval/<checkpoint>_<split>_<seq_len>_<stride>.json, "
                   "with _<source tag> before .json when --data.* overrides change the split's data)")
    args, rest = p.parse_known_args(argv)
    overrides = parse_overrides(rest, parser_flags(p))   # a typo fails before loading the checkpoint
    for k, _ in overrides:
        if not k.startswith("data."):
            raise ConfigError(f"only --data.* overrides apply to evaluation, got --{k}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, cfg, path = load_model(args.ckpt, args.backend, device)
    trained = copy.deepcopy(cfg.data)
    for k, v in overrides:
        set_dotted(cfg, k, v)
    seq_len = args.seq_len or cfg.data.seq_len
    stride = args.stride or seq_len
    check_window(model, cfg, seq_len, stride, args.batch_size)
    tag = "_".join(t for t in ("detok" if args.detokenize else "", data_tag(cfg.data, trained, args.split)) if t)
    out = Path(args.out) if args.out else default_out(path, args.split, seq_len, stride, tag)
    check_writable(out, made=not args.out)
    result = {"checkpoint": str(path), **evaluate_split(model, cfg, args.split, seq_len, stride, args.batch_size,
                                                        detokenize=args.detokenize)}
    print(json.dumps(result, indent=1))           # first: a failed write below must not lose the result
    if not math.isfinite(result["loss"]):
        raise NotFinite(f"the loss on {args.split} is {result['loss']} although the weights are finite (an overflow "
                        f"in {cfg.model.backend}'s kernels or in bf16); score with --backend naive to tell which; "
                        f"{out} was not written")
    try:
        write_atomic(out, json.dumps(result, indent=1))
    except OSError as e:
        raise write_error(e, out, "the result is printed above; pass a writable --out") from None
    print(f"wrote {out}")
    return result


def default_out(ckpt: Path, split: str, seq_len: int, stride: int, tag: str) -> Path:
    """<run>/eval/<step folder>_<split>_<seq_len>_<stride>[_<tag>].json (a checkpoint outside a run: beside it)."""
    name = f"{ckpt.name}_{split}_{seq_len}_{stride}{'_' + tag if tag else ''}.json"
    return (_run_of(ckpt) or ckpt.parent) / "eval" / name


def check_writable(out: Path, made: bool) -> None:
    """Fail now, not after the evaluation, if `out` cannot be written: its folder is created when `made` (the
    default location) and must exist otherwise; a file is created in it and removed."""
    if not made and not out.parent.is_dir():
        raise FileNotFoundError(f"--out {out}: folder {out.parent} does not exist")
    if out.is_dir():
        raise write_error(IsADirectoryError(errno.EISDIR, "is a folder", str(out)), out,
                          f"pass a file name, e.g. --out {out / 'eval.json'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out.parent).close()
    except OSError as e:
        raise write_error(e, out, "pass a writable --out") from None


if __name__ == "__main__":
    run_cli(main)
