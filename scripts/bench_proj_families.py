"""The projection chains of Gated DeltaNet and Mamba-2 (issue [H]): fused against unfused (the layer's PyTorch
lines as the model runs them: bf16 autocast, fp32 normed input and residual), forward and forward+backward,
each variant first checked against the fp32 oracle (pass: every output and gradient within 2× the unfused
chain's own bf16 error + 1e-3), with the activation bytes each saves and its peak memory. Times: do_bench's
wall-clock median; forward+backward replayed as a CUDA graph (the device's time alone); and the summed CUDA
kernel time of one forward+backward (torch.profiler), which also leaves out the host's launch gaps.

    gdn in       ops/gdn_proj_in: six linears, three ShortConvs, two F.normalize, β, g   vs one GEMM + conv kernels
    mamba2 in    ops/mamba2_proj_in: in_proj, the ShortConv over xBC, dt                  vs the same GEMM + conv kernel
    mamba2 out   ops/proj_out gate_first: RMSNorm(y ⊙ silu(z)) W_outᵀ + residual          vs gate kernel + GEMM
    (GDN's output side is GLA's proj_out, measured by scripts/bench_proj.py.)

    python scripts/bench_proj_families.py --out bench/results/proj_families       # GDN-340M and Mamba2-370M layers
Writes proj_families.{md,json,png} under --out and prints the table last. CUDA only.
"""
from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ops.gdn_proj_in import fused as gdn_fused
from ops.gdn_proj_in import naive as gdn_naive
from ops.mamba2_proj_in import fused as m2_fused
from ops.mamba2_proj_in import naive as m2_naive
from ops.proj_out import fused as out_fused
from ops.proj_out import naive as out_naive
from scripts.bench_proj import check, normed_input, runnable, saved_bytes, timings
from scripts.profile_proj_out import profiled_steps

MB = 1e6


def gdn_case(B=8, T=2048, d=1024, H=8, K=128, V=128, W=4) -> dict:
    """GDN-340M's layer: x fp32 (the block's norm output, handed over as a non-leaf: bench_proj.normed_input) and
    fp32 parameters, as the model holds them. `unfused-leaf` is the chain handed x as a leaf, whose bf16 cast
    autocast then caches across the six linears (the protocol before 2026-11-26), timed beside for the record."""
    g = torch.Generator(device="cuda").manual_seed(0)
    rnd = partial(torch.randn, generator=g, device="cuda")
    ins = [rnd(B, T, d), *(rnd(n, d) / d ** 0.5 for n in (H * K, H * K, H * V, H * V, H, H)),
           *(rnd(c, 1, W) / W ** 0.5 for c in (H * K, H * K, H * V)), rnd(H).abs() + 0.5, rnd(H) - 3]
    return dict(name="gdn in", shape=dict(B=B, T=T, d=d, H=H, K=K, V=V, W=W), inputs=ins,
                variants={"unfused": normed_input(lambda *a: gdn_naive.gdn_proj_in(*a, H)),
                          "fused": normed_input(lambda *a: gdn_fused.gdn_proj_in(*a, H)),
                          "unfused-leaf": lambda *a: gdn_naive.gdn_proj_in(*a, H)},
                outs=["q", "k", "v", "g", "beta", "r"],
                grads=["dx", "dW_q", "dW_k", "dW_v", "dW_r", "dW_b", "dW_a", "dconv_q", "dconv_k", "dconv_v",
                       "dA_log", "ddt_bias"])


def mamba2_in_case(B=8, T=2048, d=1024, d_inner=2048, d_state=128, H=32, W=4) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    rnd = partial(torch.randn, generator=g, device="cuda")
    conv_dim = d_inner + 2 * d_state
    ins = [rnd(B, T, d), rnd(d_inner + conv_dim + H, d) / d ** 0.5, rnd(conv_dim, 1, W) / W ** 0.5,
           0.3 * rnd(conv_dim), rnd(H) - 3]
    return dict(name="mamba2 in", shape=dict(B=B, T=T, d=d, d_inner=d_inner, d_state=d_state, H=H, W=W), inputs=ins,
                variants={"unfused": normed_input(lambda *a: m2_naive.mamba2_proj_in(*a, d_inner, d_state)),
                          "fused": normed_input(lambda *a: m2_fused.mamba2_proj_in(*a, d_inner, d_state))},
                outs=["z", "x", "B", "C", "dt"], grads=["du", "dW_in", "dconv_w", "dconv_b", "ddt_bias"])


def mamba2_out_case(B=8, T=2048, d=1024, d_inner=2048) -> dict:
    """y and z as the mixer hands them over under autocast (bf16), the norm weight and W_out fp32, the residual fp32."""
    g = torch.Generator(device="cuda").manual_seed(0)
    rnd = partial(torch.randn, generator=g, device="cuda")
    ins = [rnd(B, T, 1, d_inner).bfloat16(), rnd(B, T, d_inner).bfloat16(), 1 + 0.3 * rnd(d_inner),
           rnd(d, d_inner) / d_inner ** 0.5, rnd(B, T, d)]
    return dict(name="mamba2 out", shape=dict(B=B, T=T, d=d, d_inner=d_inner), inputs=ins,
                variants={"unfused": partial(out_naive.proj_out, eps=1e-5, gate_first=True),
                          "fused": partial(out_fused.proj_out, eps=1e-5, gate_first=True)},
                outs=["out"], grads=["dy", "dz", "dnorm_w", "dW_out", "dresidual"])


def device_ms(fn, inputs: list, dys: list, steps: int = 5) -> float:
    """Summed CUDA kernel time of one forward+backward (torch.profiler, mean of `steps`): the device's share of the
    wall time do_bench reports, without the host's launch gaps. At these layer sizes a fused op's few large
    kernels can leave the GPU waiting on Python (each Triton launch costs tens of µs of host time), which a whole
    model hides when its step is GPU-bound; both numbers are reported."""
    prof = profiled_steps(fn, inputs, dys, steps)
    return sum(e.self_device_time_total for e in prof.key_averages()) / steps / 1e3


def measure(case: dict) -> dict:
    inputs = [x.requires_grad_() for x in case["inputs"]]
    variants, skipped = runnable(case["variants"], inputs)
    assert not skipped, skipped
    with torch.autocast("cuda", dtype=torch.bfloat16):
        outs = variants["unfused"](*[x.detach() for x in inputs])
    outs = outs if isinstance(outs, tuple) else (outs,)
    dys = [torch.randn_like(y) for y in outs]
    errors = check(variants, case["variants"]["unfused"], inputs, dys, case["outs"], case["grads"])
    times = {label: timings(fn, inputs, dys) for label, fn in variants.items()}
    for label, fn in variants.items():
        times[label]["saved_mb"] = saved_bytes(fn, inputs) / MB
        times[label]["device_fwd_bwd_ms"] = device_ms(fn, inputs, dys)
    return dict(shape=case["shape"], check=errors, timings=times)


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.5))
    for ax, (name, r) in zip(axes, results.items()):
        t = r["timings"]
        for i, key in enumerate(("fwd_ms", "fwd_bwd_ms")):
            ax.bar([i - 0.2, i + 0.2], [t["unfused"][key], t["fused"][key]], 0.4,
                   color=["tab:gray", "tab:blue"], label=["unfused", "fused"] if i == 0 else None)
        ax.set_xticks([0, 1], ["fwd", "fwd+bwd"])
        ax.set_ylabel("ms")
        ax.set_title(f"{name}: {t['unfused']['fwd_bwd_ms'] / t['fused']['fwd_bwd_ms']:.2f}× fwd+bwd")
        ax.legend()
    fig.suptitle(f"projection chains, bf16, {torch.cuda.get_device_name()}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for proj_families.{md,json,png}")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_proj_families.py times CUDA kernels; no GPU here")
    from utils.runinfo import environment

    results = {}
    for make in (gdn_case, mamba2_in_case, mamba2_out_case):
        case = make()
        results[case["name"]] = measure(case)
        del case
        torch.cuda.empty_cache()
    env = environment(torch.device("cuda"))
    args.out.mkdir(parents=True, exist_ok=True)
    record = {**env, "device": torch.cuda.get_device_name(), "results": results}
    (args.out / "proj_families.json").write_text(json.dumps(record, indent=1, default=str))
    table = ["| chain | shape | unfused fwd ms | fused fwd ms | fwd | unfused fwd+bwd ms | fused fwd+bwd ms | fwd+bwd "
             "| CUDA graph fwd+bwd ms unfused / fused | graph | kernel time fwd+bwd ms unfused / fused | kernels "
             "| saved MB unfused / fused | peak extra MB unfused / fused | check |", "|---" * 15 + "|"]
    for name, r in results.items():
        u, f = r["timings"]["unfused"], r["timings"]["fused"]
        table.append(f"| {name} | {' '.join(f'{k}{v}' for k, v in r['shape'].items())} | {u['fwd_ms']:.3f} | "
                     f"{f['fwd_ms']:.3f} | {u['fwd_ms'] / f['fwd_ms']:.2f}× | {u['fwd_bwd_ms']:.3f} | "
                     f"{f['fwd_bwd_ms']:.3f} | {u['fwd_bwd_ms'] / f['fwd_bwd_ms']:.2f}× | "
                     f"{u['graph_ms']:.3f} / {f['graph_ms']:.3f} | {u['graph_ms'] / f['graph_ms']:.2f}× | "
                     f"{u['device_fwd_bwd_ms']:.3f} / {f['device_fwd_bwd_ms']:.3f} | "
                     f"{u['device_fwd_bwd_ms'] / f['device_fwd_bwd_ms']:.2f}× | {u['saved_mb']:.0f} / {f['saved_mb']:.0f} | {u['peak_extra_mb']:.0f} / {f['peak_extra_mb']:.0f} | "
                     f"{'PASS' if r['check']['pass'] else 'FAIL'} |")
    table += [f"\n{name}, {label} (x a leaf: autocast casts it once): fwd {t['fwd_ms']:.3f} ms, fwd+bwd "
              f"{t['fwd_bwd_ms']:.3f} ms; unfused ÷ it {r['timings']['unfused']['fwd_ms'] / t['fwd_ms']:.2f}× / "
              f"{r['timings']['unfused']['fwd_bwd_ms'] / t['fwd_bwd_ms']:.2f}×; it ÷ fused "
              f"{t['fwd_ms'] / r['timings']['fused']['fwd_ms']:.2f}× / "
              f"{t['fwd_bwd_ms'] / r['timings']['fused']['fwd_bwd_ms']:.2f}×"
              for name, r in results.items() for label, t in r["timings"].items() if label == "unfused-leaf"]
    md = ["# Gated DeltaNet and Mamba-2 projection chains: fused vs unfused, bf16 autocast", "",
          f"device {torch.cuda.get_device_name()}, torch {env['torch']}, triton {env['triton']}, "
          f"commit {env.get('commit', '?')}; do_bench median, warmup 25, rep 100", "", *table, "",
          "Errors vs the fp32 oracle (rel.):", ""]
    md += [f"- {name} {label}: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items())
           for name, r in results.items() for label, errs in r["check"].items() if label != "pass"]
    (args.out / "proj_families.md").write_text("\n".join(md) + "\n")
    plot(results, args.out / "proj_families.png")
    print("\n".join(table))
    if not all(r["check"]["pass"] for r in results.values()):
        raise SystemExit("a fused chain failed its check against the fp32 oracle; timings are not valid")
    return results


if __name__ == "__main__":
    main()
