"""The projection chain's fused output side (issue [H], ops/proj_out/fused.py) against the unfused chain as
PyTorch runs it in the model (RMSNorm, SiLU, the product, F.linear, the block's residual add; bf16
autocast, fp32 residual stream), forward and forward+backward, each checked against the fp32 oracle
first, with the analytical HBM bytes of each and the activation bytes each keeps for its backward.

Variants: `unfused`; `fused` (the library op: gate kernel, then the Triton GEMM with the residual add in
its epilogue); `fused-mm` (the same gate kernel and backward, the GEMM by cuBLAS torch.mm followed by
the residual add: the baseline the Triton GEMM has to beat); `fused-addmm` (cuBLAS addmm with an fp32
out_dtype, the residual as its C operand; only where this torch has aten::addmm.dtype for CUDA).

    python scripts/bench_proj.py --out bench/results/proj                 # the seed's shape
    python scripts/bench_proj.py --out /tmp/p --shape 8,2048,4,256,1024   # GLA-340M's layer
Writes proj.{md,json,png} under --out and prints the table last. CUDA only.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ops.proj_out import fused, naive

SEED_SHAPE = (8, 4096, 16, 128, 2048)             # B, T, H, V, d: the acceptance configuration
MB = 1e6


def hbm_bytes(B: int, T: int, H: int, V: int, d: int, act: int = 2, res: int = 4, param: int = 4) -> dict:
    """Analytical HBM traffic (bytes) of each chain, every kernel's compulsory reads and writes once
    (re-reads a tile schedule serves from L2 are not counted; the norm weight, V floats, is left out).
    act: bytes per activation element (bf16), res: the residual stream's (fp32), param: W_o's (fp32).
    A = M·HV·act (o, r, or any [M, H·V] intermediate), Y = M·d·act (the GEMM's bf16 output or dy),
    R = M·d·res (the residual, the output, dy), W = d·HV·act (W_o in bf16), Wp = d·HV·param."""
    M, HV = B * T, H * V
    A, Y, R, W, Wp = M * HV * act, M * d * act, M * d * res, d * HV * act, d * HV * param
    cast_w = Wp + W                                       # W_o fp32 → bf16 (autocast), forward; and dW back, backward
    unfused_fwd = {"cast W_o": cast_w,
                   "rms_norm(o)": 2 * A,                  # read o, write normed
                   "silu(r)": 2 * A,                      # read r, write s
                   "normed ⊙ s": 3 * A,                   # read both, write g
                   "linear g W_oᵀ": A + W + Y,            # read g, W_o; write y (bf16)
                   "residual + y": R + Y + R}             # read residual, y; write the fp32 sum
    fused_fwd = {"cast W_o": cast_w,
                 "gate kernel": 3 * A,                    # read o, r; write g (bf16)
                 "GEMM + residual epilogue": A + W + R + R}   # read g, W_o, residual; write the fp32 sum
    mm_fwd = {"cast W_o": cast_w, "gate kernel": 3 * A, "mm g W_oᵀ": A + W + Y, "residual + y": R + Y + R}
    unfused_bwd = {"dy fp32 → bf16 (y's grad)": R + Y,
                   "dg = dy W_o": Y + W + A,
                   "dW_o = dyᵀ g": Y + A + W,
                   "mul backward (d normed, d s)": 4 * A + 2 * A,
                   "silu backward": 3 * A,                # read ds, r; write dr
                   "rms_norm backward": 3 * A,            # read d normed, o; write do
                   "dW_o bf16 → fp32": W + Wp}
    fused_bwd = {"dy fp32 → bf16": R + Y,
                 "dg = dy W_o": Y + W + A,
                 "gate backward (g, do, dr)": 3 * A + 3 * A,   # read dg, o, r; write g, do, dr (+ V floats a program)
                 "dW_o = dyᵀ g": Y + A + W,
                 "dW_o bf16 → fp32": W + Wp}
    # the residual's gradient is dy itself in all (no kernel); its sum with the other branch is the same in all.
    # fused-mm and fused-addmm share fused's backward; fused-addmm's forward moves fused's bytes.
    return {name: {"parts": parts, "total": sum(parts.values())}
            for name, parts in (("unfused fwd", unfused_fwd), ("fused fwd", fused_fwd), ("fused-mm fwd", mm_fwd),
                                ("fused-addmm fwd", fused_fwd), ("unfused bwd", unfused_bwd),
                                ("fused bwd", fused_bwd), ("fused-mm bwd", fused_bwd), ("fused-addmm bwd", fused_bwd))}


class _MmProjOut(fused.FusedProjOut):
    """fused's gate kernel and backward; the forward GEMM by cuBLAS torch.mm, then the residual add."""
    @staticmethod
    def forward(ctx, o, r, nw, w, res, eps, V):
        y = fused.gate_fwd(o, r, nw.float(), eps, V) @ w.t()
        ctx.save_for_backward(o, r, nw, w)
        ctx.eps, ctx.V, ctx.has_res = eps, V, res is not None
        return y if res is None else res + y


class _AddmmProjOut(fused.FusedProjOut):
    """As _MmProjOut, but one cuBLAS addmm: C = the residual, fp32 out_dtype (aten::addmm.dtype)."""
    @staticmethod
    def forward(ctx, o, r, nw, w, res, eps, V):
        g = fused.gate_fwd(o, r, nw.float(), eps, V)
        with torch.autocast(g.device.type, enabled=False):     # autocast would cast the fp32 residual to bf16
            y = g @ w.t() if res is None else torch.addmm(res, g, w.t(), out_dtype=res.dtype)
        ctx.save_for_backward(o, r, nw, w)
        ctx.eps, ctx.V, ctx.has_res = eps, V, res is not None
        return y


def fused_mm(o, r, norm_weight, w_o, residual=None, eps=1e-6):
    return fused.launch(_MmProjOut, o, r, norm_weight, w_o, residual, eps)


def fused_addmm(o, r, norm_weight, w_o, residual=None, eps=1e-6):
    return fused.launch(_AddmmProjOut, o, r, norm_weight, w_o, residual, eps)


VARIANTS = {"unfused": naive.proj_out, "fused": fused.proj_out, "fused-mm": fused_mm, "fused-addmm": fused_addmm}


def make_inputs(B, T, H, V, d, seed=0):
    """The op's inputs as the model hands them over under autocast: o, r in bf16; the norm weight and
    W_o fp32 parameters; the residual stream fp32."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    o = torch.randn(B, T, H, V, device="cuda", generator=g).bfloat16()
    r = torch.randn(B, T, H * V, device="cuda", generator=g).bfloat16()
    nw = 1 + 0.1 * torch.randn(V, device="cuda", generator=g)
    w = torch.randn(d, H * V, device="cuda", generator=g) / (H * V) ** 0.5
    res = torch.randn(B, T, d, device="cuda", generator=g)
    return [x.requires_grad_() for x in (o, r, nw, w, res)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(variants: dict, inputs: list, dy: torch.Tensor) -> dict:
    """Errors of each variant in bf16 against the fp32 oracle (same inputs in fp32), output and every
    gradient; pass: every fused variant ≤ 2 × unfused + 1e-3 (STYLE.md §7)."""
    ref_in = [x.detach().float().requires_grad_() for x in inputs]
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = naive.proj_out(*ref_in)
    ref_g = torch.autograd.grad(ref, ref_in, dy)
    out = {}
    for label, fn in variants.items():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = fn(*inputs)
        grads = torch.autograd.grad(y, inputs, dy)
        out[label] = {"out": rel(y, ref), **{n: rel(g, rg) for n, g, rg in
                                             zip(("do", "dr", "dnorm_w", "dW_o", "dresidual"), grads, ref_g)}}
    out["pass"] = all(out[v][k] <= 2 * out["unfused"][k] + 1e-3 for v in variants if v != "unfused" for k in out[v])
    return out


def runnable(inputs: list) -> tuple[dict, dict]:
    """The variants this torch can run, and why each other one cannot (fused-addmm needs aten::addmm.dtype)."""
    ok, skipped = {}, {}
    for label, fn in VARIANTS.items():
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                fn(*[x.detach() for x in inputs])
            ok[label] = fn
        except (RuntimeError, TypeError) as e:
            if label in ("unfused", "fused"):
                raise
            skipped[label] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return ok, skipped


def saved_bytes(fn, inputs: list) -> int:
    """Bytes of the tensors autograd keeps for the backward (parameters and inputs excluded: both keep those)."""
    seen, total = {x.untyped_storage().data_ptr() for x in inputs}, 0

    def pack(t):
        nonlocal total
        p = t.untyped_storage().data_ptr()
        if p not in seen:
            seen.add(p)
            total += t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cuda", dtype=torch.bfloat16):
        fn(*inputs)
    return total


def timings(fn, inputs: list, dy: torch.Tensor) -> dict:
    """Median ms of the training forward (graph built) and of forward+backward; peak memory of the latter."""
    from triton.testing import do_bench

    def fwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return fn(*inputs)

    def fwd_bwd():
        fwd().backward(dy)
    fwd_ms = do_bench(fwd, warmup=25, rep=100, return_mode="median")
    fwd_bwd_ms = do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=inputs, return_mode="median")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    for x in inputs:
        x.grad = None
    return {"fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms, "peak_extra_mb": peak / MB}


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, b = result["timings"], result["hbm_bytes"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    x, width = range(2), 0.8 / len(t)
    for i, label in enumerate(t):
        ax1.bar([p + width * i for p in x], [t[label]["fwd_ms"], t[label]["fwd_bwd_ms"]], width, label=label)
        ax2.bar([p + width * i for p in x], [b[f"{label} fwd"]["total"] / MB, b[f"{label} bwd"]["total"] / MB],
                width, label=label)
    ax1.set_xticks([0.4 - width / 2, 1.4 - width / 2], ["fwd", "fwd+bwd"])
    ax1.set_ylabel("ms (median)")
    ax2.set_xticks([0.4 - width / 2, 1.4 - width / 2], ["fwd", "bwd"])
    ax2.set_ylabel("analytical HBM MB")
    ax1.legend()
    fig.suptitle(f"proj_out {result['shape']} on {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for proj.{md,json,png}")
    ap.add_argument("--shape", default=",".join(map(str, SEED_SHAPE)), help="B,T,H,V,d")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_proj.py times CUDA kernels; no GPU here")
    B, T, H, V, d = map(int, args.shape.split(","))
    from utils.runinfo import environment

    inputs = make_inputs(B, T, H, V, d)
    dy = torch.randn(B, T, d, device="cuda")
    variants, skipped = runnable(inputs)
    for label, why in skipped.items():
        print(f"variant {label} not run: {why}")
    errors = check(variants, inputs, dy)                                # also runs the autotuning, outside timing
    print(f"check (rel. error vs fp32; pass = fused ≤ 2× unfused bf16 + 1e-3): {'PASS' if errors['pass'] else 'FAIL'}")
    for label in variants:
        print(f"  {label:12s} " + "  ".join(f"{k} {v:.2e}" for k, v in errors[label].items()))
    times = {label: timings(fn, inputs, dy) for label, fn in variants.items()}
    for label, fn in variants.items():
        times[label]["saved_mb"] = saved_bytes(fn, inputs) / MB
    bytes_ = hbm_bytes(B, T, H, V, d)
    result = {"shape": dict(B=B, T=T, H=H, V=V, d=d), "dtype": "bf16 autocast, fp32 residual", "check": errors,
              "timings": times, "skipped": skipped, "hbm_bytes": bytes_, "device": torch.cuda.get_device_name(),
              "configs": {"fused GEMM": str(fused._gemm_tuned.best_config)}, **environment(torch.device("cuda"))}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "proj.json").write_text(json.dumps(result, indent=1, default=str))
    rows = {"fwd ms": {v: times[v]["fwd_ms"] for v in variants},
            "fwd+bwd ms": {v: times[v]["fwd_bwd_ms"] for v in variants},
            "HBM fwd MB": {v: bytes_[f"{v} fwd"]["total"] / MB for v in variants},
            "HBM bwd MB": {v: bytes_[f"{v} bwd"]["total"] / MB for v in variants},
            "saved for bwd MB": {v: times[v]["saved_mb"] for v in variants},
            "peak extra fwd+bwd MB": {v: times[v]["peak_extra_mb"] for v in variants}}
    others = [v for v in variants if v != "unfused"]
    table = ["| output side | unfused (PyTorch) | " + " | ".join(others) + " | "
             + " | ".join(f"unfused ÷ {v}" for v in others) + " |", "|---" * (2 + 2 * len(others)) + "|"]
    table += [f"| {name} | " + " | ".join(f"{vals[v]:.3f}" for v in variants) + " | "
              + " | ".join(f"{vals['unfused'] / vals[v] if vals[v] else float('inf'):.2f}×" for v in others) + " |"
              for name, vals in rows.items()]
    md = [f"# proj_out: fused vs unfused, {B=} {T=} {H=} {V=} {d=}, bf16 autocast, fp32 residual",
          "", f"device {result['device']}, torch {result['torch']}, triton {result['triton']}, "
          f"commit {result.get('commit', '?')}; do_bench median, warmup 25, rep 100; tiles {result['configs']}",
          f"check vs fp32: {'PASS' if errors['pass'] else 'FAIL'} {json.dumps(errors)}",
          *(f"not run: {v}: {why}" for v, why in skipped.items()), "", *table, "",
          "HBM bytes per kernel (analytical, scripts/bench_proj.py:hbm_bytes):", ""]
    md += [f"- {name}: " + ", ".join(f"{k} {v / MB:.0f}" for k, v in b["parts"].items()) + f" → {b['total'] / MB:.0f} MB"
           for name, b in bytes_.items() if name.split()[0] in variants]
    (args.out / "proj.md").write_text("\n".join(md) + "\n")
    plot(result, args.out / "proj.png")
    print("\n".join(table))
    if not errors["pass"]:
        raise SystemExit("a fused variant failed its check against the fp32 oracle (see above); timings are not valid")
    return result


if __name__ == "__main__":
    main()
