"""Per-parameter gradients of a preset at initialisation, naive against chunk, in fp32 and bf16,
on one batch, each against naive in float64 (the exact gradient, up to fp64 rounding): does a
model's step-1 gradient agree across backends, and how far is each precision from the exact one?

    python scripts/debug_model_grads.py configs/gla_125m.yaml [configs/gdn_125m.yaml ...] [--batch 4]
        [--text FILE --tokenizer-file gpt2.tiktoken]   # a batch of real text instead of random tokens

Prints per run: loss, total gradient norm, the relative error of the logits, of the whole gradient
and of the four worst parameters against naive fp64; then the five largest fp64 gradients.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from config import load_config
from eval.equivalence import rel, run_backend
from model import build_model

RUNS = [("naive", False), ("chunk", False), ("naive", True), ("chunk", True)]


def run_fp64(cfg, state: dict, idx: torch.Tensor) -> dict:
    model = build_model(cfg).to(idx.device).double()
    model.load_state_dict(state)
    logits, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return {"loss": loss.item(), "logits": logits.detach(),
            "grads": {n: p.grad for n, p in model.named_parameters() if p.grad is not None}}


def text_batch(path: Path, tokenizer_file: str | None, batch: int, seq_len: int) -> torch.Tensor:
    """[batch, seq_len + 1] GPT-2 token ids from the start of a text file."""
    from data.tokenizer import get_tokenizer

    n = batch * (seq_len + 1)
    ids = get_tokenizer(tokenizer_file).encode_ordinary(path.read_text()[: 20 * n])[:n]
    if len(ids) < n:
        raise SystemExit(f"error: {path} holds {len(ids)} tokens, the batch needs {n}")
    return torch.tensor(ids).view(batch, seq_len + 1)


def flat(grads: dict) -> torch.Tensor:
    return torch.cat([g.double().flatten() for _, g in sorted(grads.items())])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("configs", nargs="+")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--text", type=Path, help="take the batch from the start of this text file (GPT-2 BPE)")
    p.add_argument("--tokenizer-file", help="local GPT-2 BPE ranks (offline)")
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for path in args.configs:
        cfg = load_config(path).model
        torch.manual_seed(0)
        idx = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1), device=device)
        if args.text:
            idx = text_batch(args.text, args.tokenizer_file, args.batch, args.seq_len).to(device)
        state = build_model(dataclasses.replace(cfg, backend="naive")).state_dict()
        runs = {"naive fp64": run_fp64(dataclasses.replace(cfg, backend="naive"), state, idx)}
        for backend, bf16 in RUNS:
            label = f"{backend} {'bf16' if bf16 else 'fp32'}"
            label += " again" if label in runs else ""
            runs[label] = run_backend(dataclasses.replace(cfg, backend=backend), state, idx, bf16=bf16 and device == "cuda")
        ref = runs["naive fp64"]
        for label, r in runs.items():
            norm = torch.sqrt(sum(g.double().pow(2).sum() for g in r["grads"].values())).item()
            worst = sorted(((rel(g, ref["grads"][n]), n) for n, g in r["grads"].items()), reverse=True)[:4]
            print(f"{path} {label:<16} loss {r['loss']:.7f} grad norm {norm:.4f} logits "
                  f"{rel(r['logits'], ref['logits']):.1e} grad {rel(flat(r['grads']), flat(ref['grads'])):.1e}; worst: " + ", ".join(f"{n} {e:.1e}" for e, n in worst),
                  flush=True)
        big = sorted(((g.double().norm().item(), n) for n, g in ref["grads"].items()), reverse=True)[:5]
        print("  largest gradients (naive fp64): " + ", ".join(f"{n} {v:.3f}" for v, n in big), flush=True)


if __name__ == "__main__":
    main()
