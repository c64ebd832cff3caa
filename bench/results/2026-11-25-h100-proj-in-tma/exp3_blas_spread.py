import os, sys
sys.path.insert(0, os.getcwd())
import torch
from triton.testing import do_bench

M, d, n = 32768, 2048, 2048
g = torch.Generator(device="cuda").manual_seed(0)
bf = dict(device="cuda", dtype=torch.bfloat16)
x = torch.randn(M, d, generator=g, **bf)
ws = [torch.randn(n, d, generator=g, **bf) / 45 for _ in range(4)]
das = [torch.randn(M, n, generator=g, **bf) for _ in range(4)]
out = torch.empty(4, M, n, **bf)
def fwd():
    for i, w in enumerate(ws):
        torch.mm(x, w.t(), out=out[i])
def wg():
    return [torch.mm(a.t(), x, out_dtype=torch.float32) for a in das]
def wg16():
    return [a.t() @ x for a in das]
print("default lib:", torch.backends.cuda.preferred_blas_library())
for lib in (None, "cublas", "cublaslt", "cublas"):
    if lib:
        torch.backends.cuda.preferred_blas_library(lib)
    fwd(); wg(); torch.cuda.synchronize()
    print(f"| {lib or 'default'} | fwd {do_bench(fwd, warmup=25, rep=100):.4f} | wgrad fp32 {do_bench(wg, warmup=25, rep=100):.4f} | wgrad bf16 {do_bench(wg16, warmup=25, rep=100):.4f} |")
a8 = torch.randn(8192, 8192, **bf)
print("8192^3", 2 * 8192 ** 3 / do_bench(lambda: a8 @ a8) / 1e9)
