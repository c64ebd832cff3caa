"""How much of the gated-delta `chunk` op's bf16 error comes from keeping the per-chunk states h and dh in bf16
between its stages, and what fp32 states cost.

    python scripts/probe_state_precision.py [--shapes 125m,340m] [--out DIR]

For bf16 inputs shaped like a Gated DeltaNet layer (q, k L2-normalised; g = −A·dt with A = U(0, 4)² in [0, 16]
per head and dt uniform in [1e-3, 0.1], the ranges of the model's init though not its distributions, which are
A ~ U(1, 16) and log-uniform dt; β = sigmoid(·)), it compares the output and every gradient of `chunk` with bf16
and with fp32 states, and of `naive` (fp32 inside, the training reference) against `naive` in float64 on the same
inputs. The stages round h and dh to bf16 for their dots either way, so fp32 storage can move only the fp32 uses:
Σ h ⊙ dh in db, and the WY backward's dw. Besides
the elementwise relative errors it reports the errors of dg and dβ summed over batch and time per head: the sums
that A_log, dt_bias and W_β's gradients are made of, and that nearly cancel. Then it times forward+backward of
both state dtypes (do_bench medians). GPU only: Triton's interpreter overflows in bf16 dots.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.bench_kernels import rel  # noqa: E402

SHAPES = {"125m": (8, 2048, 6, 128), "340m": (8, 2048, 8, 128),   # B, T, H, K = V: the configs' training layers
          "tiny": (1, 100, 2, 32)}
DEVICE = "cuda"


def inputs(B: int, T: int, H: int, K: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    def randn(*s):
        return torch.randn(*s, device=DEVICE, generator=g)
    A = torch.empty(H, device=DEVICE).uniform_(0, 16 ** 0.5, generator=g) ** 2
    dt = torch.empty(B, T, H, device=DEVICE).uniform_(1e-3, 0.1, generator=g)
    q, k = (F.normalize(randn(B, T, H, K), dim=-1).bfloat16() for _ in range(2))
    return {"q": q, "k": k, "v": randn(B, T, H, K).bfloat16(), "g": -(A.clamp_min(1e-4) * dt),
            "beta": torch.sigmoid(randn(B, T, H)), "do": randn(B, T, H, K).bfloat16()}


def grads(fn, x: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    leaves = {n: (x[n].to(dtype) if dtype else x[n]).detach().requires_grad_() for n in ("q", "k", "v", "g", "beta")}
    o = fn(**leaves)
    o.backward(x["do"].to(o.dtype))
    out = {"o": o.detach(), **{f"d{n}": t.grad for n, t in leaves.items()}}
    out["Σdg per head"] = out["dg"].double().sum((0, 1))
    out["Σdβ per head"] = out["dbeta"].double().sum((0, 1))
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="125m,340m")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    from triton.testing import do_bench

    from ops.gated_delta import naive
    from ops.gated_delta.chunk import chunk_gated_delta

    rows = []
    for name in args.shapes.split(","):
        B, T, H, K = SHAPES[name]
        x = inputs(B, T, H, K)
        scale = K ** -0.5
        variants = {f"chunk, {str(d).split('.')[-1]} states": (lambda d: lambda **t: chunk_gated_delta(
            scale=scale, initial_state=None, output_final_state=False, state_dtype=d, **t)[0])(d)
            for d in (torch.bfloat16, torch.float32)}
        variants["naive (fp32 inside)"] = lambda **t: naive.gated_delta(scale=scale, **t)[0]
        ref = grads(variants["naive (fp32 inside)"], x, torch.float64)
        for label, fn in variants.items():
            got = grads(fn, x)
            row = {"shape": name, "dims": f"B{B} T{T} H{H} K=V={K}", "variant": label,
                   **{n: rel(got[n], ref[n]) for n in ref}}
            if label.startswith("chunk"):
                leaves = {n: x[n].detach().requires_grad_() for n in ("q", "k", "v", "g", "beta")}
                def step():
                    fn(**leaves).backward(x["do"])
                row["fwd+bwd ms"] = do_bench(step, warmup=10, rep=50, return_mode="median")
            rows.append(row)
            print(json.dumps(row), flush=True)
            del got
        del ref
        torch.cuda.empty_cache()
    keys = [k for k in rows[0] if k not in ("shape", "dims", "variant")]      # the first row is timed
    lines = ["| shape | variant | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for r in rows:
        lines.append(f"| {r['dims']} | {r['variant']} | " + " | ".join(
            f"{r[k]:.3g}" if k in r else "" for k in keys) + " |")
    table = "\n".join(lines)
    print("\nrelative L2 error against naive in float64 on the same bf16 inputs\n" + table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "state_precision.json").write_text(json.dumps(rows, indent=1))
        (args.out / "state_precision.md").write_text(table + "\n")
    return rows


if __name__ == "__main__":
    main()
