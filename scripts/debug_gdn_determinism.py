"""train.py with every `gated_delta` chunk call fingerprinted bitwise: where two identical runs first part.

    TRACE_LOG=run1.txt python scripts/debug_gdn_determinism.py --config configs/gdn_125m.yaml --backend chunk ...

One line per call: F<n> (forward: q, k, v, g, beta, then o) and B<n> (backward: do, the saved tensors, then
dq, dk, dv, dg, dbeta, then each backward stage's outputs). Run it two or three times side by side and diff the
files: a B line whose inputs and saved tensors agree but whose outputs differ is nondeterminism inside the
backward, and its stage fields say which kernel. Each fingerprint is an index-weighted sum of the raw bits.
"""
from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ops.gated_delta import chunk as gdc  # noqa: E402

BACKWARD_STAGES = ["chunk_bwd_dA", "chunk_intra_bwd", "delta_h_bwd", "chunk_bwd_dqkb", "wy_bwd"]


def trace_stages(names: list[str], record: Callable[[str, tuple], None]) -> None:
    """Wrap each named stage function of ops.gated_delta.chunk so that record(name, outputs) sees every call's
    outputs (a tuple). ChunkGatedDelta looks its stages up in the module at call time, so this reaches them."""
    def wrap(name: str) -> None:
        f = getattr(gdc, name)

        def traced(*a, **k):
            out = f(*a, **k)
            record(name, out if isinstance(out, tuple) else (out,))
            return out
        setattr(gdc, name, traced)
    for name in names:
        wrap(name)


def fp(x: torch.Tensor | None) -> str:
    """An index-weighted sum of x's raw bits: equal for bit-identical tensors, different otherwise (almost surely)."""
    if x is None:
        return "-"
    i = x.contiguous().view(-1).view(torch.int16 if x.element_size() == 2 else torch.int32).to(torch.int64)
    w = torch.arange(i.numel(), device=i.device, dtype=torch.int64) % 1000003 + 1
    return str(int((i * w).sum().item()))


def main() -> None:
    log, stages, n = open(os.environ["TRACE_LOG"], "w"), [], {"f": 0, "b": 0}
    trace_stages(BACKWARD_STAGES, lambda name, outs: stages.append(name + ":" + ",".join(fp(x) for x in outs)))
    cls = gdc.ChunkGatedDelta
    fwd, bwd = cls.forward, cls.backward

    def forward(ctx, q, k, v, g, beta, *rest):
        o, ht = fwd(ctx, q, k, v, g, beta, *rest)
        log.write(f"F{n['f']} in {' '.join(fp(x) for x in (q, k, v, g, beta))} out {fp(o)}\n")
        n["f"] += 1
        return o, ht

    def backward(ctx, do, dht):
        grads = bwd(ctx, do, dht)
        saved = " ".join(fp(x) for x in ctx.saved_tensors)
        log.write(f"B{n['b']} in {fp(do)} saved {saved} out {' '.join(fp(x) for x in grads[:5])} {' '.join(stages)}\n")
        log.flush()
        stages.clear()
        n["b"] += 1
        return grads
    cls.forward, cls.backward = staticmethod(forward), staticmethod(backward)
    sys.argv = ["train.py"] + sys.argv[1:]
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "train.py"), run_name="__main__")


if __name__ == "__main__":
    main()
