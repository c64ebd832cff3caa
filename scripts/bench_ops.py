"""How fast is each op on each backend, against its peer? Every op through one runner over a registry of cases.

    python scripts/bench_ops.py --quick                                       # one shape per op
    python scripts/bench_ops.py --ops gla --backends chunk,fused,fla --shapes mve,gla340m_layer
    python scripts/bench_ops.py --ops gla --backends fused,fla --chunk-sizes 32,64,128,256
    python scripts/bench_ops.py --ops state --shapes long --segments 4,8,16,32
    python scripts/bench_ops.py --ops proj_in,gdn_proj_in,mamba2_proj_in,proj_out
    python scripts/bench_ops.py --ops ramla --seq-lens 2048,4096,8192
    python scripts/bench_ops.py --ops attention --profile                     # + torch.profiler's kernel table
    python scripts/bench_ops.py --list                                        # the registry: ops × shapes

A case is an (op, shape). Its inputs come from the op's builder (make_inputs in ops/<op>/naive.py, the one the
op's tests use), and the op's naive oracle runs in fp32 on the same values (no TF32). Then each backend runs:
its output and the gradient of every input are compared with the oracle's (relative error ‖a − b‖ / ‖b‖), and
a backend over its bound is reported FAIL and not timed. Bounds, bf16 as the op's tests hold them: 5e-3 for the
token mixers and the state pass, 2e-3 for attention's fp16 forward, twice the unfused chain's own bf16 error
plus 1e-3 for the projection chains, twice plain MLA's bf16 error on SDPA plus 1e-3 for RA+MLA (∂α: 2e-2).

    gla, ssd,         the token mixer on bf16 inputs with fp32 decays: naive, chunk, fused and fla (the peer);
    gated_delta       --chunk-sizes runs each backend at those it supports; gla's chunk and fused rows give the
                      data-movement model's floor (ops/gla/movement.py)
    state             the state pass alone, forward (chunk_fwd_h) and backward (chunk_bwd_dh): sequential
                      (`chunk`), split into S chunk ranges (`fused S=…`: --segments and the split the op picks),
                      from per-step decays, the PyTorch reference (`naive`) and fla's passes (the peer)
    proj_in, gdn_proj_in, mamba2_proj_in, proj_out
                      the projection chains as the model runs them (bf16 autocast, fp32 input and residual):
                      fused against the unfused chain (`naive`, the peer)
    ramla             RA+MLA at --seq-lens: the op (naive, fused), its attention kernels alone (`fused core`,
                      with and without the band), GPT-2's attention on SDPA (the peer; also deterministic)
    attention         the forward-only WMMA kernel (`fused`) against SDPA's kernels (`naive`)

Times are bench_ms medians (utils/timing.py: triton.testing.do_bench, warm-up 25 ms and 100 ms of repeats; the
state pass 10 / 50): the forward builds the autograd graph as training does, fwd+bwd adds torch.autograd.grad
(no .grad accumulates). `graph`: fwd+bwd replayed as a CUDA graph, the device's time alone (chains, RA+MLA,
attention). TFLOP/s: each family's FLOP formula (flops_*), fwd+bwd counting 3× the forward. GB/s: compulsory
bytes, the forward reading every input and writing every output once, the backward reading every input and
output gradient and writing every input gradient once. Peak MB: above the inputs during fwd+bwd; saved MB: what
autograd keeps for the backward, inputs excluded. `peer ÷ this` > 1: this backend is faster.

Without a GPU it runs the `tiny` shapes in fp32 under Triton's interpreter: every code path, meaningless times.
Writes <out>/<name>.{md,json,png} after every case (a run cut short keeps what it measured); the JSON rows are
long-format, each with the device, versions and commit.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.cases import OPS, QUICK, Case, Options, registry
from bench.report import DEFAULT_OUT, environment, write
from bench.runner import force_fla_backward, run_case
from ops import BACKENDS
from utils.timing import on_gpu


def ints(spec: str, flag: str, p: argparse.ArgumentParser) -> list[int]:
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        p.error(f"{flag} {spec!r}: expected comma-separated integers")


def select(args, p: argparse.ArgumentParser) -> list[Case]:
    """The cases the flags pick: --shapes by name, else --quick's one per op, else every full shape on a GPU and
    the tiny ones without."""
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else list(OPS)
    if unknown := sorted(set(ops) - set(OPS)):
        p.error(f"unknown op(s) {', '.join(unknown)}; ops: {', '.join(OPS)}")
    seq_lens = ints(args.seq_lens, "--seq-lens", p)
    cases = [c for c in registry(seq_lens) if c.op in ops]
    if args.shapes:
        names = [s.strip() for s in args.shapes.split(",") if s.strip()]
        if unknown := sorted(set(names) - {c.shape for c in cases}):
            p.error(f"unknown shape(s) {', '.join(unknown)} for {', '.join(ops)}; --list shows the registry")
        return [c for c in cases if c.shape in names]
    if not on_gpu():
        return [c for c in cases if c.shape == "tiny"]
    if args.quick:
        first_t = f"T{seq_lens[0]}" if seq_lens else None
        return [c for c in cases if c.shape == QUICK.get(c.op, first_t)]
    return [c for c in cases if c.shape != "tiny"]


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="", help=f"comma-separated, of {', '.join(OPS)} (default: all)")
    p.add_argument("--backends", default="", help=f"comma-separated, of {', '.join(BACKENDS)} (default: all); the "
                   "chains' unfused naive, RA+MLA's SDPA peer and the bound's run are always run")
    p.add_argument("--shapes", default="", help="comma-separated shape names (--list); default: every shape on a "
                   "GPU, `tiny` without one")
    p.add_argument("--quick", action="store_true", help="one shape per op")
    p.add_argument("--chunk-sizes", default="", help="token mixers: run each backend at these chunk sizes, e.g. "
                   "32,64,128,256 (each where the backend supports it)")
    p.add_argument("--segments", default="2,4,8", help="state pass: split counts to time besides the op's own "
                   "choice ('' for that alone)")
    p.add_argument("--seq-lens", default="2048,4096,8192", help="RA+MLA: the sequence lengths (shapes T<len>)")
    p.add_argument("--profile", action="store_true", help="also torch.profiler's kernel table and summed kernel "
                   "time per timed row (5 fwd+bwd steps after 3)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder for the results (default {DEFAULT_OUT})")
    p.add_argument("--name", default="", help="file stem of <out>/<name>.{md,json,png} (default: ops-<ops>)")
    p.add_argument("--list", action="store_true", help="print the case registry and exit")
    args = p.parse_args(argv)
    if args.list:
        for c in registry(ints(args.seq_lens, "--seq-lens", p)):
            print(f"{c.op:<15} {c.shape:<14} " + " ".join(f"{k}={v}" for k, v in {**c.dims, **c.knobs}.items()))
        return []
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if unknown := sorted(set(backends) - set(BACKENDS)):
        p.error(f"unknown backend(s) {', '.join(unknown)}; backends: {', '.join(BACKENDS)}")
    cases = select(args, p)
    opts = Options(backends, ints(args.chunk_sizes, "--chunk-sizes", p), ints(args.segments, "--segments", p),
                   torch.bfloat16 if on_gpu() else torch.float32)
    device = torch.device("cuda" if on_gpu() else "cpu")
    notes = [n for n in [force_fla_backward()] if n]
    if not on_gpu():
        notes.append("no GPU: fp32 under Triton's interpreter; the checks hold, the times are the interpreter's")
    env = environment(device)
    ops = list(dict.fromkeys(c.op for c in cases))
    stem = args.out / (args.name or "ops-" + "-".join(ops or ["none"]))
    stem.parent.mkdir(parents=True, exist_ok=True)
    command = "python scripts/bench_ops.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    rows: list[dict] = []
    for case in cases:
        for r in run_case(case, opts, device, args.profile):
            rows.append(r)
            print(f"{r['op']:<14} {r['shape']:<14} {r['variant']:<34} {r['status']:<5} "
                  + (f"fwd {r['fwd_ms']:.4g} ms" + "".join(f"  {k[:-3]} {r[k]:.4g} ms" for k in ("fwdbwd_ms", "bwd_ms")
                                                           if k in r) + f"  {r.get('check', '')}"
                     if r["status"] == "ok" else r.get("check") or r.get("why", "")), flush=True)
        write(rows, env, command.strip(), notes, stem)
    if not cases:
        write(rows, env, command.strip(), notes, stem)
    print(stem.with_suffix(".md").read_text())
    return rows


if __name__ == "__main__":
    main()
