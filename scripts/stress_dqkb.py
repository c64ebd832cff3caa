"""Run `chunk_bwd_dqkb` (ops/common/chunk_o.py) many times on fixed inputs and count the runs whose outputs
differ in any bit from the first: the kernel-level probe for the race that scripts/repeat_gdn_backward.py
placed in it (dk and db differ on identical inputs, dq never).

    python scripts/stress_dqkb.py --repeats 2000 --num-stages 0 1 2 3

Shapes are the layers of gdn_125m, gdn_340m, gla_340m, mamba2_130m and gla_125m at micro-batch 4 (bf16). Between runs
a GEMM of random size runs unless --no-noise. num_stages 0 means the launcher's own choice. Prints a table
(shape, num_stages, runs that differed per output, µs per call by triton's do_bench, run
alone) and writes it as JSON with --out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ops.chunkwise.output import chunk_bwd_dqkb  # noqa: E402
from ops.chunkwise.cumsum import chunk_cumsum  # noqa: E402

# name: B, T, H, K, V, scalar decay
SHAPES = {"gdn_125m": (4, 2048, 6, 128, 128, True), "gdn_340m": (4, 2048, 8, 128, 128, True),
          "gla_340m": (4, 2048, 4, 128, 256, False), "mamba2_130m": (4, 2048, 24, 128, 64, True),
          "gla_125m": (4, 2048, 12, 64, 64, False)}


def dqkb_inputs(B: int, T: int, H: int, K: int, V: int, scalar: bool, C: int = 64, seed: int = 0,
                device: str = "cuda", dtype: torch.dtype = torch.bfloat16) -> tuple:
    """chunk_bwd_dqkb's arguments: random q, k, v, do, states h, dh [B, NT, H, K, V], fp32 intra parts and a
    chunk-local cumulative log-decay b ([B, T, H, 1] when scalar, else [B, T, H, K])."""
    g = torch.Generator(device=device).manual_seed(seed)
    NT = -(-T // C)

    def r(*s, dt=dtype):
        return torch.randn(*s, generator=g, device=device).to(dt)
    b = chunk_cumsum(F.logsigmoid(r(B, T, H, 1 if scalar else K, dt=torch.float32)) / 8, C)
    return (r(B, T, H, K), F.normalize(r(B, T, H, K, dt=torch.float32), dim=-1).to(dtype), r(B, T, H, V), b,
            r(B, NT, H, K, V), r(B, NT, H, K, V), r(B, T, H, V), r(B, T, H, K, dt=torch.float32),
            r(B, T, H, K, dt=torch.float32), K ** -0.5, C)


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit-for-bit equality (torch.equal takes −0.0 for +0.0 and NaN for unequal to itself)."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    return torch.equal(x.contiguous().view(as_int), y.contiguous().view(as_int))


def noise_gemm(gen: torch.Generator, device: torch.device | str, dtype: torch.dtype) -> None:
    """A square GEMM of random size (256–4095), so the next call starts from another cache and clock state."""
    n = int(torch.randint(256, 4096, (1,), generator=gen))
    torch.randn(n, n, device=device, dtype=dtype) @ torch.randn(n, n, device=device, dtype=dtype)


def count_differing(args: tuple, repeats: int, num_stages: int | None, noise: bool = True, seed: int = 0) -> list[int]:
    """Runs chunk_bwd_dqkb(*args) `repeats` times; returns per output (dq, dk, db) how many runs differed
    from the first. In the H100 runs dk and db always differed together."""
    first = chunk_bwd_dqkb(*args, num_stages=num_stages)
    differ, gen = [0, 0, 0], torch.Generator().manual_seed(seed)
    for _ in range(repeats):
        if noise:
            noise_gemm(gen, args[0].device, args[0].dtype)
        for i, (x, y) in enumerate(zip(first, chunk_bwd_dqkb(*args, num_stages=num_stages))):
            differ[i] += not same_bits(x, y)
    return differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--num-stages", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--repeats", type=int, default=1000)
    ap.add_argument("--no-noise", action="store_true")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args()
    rows = []
    print(f"{'shape':<12} {'stages':>6} {'runs':>6} {'dq':>4} {'dk':>4} {'db':>4} {'µs/call':>8}")
    for name in a.shapes:
        args = dqkb_inputs(*SHAPES[name])
        for ns in a.num_stages:
            differ = count_differing(args, a.repeats, ns or None, noise=not a.no_noise)
            us = triton.testing.do_bench(lambda: chunk_bwd_dqkb(*args, num_stages=ns or None)) * 1e3
            rows.append(dict(shape=name, num_stages=ns or "default", runs=a.repeats, differing=differ, us=round(us, 1)))
            print(f"{name:<12} {ns or 'def':>6} {a.repeats:>6} {differ[0]:>4} {differ[1]:>4} {differ[2]:>4} {us:>8.1f}",
                  flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                                               noise=not a.no_noise, rows=rows), indent=1))


if __name__ == "__main__":
    main()
