"""Parameter count and per-layer shapes of a config's model, built on the meta device (no memory).

    python -m model.summary --config configs/gla_340m.yaml [--section.key=value ...]
"""
from __future__ import annotations

import argparse

import torch

from config import load_config
from model import build_model


def summarize(model: torch.nn.Module) -> str:
    lines = []
    for name, p in model.named_parameters():
        parts = name.split(".")
        if parts[0] == "blocks" and parts[1] != "0":      # layers repeat: show the first one
            continue
        lines.append(f"  {name:<40} {str(tuple(p.shape)):<22} {p.numel():>12,}")
    n = model.num_params()
    lines += [f"  {'(blocks.1.. repeat blocks.0)':<40}",
              f"total {n:,} ({n / 1e6:.2f}M); without embeddings {model.num_params(True):,}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    args, rest = p.parse_known_args(argv)
    cfg = load_config(args.config, rest)
    with torch.device("meta"):
        model = build_model(cfg.model)
    print(f"{args.config}: family {cfg.model.family}, backend {cfg.model.backend}, {cfg.model.n_layers} layers")
    print(summarize(model))


if __name__ == "__main__":
    main()
