import itertools, os, sys
sys.path.insert(0, os.getcwd())
import torch
from triton.testing import do_bench
from ops.proj_in import fused

M, d, n = 32768, 2048, 2048
g = torch.Generator(device="cuda").manual_seed(0)
bf = dict(device="cuda", dtype=torch.bfloat16)
x = torch.randn(M, d, generator=g, **bf)
ws = [torch.randn(n, d, generator=g, **bf) / 45 for _ in range(4)]
out = torch.empty(4, M, n, **bf)
def fwd():
    for i, w in enumerate(ws):
        torch.mm(x, w.t(), out=out[i])
rows = []
for lib in ("cublas", "cublaslt"):
    torch.backends.cuda.preferred_blas_library(lib)
    fwd(); torch.cuda.synchronize()
    rows.append((f"fwd 4 mm {lib}", do_bench(fwd, warmup=25, rep=100)))
torch.backends.cuda.preferred_blas_library("cublas")
wt = [w.t().contiguous() for w in ws]          # W stored [d, n]: the NN layout
def fwd_nn():
    for i, w in enumerate(wt):
        torch.mm(x, w, out=out[i])
rows.append(("fwd 4 mm, W stored transposed", do_bench(fwd_nn, warmup=25, rep=100)))

HK, L = 2048, 16
low = torch.randn(M, L, generator=g, **bf)
w_up = (torch.randn(HK, L, generator=g, **bf) / 4)
b = torch.randn(HK, device="cuda", generator=g)
dgk = torch.randn(M, HK, device="cuda", generator=g)
ref = fused.gk_bwd(low, w_up, b, dgk, 1 / 16, torch.float32)
rows.append(("gk_bwd default", do_bench(lambda: fused.gk_bwd(low, w_up, b, dgk, 1 / 16, torch.float32))))
for BR, BN, nw, ns, P in itertools.product((32, 64), (128, 256), (4, 8), (3, 4), (264,)):
    fused.GK_BWD = dict(BR=BR, BN=BN, num_warps=nw, num_stages=ns)
    fused.GK_BWD_PROGRAMS = P
    f = lambda: fused.gk_bwd(low, w_up, b, dgk, 1 / 16, torch.float32)   # noqa: E731
    try:
        o = f()
        assert max(((a.float() - r.float()).norm() / r.float().norm()).item() for a, r in zip(o, ref)) < 1e-2
        rows.append((f"gk_bwd BR{BR} BN{BN} w{nw} s{ns} P{P}", do_bench(f, warmup=10, rep=50)))
    except Exception as e:
        rows.append((f"gk_bwd BR{BR} BN{BN} w{nw} s{ns} P{P} {repr(e)[:60]}", float("nan")))
for name, ms in rows:
    print(f"| {name} | {ms:.4f} |")
