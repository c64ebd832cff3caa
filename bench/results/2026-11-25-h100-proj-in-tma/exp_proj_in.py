"""Experiment: GLA proj_in kernels at the seed shape. gk kernel launch sweeps, a fused prologue (cast + low + gk),
and a TMA-descriptor dgrad, each checked against the library's result before timing."""
import itertools
import os
import sys

sys.path.insert(0, os.getcwd())
import torch
import triton
import triton.language as tl
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor

from ops.common.gemm import grouped_tile
from ops.proj_in import fused
from ops.proj_in.kernels import _logsigmoid, _z_tile, gk_bwd_kernel, gk_fwd_kernel


@triton.jit
def prologue_kernel(x, xc, w_down, low, w_up, b_up, gk, M, D, HK, L, inv_norm, PREC: tl.constexpr,
                    BR: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr, BL: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BR + tl.arange(0, BR)
    mr = rows < M
    ll = tl.arange(0, BL)
    ml = ll < L
    kk = tl.arange(0, BK)
    acc = tl.zeros([BR, BL], dtype=tl.float32)
    for k0 in range(0, D, BK):
        mk = (k0 + kk) < D
        xt = tl.load(x + rows[:, None] * D + (k0 + kk)[None, :], mask=mr[:, None] & mk[None, :], other=0.0)
        xb = xt.to(xc.dtype.element_ty)
        tl.store(xc + rows[:, None] * D + (k0 + kk)[None, :], xb, mask=mr[:, None] & mk[None, :])
        wt = tl.load(w_down + ll[None, :] * D + (k0 + kk)[:, None], mask=ml[None, :] & mk[:, None], other=0.0)
        acc = tl.dot(xb, wt, acc, input_precision=PREC)
    low_t = acc.to(low.dtype.element_ty)
    tl.store(low + rows[:, None] * L + ll[None, :], low_t, mask=mr[:, None] & ml[None, :])
    for c0 in range(0, HK, BN):
        cols = c0 + tl.arange(0, BN)
        mc = cols < HK
        z = _z_tile(low_t, w_up, b_up, cols, ll, mc, HK, L, PREC)
        tl.store(gk + rows[:, None] * HK + cols[None, :], _logsigmoid(z) * inv_norm, mask=mr[:, None] & mc[None, :])


@triton.jit
def _seg_tma(acc, a_desc, KW, w_desc, k_row, m0, n0, BK: tl.constexpr):
    for k0 in range(0, KW, BK):
        acc = tl.dot(a_desc.load([m0, k0]), w_desc.load([k_row + k0, n0]), acc)
    return acc


@triton.jit
def dgrad_tma_kernel(dq, dk, dv, dr, dlow, w, wl, dx, M, D, HK, HV, L,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BL: tl.constexpr, GROUP: tl.constexpr):
    pid_m, pid_n = grouped_tile(M, D, BM, BN, GROUP)
    m0, n0 = pid_m * BM, pid_n * BN
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    acc = _seg_tma(acc, dq, HK, w, 0, m0, n0, BK)
    acc = _seg_tma(acc, dk, HK, w, HK, m0, n0, BK)
    acc = _seg_tma(acc, dv, HV, w, 2 * HK, m0, n0, BK)
    acc = _seg_tma(acc, dr, HV, w, 2 * HK + HV, m0, n0, BK)
    acc = _seg_tma(acc, dlow, L, wl, 2 * HK + 2 * HV, m0, n0, BL)
    dx.store([m0, n0], acc.to(dx.dtype))


def dgrad_tma(grads, w_cat, HK, HV, cfg):
    BM, BN, BK, nw, ns = cfg
    M, L = grads[4].shape
    D = w_cat.shape[1]
    BL = max(16, triton.next_power_of_2(L))
    dx = torch.empty(M, D, device=w_cat.device, dtype=torch.float32)
    descs = [TensorDescriptor.from_tensor(g, [BM, BK]) for g in grads[:4]]
    descs.append(TensorDescriptor.from_tensor(grads[4], [BM, BL]))
    wd = TensorDescriptor.from_tensor(w_cat, [BK, BN])
    wld = TensorDescriptor.from_tensor(w_cat, [BL, BN])
    dxd = TensorDescriptor.from_tensor(dx, [BM, BN])
    grid = (triton.cdiv(M, BM) * triton.cdiv(D, BN),)
    dgrad_tma_kernel[grid](*descs, wd, wld, dxd, M, D, HK, HV, L, BM=BM, BN=BN, BK=BK, BL=BL, GROUP=8,
                           num_warps=nw, num_stages=ns)
    return dx


def main():
    M, D, H, K, L = 32768, 2048, 16, 128, 16
    HK = HV = H * K
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M, D, device="cuda", generator=g)
    w_down = (torch.randn(L, D, device="cuda", generator=g) / D ** 0.5).bfloat16()
    w_up = (torch.randn(HK, L, device="cuda", generator=g) / L ** 0.5).bfloat16()
    b_up = torch.randn(HK, device="cuda", generator=g)
    inv = 1 / 16
    rows = []

    # --- forward prologue: library (cast, mm low, gk_fwd) vs fused kernel
    def lib_fwd():
        xc = x.to(torch.bfloat16)
        low = xc @ w_down.t()
        return xc, low, fused.gk_fwd(low, w_up, b_up, inv)
    xc0, low0, gk0 = lib_fwd()
    rows.append(("fwd prologue: library cast + mm + gk_fwd", do_bench(lib_fwd, warmup=25, rep=100), ""))
    for (BR, BN, nw) in itertools.product((32, 64), (128, 256), (4, 8)):
        gkf = torch.empty(M, HK, device="cuda")
        def f(BR=BR, BN=BN, nw=nw):
            gk_fwd_kernel[(triton.cdiv(M, BR), triton.cdiv(HK, BN))](low0, w_up, b_up, gkf, M, HK, L, inv,
                                                                      PREC="tf32", BR=BR, BN=BN, BL=16, num_warps=nw)
        try:
            f()
            assert torch.equal(gkf, gk0)
            rows.append((f"gk_fwd BR{BR} BN{BN} w{nw}", do_bench(f, warmup=10, rep=50), ""))
        except Exception as e:
            rows.append((f"gk_fwd BR{BR} BN{BN} w{nw}", float("nan"), repr(e)[:80]))
    for (BR, BK, BN, nw, ns) in itertools.product((16, 32, 64), (64,), (128, 256), (4, 8), (2, 3)):
        xc, low, gk = torch.empty(M, D, **bf), torch.empty(M, L, **bf), torch.empty(M, HK, device="cuda")
        def f(BR=BR, BK=BK, BN=BN, nw=nw, ns=ns):
            prologue_kernel[(triton.cdiv(M, BR),)](x, xc, w_down, low, w_up, b_up, gk, M, D, HK, L, inv,
                                                   PREC="tf32", BR=BR, BK=BK, BN=BN, BL=16, num_warps=nw, num_stages=ns)
        try:
            f()
            e_low = ((low.float() - low0.float()).norm() / low0.float().norm()).item()
            e_gk = ((gk - gk0).norm() / gk0.norm()).item()
            assert torch.equal(xc, xc0) and e_low < 1e-2 and e_gk < 1e-2, (e_low, e_gk)
            rows.append((f"prologue BR{BR} BK{BK} BN{BN} w{nw} s{ns}", do_bench(f, warmup=10, rep=50),
                         f"low {e_low:.1e} gk {e_gk:.1e}"))
        except Exception as e:
            rows.append((f"prologue BR{BR} BK{BK} BN{BN} w{nw} s{ns}", float("nan"), repr(e)[:80]))

    # --- gk backward sweep
    dgk = torch.randn(M, HK, device="cuda", generator=g)
    dz0, dlow0, db0 = fused.gk_bwd(low0, w_up, b_up, dgk, inv)
    rows.append(("gk_bwd library", do_bench(lambda: fused.gk_bwd(low0, w_up, b_up, dgk, inv), warmup=10, rep=50), ""))
    for (BR, BN, nw, ns) in itertools.product((16, 32, 64), (64, 128), (4, 8), (1, 3)):
        P = triton.cdiv(M, BR)
        dz, dlow, dbp = torch.empty(M, HK, **bf), torch.empty(M, L, **bf), torch.empty(P, HK, device="cuda")
        def f(BR=BR, BN=BN, nw=nw, ns=ns, P=P, dz=dz, dlow=dlow, dbp=dbp):
            gk_bwd_kernel[(P,)](low0, w_up, b_up, dgk, dz, dlow, dbp, M, HK, L, inv, PREC="tf32", BR=BR, BN=BN,
                                BL=16, num_warps=nw, num_stages=ns)
            return dbp.sum(0)
        try:
            db = f()
            ok = torch.equal(dz, dz0) and ((dlow.float() - dlow0.float()).norm() / dlow0.float().norm()) < 1e-2 \
                and ((db - db0).norm() / db0.norm()) < 1e-4
            assert ok
            rows.append((f"gk_bwd BR{BR} BN{BN} w{nw} s{ns}", do_bench(f, warmup=10, rep=50), ""))
        except Exception as e:
            rows.append((f"gk_bwd BR{BR} BN{BN} w{nw} s{ns}", float("nan"), repr(e)[:80]))

    # --- dgrad: library Triton, cuBLAS cat mm, TMA variants
    grads = [torch.randn(M, HK, generator=g, **bf) for _ in range(4)] + [torch.randn(M, L, generator=g, **bf)]
    w_cat = (torch.randn(4 * HK + L, D, device="cuda", generator=g) / D ** 0.5).bfloat16()
    ref = fused.triton_dgrad(grads, w_cat, HK, HV, torch.float32)
    rows.append(("dgrad library (Triton pointers)", do_bench(lambda: fused.triton_dgrad(grads, w_cat, HK, HV,
                                                                                      torch.float32)), ""))
    cat = torch.cat(grads, 1)
    rows.append(("dgrad cuBLAS mm of cat, fp32 out (cat excluded)",
                 do_bench(lambda: torch.mm(cat, w_cat, out_dtype=torch.float32)), ""))
    for cfg in ((128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4),
                (128, 256, 64, 8, 4), (256, 128, 64, 8, 4), (128, 256, 128, 8, 2), (64, 256, 64, 4, 4)):
        try:
            dx = dgrad_tma(grads, w_cat, HK, HV, cfg)
            err = ((dx - ref).norm() / ref.norm()).item()
            assert err < 1e-4, err
            rows.append((f"dgrad TMA {cfg}", do_bench(lambda cfg=cfg: dgrad_tma(grads, w_cat, HK, HV, cfg)),
                         f"err {err:.1e}"))
        except Exception as e:
            rows.append((f"dgrad TMA {cfg}", float("nan"), repr(e)[:120]))

    print("| variant | ms | note |\n|---|---|---|")
    for name, ms, note in rows:
        print(f"| {name} | {ms:.4f} | {note} |")


if __name__ == "__main__":
    main()
