"""Model-level equivalence of backends: the same weights and batch through each backend; loss, logits
and every parameter gradient compared with the fp32 naive model.

    python -m eval.equivalence --config configs/gla_125m.yaml --backends chunk --n-layers 2
    TRITON_INTERPRET=1 python -m eval.equivalence --config configs/gla_125m.yaml --backends chunk \
        --n-layers 2 --seq-len 128 --batch 1     # on a CPU: Triton's interpreter, a few minutes

In bf16 a backend is judged against PyTorch's own bf16 error on the same model: the naive backend
under the same autocast, compared with the fp32 naive model. A backend is equivalent when each of
its errors is at most twice that, plus 1e-3 of bf16 rounding slack. On a CPU everything runs in fp32,
and a backend must agree with the naive model to 1e-4.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from model import build_model
from model.config import ModelConfig
from utils.cli import run_cli


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_backend(cfg: ModelConfig, state: dict, idx: torch.Tensor, bf16: bool) -> dict:
    """Loss, logits and fp32 parameter gradients of `cfg.backend` on weights `state` and tokens idx [B, T+1]."""
    model = build_model(cfg).to(idx.device)
    model.load_state_dict(state)
    with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return {"loss": loss.item(), "logits": logits.detach().float(),
            "grads": {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}}


def compare(cfg: ModelConfig, backends: list[str], batch: int = 2, seq_len: int | None = None,
            device: str = "cuda", seed: int = 0, state: dict | None = None) -> dict:
    """{label: {"loss", "logits", "grads": {param: rel. error}}} against the fp32 naive model; labels are
    'naive bf16' (PyTorch's own bf16 error) and each backend, bf16 on CUDA and fp32 elsewhere. `state`:
    the weights (a checkpoint's), else a fresh init."""
    torch.manual_seed(seed)
    T = seq_len or cfg.max_seq_len
    idx = torch.randint(0, cfg.vocab_size, (batch, T + 1), device=device)
    naive = dataclasses.replace(cfg, backend="naive")
    state = build_model(naive).state_dict() if state is None else state
    ref = run_backend(naive, state, idx, bf16=False)
    bf16 = device == "cuda"
    runs = {"naive bf16": run_backend(naive, state, idx, bf16=True)} if bf16 else {}
    for b in backends:
        runs[b] = run_backend(dataclasses.replace(cfg, backend=b), state, idx, bf16=bf16)
    return {label: {"loss": r["loss"] - ref["loss"], "logits": rel(r["logits"], ref["logits"]),
                    "grads": {n: rel(g, ref["grads"][n]) for n, g in r["grads"].items()}}
            for label, r in runs.items()}


def within_bf16_bound(errs: dict, label: str, allowance: dict[str, float] | None = None) -> list[str]:
    """The logits and gradients of `label` whose error exceeds 2 × naive bf16's + 1e-3. `allowance`
    maps parameter-name suffixes to a larger absolute slack than 1e-3, for gradients whose exact
    value is a sum that nearly cancels (the caller says why)."""
    base, got = errs["naive bf16"], errs[label]
    bad = [f"logits {got['logits']:.2e} > 2 × {base['logits']:.2e} + 1e-3"] \
        if got["logits"] > 2 * base["logits"] + 1e-3 else []

    def slack(name: str) -> float:
        return max([1e-3] + [v for suffix, v in (allowance or {}).items() if name.endswith(suffix)])

    return bad + [f"grad {n} {e:.2e} > 2 × {base['grads'][n]:.2e} + {slack(n):.0e}" for n, e in got["grads"].items()
                  if not e <= 2 * base["grads"][n] + slack(n)]


def check_backends(cfg: ModelConfig, backends: list[str]) -> None:
    """Resolve each backend's ops (a model on the meta device) before the fp32 reference run, which takes minutes
    at full length on a CPU: a backend that cannot run here fails at once, with its BackendError."""
    with torch.device("meta"):
        for b in backends:
            build_model(dataclasses.replace(cfg, backend=b))


def main(argv: list[str] | None = None) -> None:
    from config import load_config

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="model config for a fresh init (or --ckpt)")
    p.add_argument("--ckpt", help="checkpoint or run folder: its trained weights and whole model instead "
                   "(--n-layers ignored); the batch is still random tokens")
    p.add_argument("--backends", default="chunk")
    p.add_argument("--n-layers", type=int, default=2, help="layers to keep (the check is per layer)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=2048)
    args = p.parse_args(argv)
    state = None
    if args.ckpt:
        from eval.perplexity import load_model

        model, full, path = load_model(args.ckpt, "naive", fuse="")
        cfg, state = full.model, model.state_dict()
        print(f"weights: {path}")
    elif args.config:
        cfg = dataclasses.replace(load_config(args.config).model, n_layers=args.n_layers)
    else:
        p.error("one of --config or --ckpt is required")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backends = args.backends.split(",")
    check_backends(cfg, backends)
    errs = compare(cfg, backends, args.batch, args.seq_len, device, state=state)
    names = list(next(iter(errs.values()))["grads"])
    labels = list(errs)
    print(f"{'vs fp32 naive':<40}" + "".join(f"{lab:>14}" for lab in labels))
    print(f"{'Δ loss':<40}" + "".join(f"{errs[lab]['loss']:>+14.2e}" for lab in labels))
    print(f"{'logits':<40}" + "".join(f"{errs[lab]['logits']:>14.2e}" for lab in labels))
    for n in names:
        print(f"{n:<40}" + "".join(f"{errs[lab]['grads'][n]:>14.2e}" for lab in labels))
    for lab in labels:
        if "naive bf16" in errs and lab != "naive bf16":
            bad = within_bf16_bound(errs, lab)
            verdict = "equivalent within 2 × naive bf16 + 1e-3" if not bad else "NOT equivalent: " + "; ".join(bad)
            print(f"{lab}: {verdict}")
        elif "naive bf16" not in errs:
            worst = max([errs[lab]["logits"], *errs[lab]["grads"].values()])
            print(f"{lab} (fp32): largest relative error {worst:.1e} ({'within' if worst <= 1e-4 else 'OVER'} 1e-4)")


if __name__ == "__main__":
    run_cli(main)
