"""Per-parameter gradients of a preset at initialisation, naive against chunk, in fp32 and bf16,
on one batch: does a model's step-1 gradient agree across backends, and is it stable under a change
of numerics on its own (naive fp32 run twice, naive bf16)?

    python scripts/debug_model_grads.py configs/gla_125m.yaml [configs/gdn_125m.yaml ...] [--batch 4]

Prints per run: loss, total gradient norm, the logits' and the four worst parameters' relative
error against naive fp32; then the five largest gradients of naive fp32.
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

RUNS = [("naive", False), ("chunk", False), ("naive", True), ("chunk", True), ("naive", False)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("configs", nargs="+")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for path in args.configs:
        cfg = load_config(path).model
        torch.manual_seed(0)
        idx = torch.randint(0, cfg.vocab_size, (args.batch, args.seq_len + 1), device=device)
        state = build_model(dataclasses.replace(cfg, backend="naive")).state_dict()
        runs = {}
        for backend, bf16 in RUNS:
            label = f"{backend} {'bf16' if bf16 else 'fp32'}"
            label += " again" if label in runs else ""
            runs[label] = run_backend(dataclasses.replace(cfg, backend=backend), state, idx, bf16=bf16 and device == "cuda")
        ref = runs["naive fp32"]
        for label, r in runs.items():
            norm = torch.sqrt(sum(g.double().pow(2).sum() for g in r["grads"].values())).item()
            worst = sorted(((rel(g, ref["grads"][n]), n) for n, g in r["grads"].items()), reverse=True)[:4]
            print(f"{path} {label:<16} loss {r['loss']:.7f} grad norm {norm:.4f} logits "
                  f"{rel(r['logits'], ref['logits']):.1e}; worst: " + ", ".join(f"{n} {e:.1e}" for e, n in worst),
                  flush=True)
        big = sorted(((g.double().norm().item(), n) for n, g in ref["grads"].items()), reverse=True)[:5]
        print("  largest gradients (naive fp32): " + ", ".join(f"{n} {v:.3f}" for v, n in big), flush=True)


if __name__ == "__main__":
    main()
