"""Where the fused RA+MLA core's forward+backward spends its time, per form (all Triton; far field on cuDNN's or
FlashAttention-2's kernel with the band in Triton): the host's time to enqueue a step beside the step's wall time
(a step is host-bound when the two agree), then torch.profiler's kernel table.

    python scripts/profile_ramla.py --seq-len 2048 > prof.log
    python scripts/profile_ramla.py --seq-len 2048 --host    # and where the host's enqueue time goes (cProfile)
    python scripts/profile_ramla.py --forms triton:auto --tiles dkv=32,64,4,2       # one form, other tiles

After the kernel tables it lists each compiled flash kernel's registers, spills and shared memory.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.profiler import ProfilerActivity, profile

FORMS = (("triton", "auto"), ("sdpa", "cudnn"), ("sdpa", "flash"))


def main(argv: list[str] | None = None) -> None:
    from ops.ramla import fused
    from ops.ramla.fused import FlashRAMLA, latent_queries
    from scripts.bench_kernels import rel
    from scripts.bench_ramla import H, L, W, form, ramla_inputs, variants

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--forms", default=",".join(f"{f}:{k}" for f, k in FORMS),
                   help="FAR:FAR_KERNEL pairs to profile, comma-separated (default: all of FORMS)")
    p.add_argument("--tiles", action="append", default=[], metavar="KERNEL=BM,BN,WARPS,STAGES",
                   help="override one kernel's tiles (fused.TILES), e.g. dkv=32,64,4,2; repeatable")
    p.add_argument("--host", action="store_true",
                   help="then cProfile the host side of the all-Triton core's and the RA+MLA layer's steps")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_ramla.py profiles CUDA kernels; run it on a GPU")
    B, T = args.batch, args.seq_len
    q, k, v, w_ql, _, alpha = ramla_inputs(B, T, "cuda")
    q_lat = latent_queries(q, w_ql).detach().requires_grad_()
    leaves = [q_lat, k, v, alpha]
    do = torch.randn(H, B, T, L, device="cuda", dtype=torch.bfloat16)

    def step():
        o = FlashRAMLA.apply(q_lat, k, v, alpha, W, L ** -0.5, fused.far_kernel(q_lat))
        return [o, *torch.autograd.grad(o, leaves, do)]

    with form("triton"):
        ref = step()    # the default tiles, all Triton: what every form and tile override is checked against
    for spec in args.tiles:
        name, _, vals = spec.partition("=")
        if name not in fused.TILES:
            raise SystemExit(f"--tiles: no kernel {name!r}; choose among {', '.join(fused.TILES)}")
        bm, bn, warps, stages = (int(x) for x in vals.split(","))
        fused.TILES[name] = dict(BM=bm, BN=bn, num_warps=warps, num_stages=stages)

    for far, kernel in (f.split(":") for f in args.forms.split(",")):
        with form(far, kernel):
            got = step()   # o, dq, dk, dv; dα, a sum that nearly cancels, is bounded by the tests instead
            err = max(rel(a, b) for a, b in zip(got[:4], ref))
            print(f"== {far} {kernel}: largest relative difference to all Triton at the default tiles {err:.1e}"
                  f"{'  <-- NaN or off' if not err < 2e-2 else ''}", flush=True)
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            print(f"== {far} {kernel}: host {1e3 * (t1 - t0) / args.steps:.3f} ms/step enqueue, "
                  f"{1e3 * (t2 - t0) / args.steps:.3f} ms/step wall", flush=True)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70),
              flush=True)
    compiled_report()
    if args.host:
        with form("triton"):
            layer, layer_leaves = variants(B, T, "cuda")["module: RA+MLA layer (fused)"]
            host_profile("core, all Triton", step)
            d_layer = torch.randn_like(layer())
            host_profile("RA+MLA layer, bf16 autocast", lambda: torch.autograd.grad(layer(), layer_leaves, d_layer))


def compiled_report() -> None:
    """Registers, spills and shared memory of every flash kernel this process compiled: at 255 registers a
    kernel spills, and pays for that in local-memory traffic. The argument signature tells the forms apart."""
    from ops.ramla import flash_kernels

    for fn in (flash_kernels.ramla_fwd_kernel, flash_kernels.ramla_bwd_dkv_kernel, flash_kernels.ramla_bwd_dq_kernel):
        for cache in getattr(fn, "device_caches", {}).values():   # Triton's own cache: internal, so best effort
            for key, kern in cache[0].items():
                md = kern.metadata
                print(f"{fn.__name__}: {kern.n_regs} registers, {kern.n_spills} spills, {md.shared} B shared, "
                      f"{md.num_warps} warps; {str(key)[:200]}", flush=True)


def host_profile(name: str, step, n: int = 50) -> None:
    """Python's own time per function over n steps (cProfile; its per-call overhead inflates Python-heavy
    paths, so read it for the ranking), after warm-up."""
    import cProfile
    import io
    import pstats

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        step()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    print(f"== host profile: {name}, {n} steps\n{text.getvalue()}", flush=True)


if __name__ == "__main__":
    main()
