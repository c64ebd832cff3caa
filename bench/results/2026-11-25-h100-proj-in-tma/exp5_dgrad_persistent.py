"""dgrad TMA variants at the seed shape: grouping, persistent loop."""
import os, sys
sys.path.insert(0, os.getcwd())
import torch, triton, triton.language as tl
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor
from ops.common.gemm import dot_desc
from ops.proj_in import fused
from ops.proj_in.kernels import dgrad_tma_kernel


@triton.jit
def dgrad_tma_persistent(dq, dk, dv, dr, dlow, w, w_low, dx, M, D, HK, HV, L, PREC: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BL: tl.constexpr, GROUP: tl.constexpr,
                         NPROG: tl.constexpr, SUB: tl.constexpr):
    tiles = tl.cdiv(M, BM) * tl.cdiv(D, BN)
    for t in tl.range(tl.program_id(0), tiles, NPROG):
        num_m, num_n = tl.cdiv(M, BM), tl.cdiv(D, BN)
        per_group = GROUP * num_n
        first_m = (t // per_group) * GROUP
        size_m = tl.minimum(num_m - first_m, GROUP)
        pid_m = first_m + (t % per_group) % size_m
        pid_n = (t % per_group) // size_m
        m0, n0 = pid_m * BM, pid_n * BN
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        acc = dot_desc(acc, dq, w, HK, 0, m0, n0, PREC, BK)
        acc = dot_desc(acc, dk, w, HK, HK, m0, n0, PREC, BK)
        acc = dot_desc(acc, dv, w, HV, 2 * HK, m0, n0, PREC, BK)
        acc = dot_desc(acc, dr, w, HV, 2 * HK + HV, m0, n0, PREC, BK)
        acc = dot_desc(acc, dlow, w_low, L, 2 * HK + 2 * HV, m0, n0, PREC, BL)
        if SUB:
            a0, a1 = acc.reshape(BM, 2, BN // 2).permute(0, 2, 1).split()
            dx.store([m0, n0], a0)
            dx.store([m0, n0 + BN // 2], a1)
        else:
            dx.store([m0, n0], acc.to(dx.dtype))


def run(kernel, grads, w_cat, HK, HV, BM, BN, BK, nw, ns, group, nprog=None, sub=False):
    M, L = grads[4].shape
    D = w_cat.shape[1]
    BL = 16
    dx = torch.empty(M, D, device="cuda")
    descs = [TensorDescriptor.from_tensor(g, [BM, BK]) for g in grads[:4]] + [TensorDescriptor.from_tensor(grads[4], [BM, BL])]
    descs += [TensorDescriptor.from_tensor(w_cat, [BK, BN]), TensorDescriptor.from_tensor(w_cat, [BL, BN]),
              TensorDescriptor.from_tensor(dx, [BM, BN // 2 if sub else BN])]
    tiles = triton.cdiv(M, BM) * triton.cdiv(D, BN)
    kw = dict(PREC="tf32", BM=BM, BN=BN, BK=BK, BL=BL, GROUP=group, num_warps=nw, num_stages=ns)
    if nprog:
        kernel[(nprog,)](*descs, M, D, HK, HV, L, NPROG=nprog, SUB=sub, **kw)
    else:
        kernel[(tiles,)](*descs, M, D, HK, HV, L, **kw)
    return dx


M, D, HK, L = 32768, 2048, 2048, 16
g = torch.Generator(device="cuda").manual_seed(0)
bf = dict(device="cuda", dtype=torch.bfloat16)
grads = [torch.randn(M, HK, generator=g, **bf) for _ in range(4)] + [torch.randn(M, L, generator=g, **bf)]
w_cat = (torch.randn(4 * HK + L, D, device="cuda", generator=g) / D ** 0.5).bfloat16()
ref = fused.triton_dgrad(grads, w_cat, HK, HK, torch.float32)
rows = [("library (autotuned TMA)", do_bench(lambda: fused.triton_dgrad(grads, w_cat, HK, HK, torch.float32)))]
cat = torch.cat(grads, 1)
rows.append(("cuBLAS mm of cat fp32 out", do_bench(lambda: torch.mm(cat, w_cat, out_dtype=torch.float32))))
sms = torch.cuda.get_device_properties(0).multi_processor_count
variants = [(dgrad_tma_kernel, 128, 256, 64, 8, 3, 8, None, False), (dgrad_tma_kernel, 128, 256, 64, 8, 4, 8, None, False)]
variants += [(dgrad_tma_persistent, 128, 256, 64, 8, ns, 8, n, True) for ns in (3, 2) for n in (sms, 2 * sms)]
variants += [(dgrad_tma_persistent, 256, 128, 64, 8, 3, 8, sms, True), (dgrad_tma_persistent, 128, 128, 64, 8, 4, 8, sms, False),
             (dgrad_tma_persistent, 128, 128, 64, 4, 4, 8, sms, False), (dgrad_tma_persistent, 128, 128, 64, 8, 4, 8, 2 * sms, False)]
for kern, BM, BN, BK, nw, ns, grp, npg, sub in variants:
    name = f"{kern.fn.__name__ if hasattr(kern, 'fn') else kern.__name__} {BM}x{BN}x{BK} w{nw} s{ns} G{grp} P{npg} sub{sub}"
    try:
        f = lambda: run(kern, grads, w_cat, HK, HK, BM, BN, BK, nw, ns, grp, npg, sub)   # noqa: E731
        err = ((f() - ref).norm() / ref.norm()).item()
        assert err < 1e-4, err
        rows.append((name, do_bench(f)))
    except Exception as e:
        rows.append((name + " " + repr(e)[:80], float("nan")))
for n, ms in rows:
    print(f"| {n} | {ms:.4f} | {2 * M * D * (4 * HK + L) / ms / 1e9:.0f} TFLOP/s |")
