"""Where GLA's step-1 gradient loses its precision: the q/k gradient of the first token of each window.

    python scripts/debug_gla_conditioning.py --text ../shared/data/pydocs-train/train.txt \
        --tokenizer-file ../shared/data/tokenizers/gpt2.tiktoken [--layers 4 --seq-len 512 --eps 1e-6,1e-5,1e-4]

At t = 0 the state holds one outer product, so o_0 = scale (q_0 · k_0) v_0: whenever q_0 · k_0 is
near 0 (a one-dimensional event, common), o_0 is a tiny vector computed through cancellation, and
the per-head RMSNorm that follows scales its gradient by up to 1/sqrt(norm_eps). Those few rows
then carry most of the q/k gradient, with the large relative error of o_0. Runs gla_125m's
layer shape (naive backend, init weights, a batch of real text) in float32 and float64 and prints,
per norm_eps: each q/k projection's gradient error against float64, and per layer the share of
dq's error and of |dq|² that sits at t = 0.
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
from eval.equivalence import rel
from model import build_model
from scripts.debug_model_grads import text_batch


def run(cfg, state: dict, idx: torch.Tensor, dtype: torch.dtype) -> tuple[dict, list, list]:
    """Parameter gradients, and per layer the op's output o and the gradient of q ([B, T, H·K])."""
    model = build_model(cfg).to(dtype)
    model.load_state_dict(state)
    q_out, o_out = [], []

    def keep_q(module, inputs, out):
        out.retain_grad()
        q_out.append(out)

    def keeping_o(op):
        def wrapped(*a, **kw):
            o, state = op(*a, **kw)
            o_out.append(o.detach())
            return o, state
        return wrapped

    for block in model.blocks:
        block.mixer.q_proj.register_forward_hook(keep_q)
        block.mixer.gla = keeping_o(block.mixer.gla)
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}, o_out, [q.grad for q in q_out]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/gla_125m.yaml")
    p.add_argument("--text", type=Path, required=True)
    p.add_argument("--tokenizer-file")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--eps", default="1e-6,1e-5,1e-4", help="norm_eps values to compare")
    args = p.parse_args()
    idx = text_batch(args.text, args.tokenizer_file, args.batch, args.seq_len)
    for eps in (float(e) for e in args.eps.split(",")):
        cfg = dataclasses.replace(load_config(args.config).model, n_layers=args.layers, backend="naive", norm_eps=eps)
        torch.manual_seed(0)
        state = build_model(cfg).state_dict()
        g64, o64, dq64 = run(cfg, state, idx, torch.float64)
        g32, _, dq32 = run(cfg, state, idx, torch.float32)
        worst = max(rel(g32[k], g64[k]) for k in g64)
        print(f"norm_eps {eps:g}: worst parameter gradient error fp32 vs fp64 {worst:.1e}")
        for i in range(args.layers):
            qk = " ".join(f"{w} {rel(g32[f'blocks.{i}.mixer.{w}.weight'], g64[f'blocks.{i}.mixer.{w}.weight']):.1e}"
                          for w in ("q_proj", "k_proj"))
            err = (dq32[i].double() - dq64[i]).pow(2).sum(-1)                     # [B, T]
            rms = o64[i].pow(2).mean(-1).sqrt()
            print(f"  layer {i}: {qk}; t = 0 holds {err[:, 0].sum() / err.sum():.0%} of dq's error and "
                  f"{dq64[i][:, 0].pow(2).sum() / dq64[i].pow(2).sum():.0%} of |dq|²; per-head rms(o) min "
                  f"{rms.min():.1e} (at t = 0: {rms[:, 0].min():.1e}), median {rms.median():.1e}")


if __name__ == "__main__":
    main()
