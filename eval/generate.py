"""Sample text from a checkpoint.

    python eval/generate.py --ckpt runs/gpt2_124m --prompt "The history of" --max_new_tokens 100
    python eval/generate.py --ckpt runs/gpt2_124m --backend fused     # plain GPT-2 on the WMMA attention kernel
    python eval/generate.py --ckpt runs/smoke --prompt "3 1 4" --temperature 0   # synthetic data: token ids

No KV cache: every new token re-runs the model on the last `seq_len` tokens. That keeps one code path
for every family and backend (the recurrent families have no cache of their own here) and is fast
enough for samples of a few hundred tokens. Runs under no_grad, with bf16 autocast on a GPU when the
model was trained that way.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

if __package__ in (None, ""):  # `python eval/generate.py` puts eval/ first on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tqdm import tqdm

from config import ConfigError
from eval.perplexity import load_model
from utils.cli import run_cli


@torch.no_grad()
def sample(model: torch.nn.Module, idx: torch.Tensor, max_new_tokens: int, window: int, temperature: float = 1.0,
           top_k: int | None = None, generator: torch.Generator | None = None, progress: bool = False) -> torch.Tensor:
    """idx: int64 [B, T] prompt → [B, T + max_new_tokens]. temperature 0 is greedy (argmax)."""
    for _ in tqdm(range(max_new_tokens), disable=not progress, unit="tok"):
        logits, _ = model(idx[:, -window:])
        logits = logits[:, -1].float()
        if temperature == 0:
            nxt = logits.argmax(-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k:
                kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(logits.softmax(-1), 1, generator=generator)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


def prompt_ids(prompt: str, vocab_size: int, encode: Callable[[str], list[int]] | None) -> list[int]:
    """The prompt's token ids: encoded text, or with no tokenizer (synthetic data) the ids themselves, each
    checked against the model's vocabulary (the embedding would fail on one outside it with a bare IndexError)."""
    hint = f"give space-separated token ids below vocab_size {vocab_size}, e.g. --prompt \"3 1 4\""
    if encode is not None:
        ids, what = encode(prompt), "the prompt encodes to token ids"
    else:
        try:
            ids = [int(t) for t in prompt.split()]
        except ValueError:
            raise ConfigError(f"--prompt {prompt!r}: this model was trained on synthetic data, which has no text "
                              f"tokenizer; {hint}") from None
        what = "--prompt has token ids"
    if not ids:
        raise ConfigError(f"--prompt {prompt!r} gives no tokens" + ("" if encode else f"; {hint}"))
    bad = sorted({i for i in ids if not 0 <= i < vocab_size})
    if bad:
        raise ConfigError(f"{what} {', '.join(map(str, bad[:5]))}{', ...' if len(bad) > 5 else ''} outside the "
                          f"model's vocabulary (ids 0 to {vocab_size - 1}, model.vocab_size {vocab_size})")
    return ids


def main(argv: list[str] | None = None) -> list[str]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint folder, or a run folder (its latest checkpoint)")
    p.add_argument("--prompt", default="\n", help="text (GPT-2 BPE), or space-separated token ids for synthetic data")
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--num_samples", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top_k", type=int, default=50, help="0: no top-k cut")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", help="generate with another backend than the one trained with")
    args = p.parse_args(argv)
    if args.max_new_tokens < 0 or args.num_samples < 1 or args.temperature < 0 or args.top_k < 0:
        raise ConfigError("--max_new_tokens, --temperature and --top_k must be ≥ 0 and --num_samples ≥ 1, got "
                          f"{args.max_new_tokens}, {args.temperature}, {args.top_k} and {args.num_samples}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, cfg, _ = load_model(args.ckpt, args.backend, device)
    if cfg.data.source == "synthetic":
        encode, decode = None, (lambda toks: " ".join(map(str, toks)))
    else:
        from data.tokenizer import get_tokenizer

        enc = get_tokenizer(cfg.data.tokenizer_file or None)
        encode, decode = enc.encode_ordinary, enc.decode
    ids = prompt_ids(args.prompt, cfg.model.vocab_size, encode)
    idx = torch.tensor([ids] * args.num_samples, device=device)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    bf16 = device == "cuda" and cfg.train.precision in ("auto", "bf16")    # sample as trained
    with torch.autocast("cuda", torch.bfloat16) if bf16 else nullcontext():
        out = sample(model, idx, args.max_new_tokens, cfg.data.seq_len, args.temperature, args.top_k or None, gen,
                     progress=True)
    texts = [decode(row.tolist()) for row in out]
    for i, text in enumerate(texts):
        print(f"--- sample {i} ({cfg.model.family}, backend {cfg.model.backend})\n{text}")
    return texts


if __name__ == "__main__":
    run_cli(main)
