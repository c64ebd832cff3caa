"""Where a training step's memory goes: every tensor autograd saves for the backward, by the module
that saved it, measured at a small batch and scaled to the one you train at (saved activations grow
linearly in B·T at a fixed chunk size), plus weights, gradients and AdamW's state.

    python scripts/memory_breakdown.py --config configs/mamba2_370m.yaml --backend chunk
    python scripts/memory_breakdown.py --config configs/gla_340m.yaml --batch 8 --seq-len 2048 --layers 2

Runs one forward on whatever device is present (CPU: the Triton kernels under the interpreter) with
--layers of the config's blocks (the rest are alike) and prints MB per module for --batch × --seq-len
and all the config's layers. It measures at --measure-seq-len tokens and twice that (multiples of the
chunk size) and extrapolates the growth per token, so weight copies autocast keeps are not scaled. Saved tensors that share storage count once. bf16 autocast on a GPU, fp32 on the CPU: on the
CPU, halve the activations that would be bf16 on a GPU (the table says which dtype each one had).
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ops import parse_backend


def saved_bytes(model: torch.nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> dict:
    """(module pattern, dtype) → bytes autograd keeps for the backward of one forward."""
    stack = ["(top)"]
    undo = []                                               # removes the hooks, puts the ops back
    for name, mod in model.named_modules():
        if name:
            pattern = re.sub(r"\.\d+\.", ".*.", f".{name}.").strip(".")
            undo.append(mod.register_forward_pre_hook(lambda m, a, p=pattern: stack.append(p)).remove)
            undo.append(mod.register_forward_hook(lambda m, a, o: stack.pop() and None).remove)   # None: keep the output
        for op in getattr(mod, "resolved_ops", {}):        # the token mixer's op (ops/<op>/): its own row
            fn = getattr(mod, op)

            def traced(*a, fn=fn, where=f"{pattern}.{op} (op)", **k):
                stack.append(where)
                try:
                    return fn(*a, **k)
                finally:
                    stack.pop()
            setattr(mod, op, traced)
            undo.append(lambda mod=mod, op=op, fn=fn: setattr(mod, op, fn))
    seen, out = set(), collections.Counter()

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        key = (storage.data_ptr(), t.device)
        if key not in seen and not isinstance(t, torch.nn.Parameter) and storage.nbytes():
            seen.add(key)
            out[(stack[-1], str(t.dtype).replace("torch.", ""))] += storage.nbytes()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(idx, targets)
    finally:
        for fn in undo:
            fn()
    return out


def main(argv: list[str] | None = None) -> dict:
    from config import load_config
    from model import build_model

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--backend", default="chunk", help="e.g. naive, chunk, fused[state]")
    p.add_argument("--batch", type=int, default=8, help="the micro-batch to scale to")
    p.add_argument("--seq-len", type=int, default=2048, help="the sequence length to scale to")
    p.add_argument("--layers", type=int, default=1, help="blocks to build and measure")
    p.add_argument("--measure-seq-len", type=int, default=128)
    args = p.parse_args(argv)
    cfg = load_config(args.config).model
    n_layers = cfg.n_layers
    cfg.backend, cfg.fuse = parse_backend(args.backend)
    cfg.n_layers = args.layers
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    T0 = args.measure_seq_len
    found = []
    for T in (T0, 2 * T0):      # two lengths: the per-token slope, apart from what does not grow (weight copies)
        idx = torch.randint(0, cfg.vocab_size, (1, T + 1), device=device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            found.append(saved_bytes(model, idx[:, :-1], idx[:, 1:]))
    tokens = args.batch * args.seq_len
    full = build_model_params(cfg, n_layers, args.layers, model)
    rows = []
    for key in sorted(set(found[0]) | set(found[1]), key=lambda k: -found[1][k]):
        (where, dtype), (b1, b2) = key, (found[0][key], found[1][key])
        per_token = (b2 - b1) / T0
        nbytes = b1 - per_token * T0 + per_token * tokens
        per_layer = where.startswith("blocks.")
        mb = nbytes * (n_layers / args.layers if per_layer else 1) / 2**20
        rows.append({"module": where, "dtype": dtype, "MB": mb, "per_layer_MB": mb / n_layers if per_layer else None})
    rows.sort(key=lambda r: -r["MB"])
    total_act = sum(r["MB"] for r in rows)
    states = full * 16 / 2**20                      # fp32 weights, fp32 grads, AdamW's two fp32 moments
    print(f"{Path(args.config).stem}, backend {args.backend}, measured on {device} at T={args.measure_seq_len} with "
          f"{args.layers} of {n_layers} blocks; scaled to B{args.batch} T{args.seq_len}, {n_layers} blocks\n")
    print("| module | dtype | saved MB (all layers) | per layer |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['module']} | {r['dtype']} | {r['MB']:,.0f} | {'' if r['per_layer_MB'] is None else format(r['per_layer_MB'], ',.1f')} |")
    print(f"| **saved activations** | | **{total_act:,.0f}** | |")
    print(f"| weights + grads + AdamW (fp32, {full / 1e6:.1f}M params) | | {states:,.0f} | |")
    return {"rows": rows, "activations_MB": total_act, "states_MB": states}


def build_model_params(cfg, n_layers: int, built: int, model: torch.nn.Module) -> int:
    """The full config's parameter count from the built model's: blocks scale, the rest does not."""
    block = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks."))
    rest = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("blocks."))
    return rest + block * n_layers // built


if __name__ == "__main__":
    main()
