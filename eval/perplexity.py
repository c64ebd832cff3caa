"""Perplexity of a checkpoint on a split: token perplexity, word perplexity and bits per byte.

    python eval/perplexity.py --ckpt runs/gla_125m --split test                 # non-overlapping windows
    python eval/perplexity.py --ckpt runs/gla_125m --split test --stride 256    # sliding windows
    python eval/perplexity.py --ckpt runs/smoke --backend naive --data.eval_source=DIR

Windows of `seq_len` inputs start every `stride` tokens; each target is scored exactly once, by the
first window that contains it after the targets the previous window scored, so with a stride S
every target but the first seq_len − S sees at least seq_len − S tokens of context. Text streams
get `<|endoftext|>` prepended so that every token of the text is scored.
  word perplexity = exp(total NLL / whitespace-separated words of the raw text)   (WikiText convention)
  bits per byte   = total NLL / ln 2 / UTF-8 bytes of the raw text
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from contextlib import nullcontext
from pathlib import Path

if __package__ in (None, ""):  # `python eval/perplexity.py` puts eval/ first on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tqdm import tqdm

from config import Config, config_from_dict, parse_overrides, set_dotted
from data.prepare import prepare_split
from model import build_model
from utils.checkpoint import STATE_FILE, WEIGHTS_FILE, resolve_checkpoint


def load_model(ckpt: str | Path, backend: str | None = None, device: str | torch.device = "cpu",
               fuse: str | None = None) -> tuple[torch.nn.Module, Config, Path]:
    """Model and config from a checkpoint folder, or a run folder's latest checkpoint; `backend` and `fuse`
    (the fused backend's components, "" for all) replace the ones it was trained with."""
    path = resolve_checkpoint(ckpt)
    cfg = config_from_dict(json.loads((path / STATE_FILE).read_text())["config"])
    if backend:
        cfg.model.backend = backend
    if fuse is not None:
        cfg.model.fuse = fuse
    model = build_model(cfg.model)
    model.load_state_dict(load_file(str(path / WEIGHTS_FILE)), strict=True)
    return model.to(device).eval(), cfg, path


def window_plan(n_inputs: int, seq_len: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, end, first_scored) per window: inputs [start, end), scoring inputs [first_scored, end)."""
    if not 0 < stride <= seq_len:
        raise ValueError(f"stride must be in (0, seq_len={seq_len}], got {stride}")
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

    tokens: int64 [N]. Full-length windows are batched; the ragged last one runs alone.
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
                   progress: bool = True) -> dict:
    store = prepare_split(cfg.data, split)
    tokens = torch.from_numpy(store.get(0, len(store)))
    eot = store.meta.get("eot")
    if eot is not None:
        tokens = torch.cat([torch.tensor([eot]), tokens])
    on_gpu = next(model.parameters()).is_cuda
    bf16 = on_gpu and cfg.train.precision in ("auto", "bf16")  # evaluate as trained
    with torch.autocast("cuda", torch.bfloat16) if bf16 else nullcontext():
        nll, n = score_tokens(model, tokens, seq_len, stride, batch_size, progress)
    words, nbytes = store.meta.get("n_words"), store.meta.get("n_bytes")
    return {"split": split, "shards": str(store.folder), "seq_len": seq_len, "stride": stride,
            "backend": cfg.model.backend, "tokens_scored": n, "nll_sum": nll, "loss": nll / n,
            "token_ppl": math.exp(nll / n),
            "words": words, "word_ppl": math.exp(nll / words) if words else None,
            "bytes": nbytes, "bits_per_byte": nll / math.log(2) / nbytes if nbytes else None,
            "entropy_rate": store.meta.get("entropy_rate")}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint folder, or a run folder (its latest checkpoint)")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"])
    p.add_argument("--seq_len", type=int, default=0, help="window length (default: the training seq_len)")
    p.add_argument("--stride", type=int, default=0, help="window stride (default: seq_len, non-overlapping)")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--backend", help="evaluate with another backend than the one trained with")
    p.add_argument("--out", help="JSON output (default: <checkpoint>/eval_<split>_<seq_len>_<stride>.json)")
    args, rest = p.parse_known_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, cfg, path = load_model(args.ckpt, args.backend, device)
    for k, v in parse_overrides(rest):
        if not k.startswith("data."):
            raise SystemExit(f"error: only --data.* overrides apply to evaluation, got --{k}")
        set_dotted(cfg, k, v)
    seq_len = args.seq_len or cfg.data.seq_len
    stride = args.stride or seq_len
    result = {"checkpoint": str(path), **evaluate_split(model, cfg, args.split, seq_len, stride, args.batch_size)}
    out = Path(args.out) if args.out else path / f"eval_{args.split}_{seq_len}_{stride}.json"
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
