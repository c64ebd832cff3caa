"""Sweep the new gk backward kernel's launch at the seed shape, check each against the default's results, then
run bench_proj --side in with the fastest."""
import itertools
import os
import sys

sys.path.insert(0, os.getcwd())
import torch
from triton.testing import do_bench

from ops.proj_in import fused
from scripts import bench_proj

M, HK, L = 32768, 2048, 16
g = torch.Generator(device="cuda").manual_seed(0)
low = torch.randn(M, L, device="cuda", generator=g).bfloat16()
w_up = (torch.randn(HK, L, device="cuda", generator=g) / 4).bfloat16()
b = torch.randn(HK, device="cuda", generator=g)
dgk = torch.randn(M, HK, device="cuda", generator=g)
ref = fused.gk_bwd(low, w_up, b, dgk, 1 / 16, torch.float32)
rows = []
for BR, BN, nw, ns, P in itertools.product((32, 64), (64, 128), (4, 8), (2, 3), (264, 528, 1056)):
    fused.GK_BWD = dict(BR=BR, BN=BN, num_warps=nw, num_stages=ns)
    fused.GK_BWD_PROGRAMS = P
    f = lambda: fused.gk_bwd(low, w_up, b, dgk, 1 / 16, torch.float32)   # noqa: E731
    try:
        out = f()
        errs = [((a.float() - r.float()).norm() / r.float().norm()).item() for a, r in zip(out, ref)]
        assert max(errs) < 1e-2, errs
        rows.append((do_bench(f, warmup=10, rep=50), BR, BN, nw, ns, P))
    except Exception as e:
        print("fail", BR, BN, nw, ns, P, repr(e)[:100])
rows.sort()
print("| ms | BR | BN | warps | stages | programs |\n|---|---|---|---|---|---|")
for r in rows[:12]:
    print("| %.4f | %d | %d | %d | %d | %d |" % r)
ms, BR, BN, nw, ns, P = rows[0]
fused.GK_BWD = dict(BR=BR, BN=BN, num_warps=nw, num_stages=ns)
fused.GK_BWD_PROGRAMS = P
bench_proj.main(["--out", sys.argv[1], "--side", "in"])
