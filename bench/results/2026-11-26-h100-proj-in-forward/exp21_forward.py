"""[H] GLA input side, forward alone: where can 0.13 ms come from? (2026-11-26, session 21)

Times, in one process at the seed shape (M = 32768, d = 2048, HK = HV = 2048, L = 16):
  GEMM forms: 4 mm's x W_sᵀ (TN, the library's), 4 mm's on pre-transposed weights (NN), one bmm over a stride-0
              x (TN and NN), one wide mm into [M, 8192] (not the layout we need; the floor)
  weight prep: the library's 5 copies + w_up cast against one torch._foreach_copy_
  prologue:    the library's one kernel against cast+low then a gk kernel, and the gk kernel alone
  pipelines:   the library's forward; with bmm; with foreach; gk on a side stream beside the GEMMs
  the unfused forward and the op's forward (autograd, autocast) as bench_proj times them
Each row: do_bench median (warmup 25, rep 100), three rounds interleaved; the table prints the median of rounds.
"""
import json
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, ".")
from ops.proj_in import fused as F  # noqa: E402
from ops.proj_in import naive as N  # noqa: E402
from ops.proj_in.kernels import _logsigmoid, _z_tile, prologue_kernel  # noqa: E402
from ops.common.tiles import dot_precision  # noqa: E402


@triton.jit
def gk_kernel(low, w_up, b_up, gk, M, HK, L, inv_norm, PREC: tl.constexpr, BR: tl.constexpr, BN: tl.constexpr,
              BL: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ll = tl.arange(0, BL)
    mr, mc, ml = rows < M, cols < HK, ll < L
    low_t = tl.load(low + rows[:, None] * L + ll[None, :], mask=mr[:, None] & ml[None, :], other=0.0)
    z = _z_tile(low_t, w_up, b_up, cols, ll, mc, HK, L, PREC)
    tl.store(gk + rows[:, None] * HK + cols[None, :], _logsigmoid(z) * inv_norm, mask=mr[:, None] & mc[None, :])


B, T, d, H, K, V, L = 8, 4096, 2048, 16, 128, 128, 16
M, HK, HV = B * T, H * K, H * V
dev = "cuda"
torch.manual_seed(0)
x = torch.randn(M, d, device=dev)
w_q, w_k, w_v, w_r = (torch.randn(n, d, device=dev) * d ** -0.5 for n in (HK, HK, HV, HV))
w_down = torch.randn(L, d, device=dev) * d ** -0.5
w_up = torch.randn(HK, L, device=dev) * L ** -0.5
b_up = torch.randn(HK, device=dev)
bf = torch.bfloat16
ws5 = (w_q, w_k, w_v, w_r, w_down)
C4 = 2 * HK + 2 * HV
bounds = [0, HK, 2 * HK, 2 * HK + HV, C4]

w_cat = F.concat_weights(ws5, bf)
wu = w_up.to(bf)
xc, low, gk_ref = F.prologue(x, w_cat[C4:], wu, b_up, 1 / 16, bf)
out = torch.empty(M * C4, device=dev, dtype=bf)
w_t = w_cat[:C4].t().contiguous()                                  # [d, C4]
w_t4 = torch.stack([w_cat[a:b].t().contiguous() for a, b in zip(bounds, bounds[1:])])   # [4, d, 2048]
wide = torch.empty(M, C4, device=dev, dtype=bf)


def g_tn():
    F.mm_gemm(xc, w_cat, out, HK, HV)


def g_nn():
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        torch.mm(xc, w_t4[i], out=out[M * a:M * b].view(M, b - a))


def g_nn_strided():
    for a, b in zip(bounds, bounds[1:]):
        torch.mm(xc, w_t[:, a:b], out=out[M * a:M * b].view(M, b - a))


def g_bmm_tn():
    torch.bmm(xc.expand(4, M, d), w_cat[:C4].view(4, HK, d).transpose(1, 2), out=out.view(4, M, HK))


def g_bmm_nn():
    torch.bmm(xc.expand(4, M, d), w_t4, out=out.view(4, M, HK))


def g_wide():
    torch.mm(xc, w_cat[:C4].t(), out=wide)


def prep_lib():
    F.concat_weights(ws5, bf), w_up.to(bf).contiguous()


def prep_foreach():
    wc = torch.empty(C4 + L, d, device=dev, dtype=bf)
    wu_ = torch.empty(HK, L, device=dev, dtype=bf)
    rows = [0, HK, 2 * HK, 2 * HK + HV, C4, C4 + L]
    torch._foreach_copy_([wc[a:b] for a, b in zip(rows, rows[1:])] + [wu_], list(ws5) + [w_up])
    return wc, wu_


def prologue_lib():
    return F.prologue(x, w_cat[C4:], wu, b_up, 1 / 16, bf)


PT = dict(BR=64, BK=64, BN=128, num_warps=8, num_stages=3)


def cast_low(xin=x):
    xc_ = torch.empty(M, d, device=dev, dtype=bf)
    low_ = torch.empty(M, L, device=dev, dtype=bf)
    prologue_kernel[(triton.cdiv(M, 64),)](xin, xc_, w_cat[C4:], low_, wu, b_up, low_, M, d, 0, L, 1 / 16,
                                          STORE_XC=True, PREC=dot_precision(xc_), BL=16, **PT)
    return xc_, low_


def gk_only(low_):
    gk_ = torch.empty(M, HK, device=dev, dtype=torch.float32)
    gk_kernel[(triton.cdiv(M, 32), triton.cdiv(HK, 128))](low_, wu, b_up, gk_, M, HK, L, 1 / 16, PREC="ieee",
                                                           BR=32, BN=128, BL=16, num_warps=4)
    return gk_


side = torch.cuda.Stream()
side_hi = torch.cuda.Stream(priority=-1)


def pipe(gemm=g_tn, prep=prep_lib, split=False, stream=None):
    def run():
        prep()
        if not split:
            prologue_lib()
            gemm()
            return
        xc_, low_ = cast_low()
        if stream is None:
            gk_only(low_)
            gemm()
            return
        ev = torch.cuda.Event()
        ev.record()
        stream.wait_event(ev)
        with torch.cuda.stream(stream):
            gk_only(low_)
        gemm()
        torch.cuda.current_stream().wait_stream(stream)
    return run


xs = [t.detach().requires_grad_() for t in (x, w_q, w_k, w_v, w_r, w_down, w_up, b_up)]


def op_fwd(fn):
    def run():
        with torch.autocast("cuda", dtype=bf):
            fn(xs[0].view(B, T, d), *xs[1:], H, 16.0)
    return run


def check():
    """Each GEMM form and pipeline piece against the library's outputs (exact: same operands, same K order is
    not promised across cuBLAS kernels, so ≤ 1 bf16 ulp-ish)."""
    res = {}
    g_tn()
    ref = out.clone()
    for name, g in (("nn", g_nn), ("nn_strided", g_nn_strided), ("bmm_tn", g_bmm_tn), ("bmm_nn", g_bmm_nn)):
        out.zero_()
        g()
        res[name] = (out.float() - ref.float()).abs().max().item()
    wc, wu_ = prep_foreach()
    res["foreach_wcat"] = (wc.float() - w_cat.float()).abs().max().item()
    res["foreach_wu"] = (wu_.float() - wu.float()).abs().max().item()
    xc_, low_ = cast_low()
    res["cast_low_xc"] = (xc_.float() - xc.float()).abs().max().item()
    res["cast_low_low"] = (low_.float() - low.float()).abs().max().item()
    res["gk_kernel"] = (gk_only(low_) - gk_ref).abs().max().item()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    g_bmm_tn()
    torch.cuda.synchronize()
    res["bmm_extra_MB"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    return res


ROWS = {
    "gemm 4 mm TN (library)": g_tn, "gemm 4 mm NN": g_nn, "gemm 4 mm NN strided": g_nn_strided,
    "gemm bmm TN (stride-0 x)": g_bmm_tn, "gemm bmm NN": g_bmm_nn, "gemm one wide mm [M, 8192]": g_wide,
    "prep library (5 copies + cast)": prep_lib, "prep foreach_copy_": prep_foreach,
    "prologue library": prologue_lib, "cast + low (no gk)": cast_low, "gk kernel alone": lambda: gk_only(low),
    "pipe library": pipe(), "pipe bmm TN": pipe(gemm=g_bmm_tn), "pipe foreach": pipe(prep=prep_foreach),
    "pipe foreach + bmm TN": pipe(g_bmm_tn, prep_foreach), "pipe split": pipe(split=True),
    "pipe split, gk on side stream": pipe(split=True, stream=side),
    "pipe split, gk on high-priority side stream": pipe(split=True, stream=side_hi),
    "pipe split + bmm, gk on side stream": pipe(g_bmm_tn, prep_foreach, split=True, stream=side),
    "op fwd: unfused (naive, autocast)": op_fwd(N.proj_in), "op fwd: fused (library)": op_fwd(F.proj_in),
}

if __name__ == "__main__":
    print("check", json.dumps(check()))
    times = {k: [] for k in ROWS}
    for rnd in range(3):
        for k, fn in ROWS.items():
            times[k].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
        print("round", rnd, "done", flush=True)
    print("| row | ms (median of 3) | rounds |\n|---|---|---|")
    for k, v in times.items():
        print(f"| {k} | {sorted(v)[1]:.4f} | {', '.join(f'{t:.4f}' for t in v)} |")
    # a trace of the library forward and the side-stream pipeline: the kernels and their overlap
    from torch.profiler import ProfilerActivity, profile
    for name in ("pipe library", "pipe split, gk on side stream", "pipe split, gk on high-priority side stream"):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                ROWS[name]()
            torch.cuda.synchronize()
        evs = sorted([e for e in prof.events() if e.device_type.name == "CUDA"], key=lambda e: e.time_range.start)
        t0 = evs[-1].time_range.start
        print(f"== trace {name}: last step's kernels (start µs rel., duration µs)")
        last = [e for e in evs if e.time_range.start >= evs[len(evs) * 2 // 3].time_range.start]
        t0 = last[0].time_range.start
        for e in last:
            print(f"  {e.time_range.start - t0:8.1f} {e.time_range.end - e.time_range.start:8.1f}  {e.name[:70]}")
