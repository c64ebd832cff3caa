"""The projection chain's fused sides (issue [H]) against the unfused chains as PyTorch runs them in the model
(bf16 autocast, fp32 residual stream and fp32 normed input), forward and forward+backward, each checked
against the fp32 oracle first, with the analytical HBM bytes of each and the activation bytes each keeps.

Output side (ops/proj_out; RMSNorm, SiLU, the product, F.linear, the block's residual add): `unfused`;
`fused` (gate kernel, then the Triton GEMM with the residual add in its epilogue); `fused-mm` (the same gate
kernel and backward, the GEMM by cuBLAS torch.mm followed by the residual add); `fused-addmm` (cuBLAS addmm
with an fp32 out_dtype, the residual as its C operand; only where this torch has aten::addmm.dtype for CUDA).

Input side (ops/proj_in; five F.linear, each casting fp32 x to bf16, and logsigmoid(up(down(x)))/16):
`unfused`; `unfused-leaf` (the same chain handed x as a leaf: see normed_input; the protocol of the results
before 2026-11-26); `fused` (the library's: x cast once, five cuBLAS mm's writing q, k, v, r, low into their slices,
the gk kernel; backward: gk kernel, dx by the Triton dgrad GEMM over the five gradients, cuBLAS wgrads);
`triton` (fused.TritonProjIn: the forward by the wide Triton GEMM too); `cublas-cat` (fused.CatProjIn: dx by
one cuBLAS mm over the concatenated gradients). Beside them, unchecked, `GEMMs alone`: the chain's six cuBLAS GEMMs
forward (and autograd's dgrads and wgrads backward, the five dx parts summed) on x and weights already in bf16,
with nothing else: the unfused chain's GEMM time. It is no bound on a fusion, which may merge those GEMMs (the
fused dgrad is one GEMM over the five gradients, so `fused` runs forward+backward in less than this).

    python scripts/bench_proj.py --out bench/results/proj                 # both sides at the seed's shape
    python scripts/bench_proj.py --out /tmp/p --side out --shape 8,2048,4,256,1024      # GLA-340M's output side
    python scripts/bench_proj.py --out /tmp/p --side in --in-shape 8,2048,1024,4,128,256,16
Writes proj.{md,json,png} (output side) and proj_in.{md,json,png} under --out and prints the tables last.
CUDA only.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ops.proj_in import fused as fused_in
from ops.proj_in import naive as naive_in
from ops.proj_out import fused, naive

SEED_SHAPE = (8, 4096, 16, 128, 2048)             # B, T, H, V, d: the acceptance configuration
IN_SEED_SHAPE = (8, 4096, 2048, 16, 128, 128, 16)  # B, T, d, H, K, V, L: the same layer's input side
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
    def forward(ctx, o, r, nw, w, res, eps, V, gate_first):
        y = fused.gate_fwd(o, r, nw.float(), eps, V, gate_first) @ w.t()
        ctx.save_for_backward(o, r, nw, w)
        ctx.eps, ctx.V, ctx.has_res, ctx.gate_first = eps, V, res is not None, gate_first
        return y if res is None else res + y


class _AddmmProjOut(fused.FusedProjOut):
    """As _MmProjOut, but one cuBLAS addmm: C = the residual, fp32 out_dtype (aten::addmm.dtype)."""
    @staticmethod
    def forward(ctx, o, r, nw, w, res, eps, V, gate_first):
        g = fused.gate_fwd(o, r, nw.float(), eps, V, gate_first)
        with torch.autocast(g.device.type, enabled=False):     # autocast would cast the fp32 residual to bf16
            y = g @ w.t() if res is None else torch.addmm(res, g, w.t(), out_dtype=res.dtype)
        ctx.save_for_backward(o, r, nw, w)
        ctx.eps, ctx.V, ctx.has_res, ctx.gate_first = eps, V, res is not None, gate_first
        return y


def fused_mm(o, r, norm_weight, w_o, residual=None, eps=1e-6):
    return fused.launch(_MmProjOut, o, r, norm_weight, w_o, residual, eps)


def fused_addmm(o, r, norm_weight, w_o, residual=None, eps=1e-6):
    return fused.launch(_AddmmProjOut, o, r, norm_weight, w_o, residual, eps)


VARIANTS = {"unfused": naive.proj_out, "fused": fused.proj_out, "fused-mm": fused_mm, "fused-addmm": fused_addmm}


def hbm_bytes_in(B: int, T: int, d: int, H: int, K: int, V: int, L: int) -> dict:
    """The input side's analytical HBM traffic (bytes), as hbm_bytes counts it. X = M·d fp32 (x, dx), Xc = M·d
    bf16 (a cast of x), Q = 2·M·HK + 2·M·HV bf16 (q, k, v, r together, or their gradients), Lo = M·L bf16 (low,
    dlow), G = M·HK fp32 (gk, dgk), A = M·HK bf16 (the unfused chain's up-projection output and its gradient),
    W = N·d bf16 (the five weights); Wd = L·d bf16 (W_down's share of W); the fused gk backward's fp32 partials: Pl
    of dlow (one [M, L] per 128 columns), written and read, and Pw of dW_up and db (one [L + 1, HK] per row range;
    at most 264 ranges, ops/proj_in/fused.py's GK_BWD_PROGRAMS)."""
    M, HK, HV, N = B * T, H * K, H * V, 2 * H * K + 2 * H * V + L
    X, Xc, Q, Lo, G, A, W, Wd = M * d * 4, M * d * 2, 2 * M * (HK + HV) * 2, M * L * 2, M * HK * 4, M * HK * 2, \
        N * d * 2, L * d * 2
    Pl, Pw = 2 * -(-HK // 128) * M * L * 4, 2 * 264 * (L + 1) * HK * 4
    wcat = {"W_cat (copy + cast)": 3 * W, "prologue (xc, low, gk)": X + Xc + Lo + G + Wd}
    unfused_fwd = {"cast x ×5": 5 * (X + Xc), "cast weights": 3 * W, "linear q, k, v, r": 4 * Xc + W - Wd + Q,
                   "linear down": Xc + Lo, "linear up + b": Lo + A, ".float()": A + G, "logsigmoid": 2 * G,
                   "/ normalizer": 2 * G}
    triton_fwd = {**wcat, "wide GEMM (q, k, v, r)": Xc + W - Wd + Q}
    mm_fwd = {**wcat, "4 mm's into the slices": 4 * Xc + W - Wd + Q}
    unfused_bwd = {"/ normalizer bwd": 2 * G, "logsigmoid bwd": 3 * G, ".float() bwd": G + A,
                   "linear up bwd (dlow, dW_up, db)": 3 * A + 2 * Lo, "linear down bwd": 2 * Lo + 2 * Xc,
                   "dgrads q, k, v, r (bf16)": Q + W - Wd + 4 * Xc, "wgrads q, k, v, r": Q + 4 * Xc + W - Wd,
                   "dW → fp32": 3 * W, "dx_s bf16 → fp32 ×5": 5 * (Xc + X), "sum of x's 5 grads": 4 * 3 * X}
    leaf_fwd = {**{k: v for k, v in unfused_fwd.items() if k != "cast x ×5"}, "cast x once (autocast's cache)": X + Xc}
    leaf_bwd = {**{k: v for k, v in unfused_bwd.items() if not k.startswith(("dx_s", "sum of x"))},
                "sum of x's 5 grads (bf16)": 4 * 3 * Xc, "dx bf16 → fp32": Xc + X}
    shared_bwd = {"gk backward kernel (dz on chip) and its partials' sums": G + Lo + Lo + Pl + Pw,
                  "wgrads ×5, fp32 out": Q + Lo + 5 * Xc + 2 * W}
    tdgrad_bwd = {"Triton dgrad, TMA (dx fp32 once)": Q + Lo + W + X, **shared_bwd}
    cat_bwd = {"torch.cat of the grads": 2 * (Q + Lo), "mm (bf16 dx)": Q + Lo + W + Xc, "dx → fp32": Xc + X,
               **shared_bwd}
    return {name: {"parts": parts, "total": sum(parts.values())}
            for name, parts in (("unfused fwd", unfused_fwd), ("unfused-leaf fwd", leaf_fwd),
                                ("unfused-leaf bwd", leaf_bwd), ("fused fwd", mm_fwd), ("triton fwd", triton_fwd),
                                ("cublas-cat fwd", mm_fwd), ("unfused bwd", unfused_bwd), ("fused bwd", tdgrad_bwd),
                                ("triton bwd", tdgrad_bwd), ("cublas-cat bwd", cat_bwd))}


def normed_input(fn):
    """fn with x (its first argument) handed over as the model hands it: the block's RMSNorm output, a non-leaf.
    Autocast caches its bf16 cast of an fp32 leaf that requires grad (its heuristic for weights) until the
    autocast region ends; were x such a leaf, the unfused chain would cast it once instead of at each F.linear
    (and sum its five gradients in bf16), which the model never does. x.view_as(x) is not a leaf and adds no
    kernel."""
    return lambda x, *a: fn(x.view_as(x), *a)


IN_VARIANTS = {"unfused": naive_in.proj_in, "fused": fused_in.proj_in, "triton": fused_in.proj_in_triton,
               "cublas-cat": fused_in.proj_in_cat}


def gemms_alone(x, w_q, w_k, w_v, w_r, w_down, w_up, b_up, n_heads, normalizer=16.0):
    """The unfused chain's six GEMMs and nothing else (inputs already bf16: no casts, no gate activation):
    not the op, a floor for it. Its backward is autograd's dgrads and wgrads of the same F.linear calls."""
    low = torch.nn.functional.linear(x, w_down)
    return (*(torch.nn.functional.linear(x, w) for w in (w_q, w_k, w_v)),
            torch.nn.functional.linear(low, w_up, b_up), torch.nn.functional.linear(x, w_r))


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


def make_inputs_in(B, T, d, H, K, V, L, seed=0):
    """The input side's: x fp32 (the block's RMSNorm output under autocast), the seven fp32 parameters. The op's
    trailing non-tensor arguments (H, normalizer) are bound by the variants' callers (see side_in)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(B, T, d, device="cuda", generator=g)
    ws = [torch.randn(n, d, device="cuda", generator=g) / d ** 0.5 for n in (H * K, H * K, H * V, H * V, L)]
    w_up = torch.randn(H * K, L, device="cuda", generator=g) / L ** 0.5
    b_up = torch.randn(H * K, device="cuda", generator=g)
    return [t.requires_grad_() for t in (x, *ws, w_up, b_up)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _outputs(y) -> tuple:
    return y if isinstance(y, tuple) else (y,)


def check(variants: dict, oracle, inputs: list, dys: list, out_names: list, in_names: list) -> dict:
    """Errors of each variant in bf16 against the fp32 oracle (same inputs in fp32), every output and every
    gradient; pass: every fused variant ≤ 2 × unfused + 1e-3 (STYLE.md §7; the unfused-* references are exempt)."""
    ref_in = [x.detach().float().requires_grad_() for x in inputs]
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = _outputs(oracle(*ref_in))
    ref_g = torch.autograd.grad(ref, ref_in, [dy.float() for dy in dys])
    out = {}
    for label, fn in variants.items():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = _outputs(fn(*inputs))
        grads = torch.autograd.grad(y, inputs, dys)
        out[label] = {**{n: rel(a, b) for n, a, b in zip(out_names, y, ref)},
                      **{n: rel(a, b) for n, a, b in zip(in_names, grads, ref_g)}}
    # the unfused-* variants are references (unfused-leaf: the same chain, x a leaf), not held to the bar
    out["pass"] = all(out[v][k] <= 2 * out["unfused"][k] + 1e-3 for v in variants if not v.startswith("unfused")
                      for k in out[v])
    return out


def runnable(all_variants: dict, inputs: list) -> tuple[dict, dict]:
    """The variants this torch can run, and why each other one cannot (fused-addmm and cublas need the
    aten::*.dtype GEMMs); the unfused chain and the library's fused op must run."""
    ok, skipped = {}, {}
    for label, fn in all_variants.items():
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = _outputs(fn(*inputs))
            torch.autograd.grad(y, inputs, [torch.ones_like(t) for t in y])
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


def timings(fn, inputs: list, dys: list) -> dict:
    """Median ms of the training forward (graph built) and of forward+backward; the latter also replayed as a CUDA
    graph (graph_ms: the device's time alone, no host launch gaps, which at the smaller layers' ~0.5 ms can decide
    the eager time); peak memory of forward+backward."""
    from triton.testing import do_bench, do_bench_cudagraph

    def fwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return _outputs(fn(*inputs))

    def fwd_bwd():
        torch.autograd.backward(fwd(), dys)
    fwd_ms = do_bench(fwd, warmup=25, rep=100, return_mode="median")
    fwd_bwd_ms = do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=inputs, return_mode="median")
    try:
        graph_ms = do_bench_cudagraph(lambda: torch.autograd.grad(fwd(), inputs, dys, allow_unused=True), rep=100,
                                      return_mode="median")
    except RuntimeError as e:                     # a variant that cannot be captured: say so, time it eagerly only
        graph_ms = float("nan")
        print(f"CUDA graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    for x in inputs:
        x.grad = None
    return {"fwd_ms": fwd_ms, "fwd_bwd_ms": fwd_bwd_ms, "graph_ms": graph_ms, "peak_extra_mb": peak / MB}


def plot(result: dict, path: Path, title: str) -> None:
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
    fig.suptitle(f"{title} {result['shape']} on {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def measure(side: str, all_variants: dict, oracle, inputs: list, dys: list, out_names: list, in_names: list,
            bytes_: dict, shape: dict, configs: dict, out: Path, stem: str, title: str) -> tuple[dict, list[str]]:
    """Checks, times and reports one side: writes {stem}.{json,md,png} under out; returns the result and table."""
    from utils.runinfo import environment

    variants, skipped = runnable(all_variants, inputs)
    for label, why in skipped.items():
        print(f"{side}: variant {label} not run: {why}")
    errors = check(variants, oracle, inputs, dys, out_names, in_names)       # also runs the autotuning, untimed
    print(f"{side}: check (rel. error vs fp32; pass = fused ≤ 2× unfused bf16 + 1e-3): "
          f"{'PASS' if errors['pass'] else 'FAIL'}")
    for label in variants:
        print(f"  {label:12s} " + "  ".join(f"{k} {v:.2e}" for k, v in errors[label].items()))
    times = {label: timings(fn, inputs, dys) for label, fn in variants.items()}
    for label, fn in variants.items():
        times[label]["saved_mb"] = saved_bytes(fn, inputs) / MB
    result = {"shape": shape, "dtype": "bf16 autocast, fp32 residual and x", "check": errors, "timings": times,
              "skipped": skipped, "hbm_bytes": bytes_, "device": torch.cuda.get_device_name(),
              "configs": {k: str(getattr(v, "best_config", "not run")) for k, v in configs.items()},
              **environment(torch.device("cuda"))}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    rows = {"fwd ms": {v: times[v]["fwd_ms"] for v in variants},
            "fwd+bwd ms": {v: times[v]["fwd_bwd_ms"] for v in variants},
            "fwd+bwd ms, CUDA graph": {v: times[v]["graph_ms"] for v in variants},
            "HBM fwd MB": {v: bytes_[f"{v} fwd"]["total"] / MB for v in variants},
            "HBM bwd MB": {v: bytes_[f"{v} bwd"]["total"] / MB for v in variants},
            "saved for bwd MB": {v: times[v]["saved_mb"] for v in variants},
            "peak extra fwd+bwd MB": {v: times[v]["peak_extra_mb"] for v in variants}}
    others = [v for v in variants if v != "unfused"]
    table = [f"| {side} | unfused (PyTorch) | " + " | ".join(others) + " | "
             + " | ".join(f"unfused ÷ {v}" for v in others) + " |", "|---" * (2 + 2 * len(others)) + "|"]
    table += [f"| {name} | " + " | ".join(f"{vals[v]:.3f}" for v in variants) + " | "
              + " | ".join(f"{vals['unfused'] / vals[v] if vals[v] else float('inf'):.2f}×" for v in others) + " |"
              for name, vals in rows.items()]
    md = [f"# {title}: fused vs unfused, " + " ".join(f"{k}={v}" for k, v in shape.items())
          + ", bf16 autocast, fp32 residual", "",
          f"device {result['device']}, torch {result['torch']}, triton {result['triton']}, "
          f"commit {result.get('commit', '?')}; do_bench median, warmup 25, rep 100; tiles {result['configs']}",
          f"check vs fp32: {'PASS' if errors['pass'] else 'FAIL'} {json.dumps(errors)}",
          *(f"not run: {v}: {why}" for v, why in skipped.items()), "", *table, "",
          "HBM bytes per kernel (analytical, scripts/bench_proj.py:hbm_bytes" + ("_in" if stem != "proj" else "")
          + "):", ""]
    md += [f"- {name}: " + ", ".join(f"{k} {v / MB:.0f}" for k, v in b["parts"].items()) + f" → {b['total'] / MB:.0f} MB"
           for name, b in bytes_.items() if name.split()[0] in variants]
    (out / f"{stem}.md").write_text("\n".join(md) + "\n")
    plot(result, out / f"{stem}.png", title)
    return result, table if errors["pass"] else table + [f"{side}: a fused variant FAILED its check; timings invalid"]


def floor_rows(result: dict, inputs: list, dys: list, bind, md: Path) -> list[str]:
    """Times gemms_alone (bf16 leaves, each gradient reshaped to its [B, T, width] output), records it in the
    result and its .md, and returns the table's rows for it: the unfused chain's GEMM time (module docstring)."""
    leaves = [t.detach().to(torch.bfloat16).requires_grad_() for t in inputs]
    fdys = [dy.reshape(*dy.shape[:2], -1).to(torch.bfloat16) for dy in dys]
    floor = timings(bind(gemms_alone), leaves, fdys)
    result["gemms_alone"] = floor
    un = result["timings"]["unfused"]
    rows = ["", "| the unfused chain's GEMMs alone (cuBLAS, bf16 inputs) | ms | unfused ÷ it |", "|---|---|---|",
            f"| fwd | {floor['fwd_ms']:.3f} | {un['fwd_ms'] / floor['fwd_ms']:.2f}× |",
            f"| fwd+bwd | {floor['fwd_bwd_ms']:.3f} | {un['fwd_bwd_ms'] / floor['fwd_bwd_ms']:.2f}× |"]
    md.write_text(md.read_text() + "\n".join(rows) + "\n")
    (md.with_suffix(".json")).write_text(json.dumps(result, indent=1, default=str))
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for proj.{md,json,png} and proj_in.{md,json,png}")
    ap.add_argument("--side", choices=("both", "out", "in"), default="both")
    ap.add_argument("--shape", default=",".join(map(str, SEED_SHAPE)), help="output side: B,T,H,V,d")
    ap.add_argument("--in-shape", default=",".join(map(str, IN_SEED_SHAPE)), help="input side: B,T,d,H,K,V,L")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_proj.py times CUDA kernels; no GPU here")
    results, tables = {}, []
    if args.side in ("both", "out"):
        B, T, H, V, d = map(int, args.shape.split(","))
        inputs = make_inputs(B, T, H, V, d)
        dys = [torch.randn(B, T, d, device="cuda")]
        results["out"], table = measure(
            "output side", VARIANTS, naive.proj_out, inputs, dys, ["out"], ["do", "dr", "dnorm_w", "dW_o", "dresidual"],
            hbm_bytes(B, T, H, V, d), dict(B=B, T=T, H=H, V=V, d=d), {"fused GEMM": fused._gemm_tuned}, args.out,
            "proj", "proj_out")
        tables += table + [""]
        del inputs, dys
    if args.side in ("both", "in"):
        B, T, d, H, K, V, L = map(int, args.in_shape.split(","))
        inputs = make_inputs_in(B, T, d, H, K, V, L)
        bind = lambda fn: normed_input(lambda *a: fn(*a, H, 16.0))                            # noqa: E731
        with torch.autocast("cuda", dtype=torch.bfloat16):                  # each gradient in its output's dtype
            dys = [torch.randn_like(y) for y in naive_in.proj_in(*[x.detach() for x in inputs], H, 16.0)]
        results["in"], table = measure(
            "input side", {**{k: bind(f) for k, f in IN_VARIANTS.items()},
                           "unfused-leaf": lambda *a: naive_in.proj_in(*a, H, 16.0)},
            bind(naive_in.proj_in), inputs, dys,
            ["q", "k", "v", "gk", "r"], ["dx", "dW_q", "dW_k", "dW_v", "dW_r", "dW_down", "dW_up", "db_up"],
            hbm_bytes_in(B, T, d, H, K, V, L), dict(B=B, T=T, d=d, H=H, K=K, V=V, L=L),
            {"wide GEMM": fused_in._gemm_tuned, "dgrad GEMM (TMA)": fused_in._dgrad_tma_tuned,
             "dgrad GEMM (pointers)": fused_in._dgrad_tuned}, args.out, "proj_in", "proj_in")
        tables += table + floor_rows(results["in"], inputs, dys, bind, args.out / "proj_in.md")
    print("\n".join(tables))
    if any(not r["check"]["pass"] for r in results.values()):
        raise SystemExit("a fused variant failed its check against the fp32 oracle (see above); timings are not valid")
    return results


if __name__ == "__main__":
    main()
