"""Sample text from a checkpoint, token by token through the model's decode cache.

    python eval/generate.py --ckpt runs/gpt2_124m --prompt "The history of" --max_new_tokens 100
    python eval/generate.py --ckpt runs/gla_340m --backend fused --top_p 0.9   # the Triton step kernel
    python eval/generate.py --ckpt runs/smoke --prompt "3 1 4" --temperature 0   # synthetic data: token ids

The prompt is prefilled once (the full-sequence forward on the model's backend, keeping every layer's recurrent
state and short-conv tail, or its KV cache), then each new token is one decode step (model/decode.py): constant
memory and time per token for GLA, Gated DeltaNet and Mamba-2. One sample streams to stdout as it is generated
(text decoded incrementally; a token that ends inside a UTF-8 character waits for the next); several print when
done. Sampling: logits / temperature, then the top-k cut, then the top-p (nucleus) cut, from a generator seeded
with --seed; temperature 0 is greedy. Generation stops at <|endoftext|> (text models; --no-stop_at_eot goes on).
Runs under no_grad, with bf16 autocast on a GPU when the model was trained that way.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

if __package__ in (None, ""):  # `python eval/generate.py` puts eval/ first on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from config import ConfigError
from eval.perplexity import load_model
from utils.cli import run_cli


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """logits [B, vocab] with every token outside the top_k largest, then outside the nucleus, set to −inf. The
    nucleus is the smallest set of most probable tokens whose probability sums to ≥ top_p (the most probable token
    always stays); ties at the cut stay in."""
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, _ = logits.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs                                     # mass of the more probable tokens
        cut = sorted_logits.masked_fill(before >= top_p, float("inf")).min(-1, keepdim=True).values
        logits = logits.masked_fill(logits < cut, float("-inf"))
    return logits


def pick(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
         generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token of each row, logits [B, vocab] → int64 [B]: argmax at temperature 0, else a draw from
    softmax(filter_logits(logits / temperature))."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1)
    probs = filter_logits(logits / temperature, top_k, top_p).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.no_grad()
def sample(model: torch.nn.Module, idx: torch.Tensor, max_new_tokens: int, window: int, temperature: float = 1.0,
           top_k: int | None = None, generator: torch.Generator | None = None, top_p: float | None = None) -> torch.Tensor:
    """The uncached reference for the tests: every new token re-runs the model on the last `window` tokens.
    idx int64 [B, T] → [B, T + max_new_tokens]; with window ≥ T + max_new_tokens it is `generate`'s function."""
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, -window:])
        idx = torch.cat([idx, pick(logits[:, -1], temperature, top_k, top_p, generator)[:, None]], dim=1)
    return idx


def generate(model: torch.nn.Module, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             stop_token: int | None = None, on_token: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
    """Prefill idx int64 [B, T], then decode up to max_new_tokens per row through the cache (CausalLM.generate),
    each token drawn by `pick`; rows end at stop_token. Returns [B, T + n]."""
    new = model.generate(idx, max_new_tokens, sample=lambda lg: pick(lg, temperature, top_k, top_p, generator),
                         stop_token=stop_token, on_token=on_token)
    return torch.cat([idx, new], 1)


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


class TextStream:
    """Prints one row's new tokens as they come: decode(all new tokens so far) minus what is already printed, held
    back while the text ends in an incomplete UTF-8 character (decoded as U+FFFD)."""

    def __init__(self, decode: Callable[[list[int]], str], sep: str = "", out=sys.stdout):
        self.decode, self.sep, self.out, self.tokens, self.printed = decode, sep, out, [], 0

    def __call__(self, tokens: torch.Tensor) -> None:
        self.tokens.append(int(tokens[0]))
        text = self.decode(self.tokens)
        if text.endswith("\ufffd"):
            return
        self.out.write((self.sep if self.printed == 0 and text else "") + text[self.printed:])
        self.out.flush()
        self.printed = len(text)


def main(argv: list[str] | None = None) -> list[str]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint folder, a run folder (its latest checkpoint), or hf:DIR "
                   "(a Hugging Face GPT-2 or fla GLA / Gated DeltaNet / Mamba-2 folder)")
    p.add_argument("--prompt", default="\n", help="text (GPT-2 BPE), or space-separated token ids for synthetic data")
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--num_samples", type=int, default=1, help="rows decoded together; one streams as it comes")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top_k", type=int, default=50, help="0: no top-k cut")
    p.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling: keep the most probable tokens "
                                                            "holding this much probability (1: no cut)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop_at_eot", action=argparse.BooleanOptionalAction, default=True,
                   help="end a sample at <|endoftext|> (text models)")
    p.add_argument("--backend", help="generate with another backend than the one trained with")
    args = p.parse_args(argv)
    if args.max_new_tokens < 0 or args.num_samples < 1 or args.temperature < 0 or args.top_k < 0:
        raise ConfigError("--max_new_tokens, --temperature and --top_k must be ≥ 0 and --num_samples ≥ 1, got "
                          f"{args.max_new_tokens}, {args.temperature}, {args.top_k} and {args.num_samples}")
    if not 0 < args.top_p <= 1:
        raise ConfigError(f"--top_p must be in (0, 1], got {args.top_p}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, cfg, _ = load_model(args.ckpt, args.backend, device)
    if cfg.data.source == "synthetic":
        encode, decode, stop, sep = None, (lambda toks: " ".join(map(str, toks))), None, " "
    else:
        from data.tokenizer import get_tokenizer

        enc = get_tokenizer(cfg.data.tokenizer_file or None)
        encode, decode, stop, sep = enc.encode_ordinary, enc.decode, enc.eot_token, ""
    ids = prompt_ids(args.prompt, cfg.model.vocab_size, encode)
    if model.pos_embed is not None and len(ids) + args.max_new_tokens > cfg.model.max_seq_len:
        raise ConfigError(f"{len(ids)} prompt tokens + --max_new_tokens {args.max_new_tokens} exceed the "
                          f"{cfg.model.max_seq_len} learned positions of this model (model.max_seq_len); "
                          "shorten the prompt or ask for fewer tokens")
    idx = torch.tensor([ids] * args.num_samples, device=device)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    decoders = ", ".join(f"{op} on {b}" for op, b in model.decode_backends().items())
    print(f"{cfg.model.family}, backend {cfg.model.backend}; decode: {decoders}", file=sys.stderr)
    streamed = args.num_samples == 1
    if streamed:
        print(f"--- sample 0 ({cfg.model.family}, backend {cfg.model.backend})\n{decode(ids)}", end="", flush=True)
    bf16 = device == "cuda" and cfg.train.precision in ("auto", "bf16")    # sample as trained
    t0 = time.perf_counter()
    with torch.autocast("cuda", torch.bfloat16) if bf16 else nullcontext():
        out = generate(model, idx, args.max_new_tokens, args.temperature, args.top_k or None, args.top_p, gen,
                       stop if args.stop_at_eot else None, TextStream(decode, sep) if streamed else None)
    n = out.shape[1] - len(ids)
    if streamed:
        print()
    texts = [decode(row[:len(ids) + _until_stop(row[len(ids):].tolist(), stop)].tolist()) for row in out]
    if not streamed:
        for i, text in enumerate(texts):
            print(f"--- sample {i} ({cfg.model.family}, backend {cfg.model.backend})\n{text}")
    dt = time.perf_counter() - t0
    print(f"{n} tokens x {args.num_samples} sample(s) in {dt:.2f} s ({n * args.num_samples / max(dt, 1e-9):.1f} "
          "tokens/s, prefill included)", file=sys.stderr)
    return texts


def _until_stop(new: list[int], stop: int | None) -> int:
    """How many of a row's new tokens to show: through its first stop token (the repeats after it are padding)."""
    return new.index(stop) + 1 if stop is not None and stop in new else len(new)


if __name__ == "__main__":
    run_cli(main)
