"""Repeat one gated-delta `chunk` backward on fixed inputs and count, per backward stage, the repeats whose
output bits differ from the first: the op-level probe for the nondeterminism that
scripts/debug_gdn_determinism.py found inside this backward during training.

    python scripts/repeat_gdn_backward.py --shape 4 2048 6 128 128 --seeds 8 --repeats 200
    python scripts/repeat_gdn_backward.py ... --delta-h-stages 1          # a candidate fix, same inputs
    python scripts/repeat_gdn_backward.py ... --forward                   # the forward's stages repeated too

The default shape is gdn_125m's layer at the parity runs' micro-batch (B4 T2048 H6 K=V=128, bf16). Between
repeats a GEMM of a random size runs, so each backward starts from a different cache and clock state, as in
training. Prints one JSON line: per stage and output, how many repeats differed from the seed's first.
"""
from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ops.chunkwise.output import chunk_bwd_dqkb  # noqa: E402
from ops.gated_delta.delta_state import delta_h_bwd  # noqa: E402
from ops.gated_delta import chunk as gdc  # noqa: E402
from scripts.debug_gdn_determinism import BACKWARD_STAGES, trace_stages  # noqa: E402
from scripts.stress_dqkb import noise_gemm, same_bits  # noqa: E402

FORWARD_STAGES = ["wy_fwd", "delta_h_fwd", "chunk_fwd_o_scalar"]


def inputs(shape: tuple[int, ...], seed: int, device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """q, k [B, T, H, K] (L2-normalised), v [B, T, H, V] in dtype; g (log-decay) [B, T, H] and beta [B, T, H] in
    fp32 and dtype. All require grad."""
    B, T, H, K, V = shape
    g = torch.Generator(device=device).manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, device=device)
    return [F.normalize(r(B, T, H, K), dim=-1).to(dtype).requires_grad_(),
            F.normalize(r(B, T, H, K), dim=-1).to(dtype).requires_grad_(),
            r(B, T, H, V).to(dtype).requires_grad_(),
            (F.logsigmoid(r(B, T, H)) / 4).requires_grad_(),
            torch.sigmoid(r(B, T, H)).to(dtype).requires_grad_()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=int, nargs=5, default=[4, 2048, 6, 128, 128], metavar=("B", "T", "H", "K", "V"))
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--delta-h-stages", type=int, default=None, help="num_stages of delta_h_bwd (default: its own)")
    ap.add_argument("--dqkb-stages", type=int, default=None, help="num_stages of chunk_bwd_dqkb (default: its own)")
    ap.add_argument("--forward", action="store_true", help="run the forward again in every repeat and compare its "
                    "stages and output too (as training does)")
    ap.add_argument("--no-noise", action="store_true", help="no GEMM between repeats")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gdc.delta_h_bwd = partial(delta_h_bwd, num_stages=a.delta_h_stages)
    if a.dqkb_stages is not None:
        gdc.chunk_bwd_dqkb = partial(chunk_bwd_dqkb, num_stages=a.dqkb_stages)
    record: dict[str, tuple] = {}
    stages = BACKWARD_STAGES + (FORWARD_STAGES if a.forward else [])
    trace_stages(stages, lambda name, outs: record.__setitem__(
        name, tuple(x.detach().clone() if x is not None else None for x in outs)))
    differ: dict[str, int] = {}
    gen = torch.Generator().manual_seed(0)
    for seed in range(a.seeds):
        xs = inputs(tuple(a.shape), seed, device, dtype)
        o, _ = gdc.gated_delta(*xs)
        do = torch.randn(o.shape, generator=torch.Generator(device=device).manual_seed(10_000 + seed),
                         device=device).to(dtype)
        first = None
        for rep in range(a.repeats):
            if not a.no_noise and device == "cuda":
                noise_gemm(gen, device, dtype)
            if a.forward:
                o, _ = gdc.gated_delta(*xs)
            grads = torch.autograd.grad(o, xs, do, retain_graph=True)
            now = {**{s: record[s] for s in stages}, "grads": grads}
            if a.forward:
                now["o"] = (o.detach().clone(),)
            if first is None:
                first = now
                continue
            for s, outs in now.items():
                for i, (x, y) in enumerate(zip(first[s], outs)):
                    if x is not None and not same_bits(x, y):
                        differ[f"{s}[{i}]"] = differ.get(f"{s}[{i}]", 0) + 1
    print(json.dumps({"shape": a.shape, "seeds": a.seeds, "repeats": a.repeats, "delta_h_stages": a.delta_h_stages,
                      "dqkb_stages": a.dqkb_stages, "forward": a.forward, "noise": not a.no_noise,
                      "compared": a.seeds * (a.repeats - 1),
                      "differing": differ}))


if __name__ == "__main__":
    main()
