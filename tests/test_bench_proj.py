"""scripts/bench_proj.py's input-side protocol: x reaches the unfused chain as the model hands it over.

The chain's five F.linear each cast fp32 x to bf16 under autocast, unless x is an fp32 leaf that requires grad:
autocast then caches the cast (its heuristic for weights) and the chain casts x once. The model's x is the
block's RMSNorm output, never a leaf, so normed_input hands the benchmark's leaf x over as a view. Counted here
on the CPU's autocast, which caches by the same rule.
"""
import torch
from torch.profiler import ProfilerActivity, profile

from ops.proj_in import naive
from scripts.bench_proj import normed_input


def _casts_of_x(fn, x, ws) -> int:
    """How many [M, d]-sized fp32 → bf16 copies one autocast forward makes (the weights' casts are smaller)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, \
            torch.autocast("cpu", dtype=torch.bfloat16):
        fn(x, *ws)
    return sum(1 for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes
               and list(e.input_shapes[0]) == list(x.shape))


def test_normed_input_makes_the_unfused_chain_cast_x_at_each_linear():
    B, T, d, H, K, L = 1, 8, 32, 2, 8, 4
    x = torch.randn(B, T, d, requires_grad=True)
    ws = [torch.randn(n, d, requires_grad=True) for n in (H * K,) * 4 + (L,)]
    ws += [torch.randn(H * K, L, requires_grad=True), torch.randn(H * K, requires_grad=True)]
    chain = lambda *a: naive.proj_in(*a, H, 16.0)                                          # noqa: E731
    assert _casts_of_x(chain, x, ws) == 1                      # a leaf: autocast's cache, once for all five
    assert _casts_of_x(normed_input(chain), x, ws) == 5        # as in the model: one cast per F.linear
    y = normed_input(chain)(x, *ws)[0].sum()
    y.backward()
    assert x.grad is not None and x.grad.shape == x.shape      # the view passes x's gradient through
