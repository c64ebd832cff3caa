"""How much rounding alone moves a model's gradients over its first training steps: the question behind a
parity run's noise floor (scripts/parity.py --floor).

    python scripts/grad_conditioning.py --config configs/gla_125m.yaml --steps 4 [--section.key=value ...]

A float64 copy of the model trains for --steps steps with train.py's data order, learning-rate schedule,
clipping and AdamW. At each step the gradient is also taken in float32 at the same weights (rounded), once
on the whole micro-batch and once with it split in two and summed: the rounding a parity run's floor
(naive~) differs by. Printed per step: the loss, the gradient norm, each fp32 gradient's relative L2 error
against fp64, the parameters with the largest errors, and the share of entries whose sign differs (AdamW's
first updates are about lr · sign(g), so every flipped sign moves a weight by about 2 · lr). A well-conditioned
gradient is off by ~1e-6 in fp32; an error near 1 means rounding picks the update's direction.
Writes <out>/conditioning.jsonl.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from accelerate.utils import set_seed  # noqa: E402

from config import load_config  # noqa: E402
from data.prepare import prepare_split  # noqa: E402
from data.sampler import BatchSampler  # noqa: E402
from eval.equivalence import rel  # noqa: E402
from model import build_model  # noqa: E402
from scripts.debug_model_grads import flat  # noqa: E402
from train import lr_at, make_optimizer  # noqa: E402


def grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, parts: int = 1) -> tuple[float, dict]:
    """Mean token loss over x [B, T] and its gradient, the batch taken in `parts` slices (as grad_accum)."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for xs, ys in zip(x.chunk(parts), y.chunk(parts)):
        _, loss = model(xs, ys, return_logits=False)
        (loss / parts).backward()
        total += loss.item() / parts
    return total, {n: p.grad.detach().double().clone() for n, p in model.named_parameters() if p.grad is not None}


def compare(g: dict, ref: dict) -> dict:
    """g against ref (per-parameter gradients): the whole gradient's relative L2 error, the share of entries whose
    sign differs where ref's is nonzero, and the six parameters with the largest relative errors."""
    err = {n: rel(g[n], ref[n]) for n in ref}
    flips = sum(((torch.sign(g[n]) != torch.sign(ref[n])) & (ref[n] != 0)).sum().item() for n in ref)
    total = sum(ref[n].numel() for n in ref)
    return {"rel_err": rel(flat(g), flat(ref)), "sign_flips": flips / total,
            "worst": sorted(err.items(), key=lambda kv: -kv[1])[:6]}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path("runs/grad_conditioning"))
    args, overrides = p.parse_known_args(argv)
    cfg = load_config(args.config, overrides)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    store = prepare_split(cfg.data, "train")
    set_seed(cfg.train.seed)
    m64 = build_model(cfg.model).double().to(device)
    m32 = copy.deepcopy(m64).float()
    opt = make_optimizer(m64, cfg, fused=False)
    sampler = BatchSampler(store, cfg.data.seq_len, cfg.train.micro_batch_size, 1, 1, 0, cfg.train.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    log, rows = (args.out / "conditioning.jsonl").open("w"), []
    for step in range(args.steps):
        x, y = (t.to(device) for t in sampler.batch(step, 0))
        with torch.no_grad():
            for a, b in zip(m32.parameters(), m64.parameters()):
                a.copy_(b)
        loss64, g64 = grads(m64, x, y)
        loss32, g32 = grads(m32, x, y)
        _, g32s = grads(m32, x, y, parts=2)
        row = {"step": step + 1, "loss64": loss64, "loss32_minus_64": loss32 - loss64,
               "grad_norm64": math.sqrt(sum((g ** 2).sum().item() for g in g64.values())),
               "fp32": compare(g32, g64), "fp32_split": compare(g32s, g64), "fp32_split_vs_fp32": compare(g32s, g32)}
        top = sorted(((g.norm().item(), n) for n, g in g64.items()), reverse=True)[:4]
        row["largest_grads"] = top
        print(json.dumps(row, indent=None), flush=True)
        log.write(json.dumps(row) + "\n")
        log.flush()
        rows.append(row)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        torch.nn.utils.clip_grad_norm_(m64.parameters(), cfg.optim.grad_clip or math.inf)
        opt.step()
    return rows


if __name__ == "__main__":
    main()
