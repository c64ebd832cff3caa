"""An analytical data-movement model for the chunkwise forward (issue [F]): HBM bytes, FLOPs and a
time floor per kernel plan, under a device's shared-memory and register budgets, and the tile choice
that minimises the floor. Chimera-style: count what each loop order must move, reject what does not
fit on chip, take the cheapest. No measurement enters it; bench/results compares it with them.

Plans for one layer's forward (q, k [B, T, H, K], v, o [B, T, H, V], chunk C, NT = ⌈T/C⌉ chunks):
- `chunk` (today's backend, four launches): cumsum g → b; states h (reads k, v, b; writes h per
  chunk); intra (reads q, k, b; writes A [B, T, H, C]); output (reads q, b, h, A, v; writes o).
- `fused`: states as above, then one kernel per (V tile, chunk) that forms S̃ = (Q Kᵀ) ⊙ M in
  registers and writes o = S̃ V + (Q ⊙ Γ) h: A never reaches HBM. Every V tile re-reads its chunk's
  q, k and b, unless `v_inner`: one program per chunk loops over the V tiles and keeps S̃ live.
Tiles: BK | K and BV | V, multiples of 16 (tensor-core fragments), at most 128.
The backward (per-key decay) is counted for both plans too (chunk_bwd_plan, fused_bwd_plan), at
the tiles its kernels launch with; the model does not choose those yet.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Device:
    name: str
    hbm_bytes_per_s: float        # achievable: measured device-to-device copy (read + write)
    flops: float                  # achievable bf16 tensor-core rate: measured 8192³ matmul
    n_sm: int
    smem_per_block: int           # bytes a block may opt into
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255


# ../shared/GPU.md: 3.0 TB/s copy, 786 TFLOP/s bf16, 132 SMs, 227 KB shared memory per block.
H100 = Device("H100 80GB HBM3", 3.0e12, 786e12, 132, 227 * 1024)
# Datasheet numbers (not measured here): 1.94 TB/s less the ~10% a copy loses, 312 TFLOP/s, 164 KB.
A100 = Device("A100 80GB (datasheet)", 1.75e12, 312e12, 108, 163 * 1024)


@dataclass(frozen=True)
class Shape:
    B: int
    T: int
    H: int
    K: int
    V: int
    C: int = 64
    scalar_decay: bool = False    # SSD / gated delta: b is [B, T, H]; GLA: [B, T, H, K]
    elem: int = 2                 # bytes per element of q, k, v, o, h (bf16)

    @property
    def NT(self) -> int:
        return math.ceil(self.T / self.C)


@dataclass(frozen=True)
class Tiles:
    BK: int
    BV: int
    v_inner: bool = False
    num_warps: int = 4
    num_stages: int = 2


@dataclass
class Kernel:
    name: str
    bytes: int
    flops: float
    programs: int

    def floor_s(self, dev: Device) -> float:
        """max(bytes / bandwidth, FLOPs / peak), stretched when the grid leaves SMs idle."""
        busy = min(1.0, self.programs / dev.n_sm)
        return max(self.bytes / dev.hbm_bytes_per_s, self.flops / dev.flops) / busy


@dataclass
class Prediction:
    plan: str
    tiles: Tiles | None
    kernels: list[Kernel] = field(default_factory=list)
    feasible: bool = True
    why: str = ""

    @property
    def total_bytes(self) -> int:
        return sum(k.bytes for k in self.kernels)

    @property
    def programs(self) -> int:
        return self.kernels[-1].programs

    def floor_s(self, dev: Device) -> float:
        return sum(k.floor_s(dev) for k in self.kernels)


def _sizes(s: Shape) -> dict:
    tok = s.B * s.T * s.H
    return {"qk": tok * s.K * s.elem, "v": tok * s.V * s.elem, "b": tok * (1 if s.scalar_decay else s.K) * 4,
            "h": s.B * s.NT * s.H * s.K * s.V * s.elem, "A": tok * s.C * s.elem}


def _shared(s: Shape) -> list[Kernel]:
    """cumsum and the state pass, common to both plans: the states run one program per (batch, head,
    64 × 64 state tile), sequential over chunks (chunk_h.py), so a short grid leaves SMs idle."""
    z = _sizes(s)
    tiles = s.B * s.H * math.ceil(s.K / 64) * math.ceil(s.V / 64)
    return [Kernel("cumsum", 2 * z["b"], 0.0, s.B * s.H * s.NT),
            Kernel("states", z["qk"] + z["v"] + z["b"] + z["h"], 2.0 * s.B * s.H * s.NT * s.C * s.K * s.V, tiles)]


def _out_flops(s: Shape) -> float:
    return 2.0 * s.B * s.H * s.NT * (s.C * s.C * s.K + s.C * s.C * s.V + s.C * s.K * s.V)


def chunk_plan(s: Shape) -> Prediction:
    """Today's `chunk` forward: intra writes A, output reads it back; for a scalar decay the output
    kernel forms A itself (and stores it for the backward)."""
    z = _sizes(s)
    grid = s.B * s.H * s.NT
    if s.scalar_decay:
        out = [Kernel("output + A", 2 * z["qk"] + z["b"] + z["h"] + 2 * z["v"] + z["A"], _out_flops(s), grid)]
    else:
        out = [Kernel("intra A", 2 * z["qk"] + z["b"] + z["A"], 2.0 * grid * s.C * s.C * s.K, grid * (s.C // 16) ** 2),
               Kernel("output", z["qk"] + z["b"] + z["h"] + z["A"] + 2 * z["v"], _out_flops(s) - 2.0 * grid * s.C * s.C * s.K,
                      grid * math.ceil(s.V / 64))]
    return Prediction("chunk", None, _shared(s) + out)


def fused_plan(s: Shape, t: Tiles, dev: Device) -> Prediction:
    """The state pass, then the fused output kernel with tiles t; infeasible if it does not fit on chip."""
    z = _sizes(s)
    NV = math.ceil(s.V / t.BV)
    reread = 1 if t.v_inner else NV
    fused = Kernel("fused output", reread * (2 * z["qk"] + z["b"]) + z["h"] + 2 * z["v"], _out_flops(s),
                   s.B * s.H * s.NT * (1 if t.v_inner else NV))
    p = Prediction("fused", t, _shared(s) + [fused])
    threads = 32 * t.num_warps
    # fp32 accumulators live in registers: the O tile [C, BV] and S̃, one 16-column key block at a
    # time (fused_chunk.py), or all of S̃ [C, C] when it must stay live across the V loop (v_inner);
    # operand tiles are staged through shared memory per pipeline stage: q, k [C, BK], b [C, BK]
    # fp32, v [C, BV], h [BK, BV].
    # Per-key decay: the decayed operand q ⊙ exp(b_i − b_ℓ) and its exponent are formed in registers,
    # fp32 [C, BK] each, not staged through shared memory.
    decayed = 0 if s.scalar_decay else 2 * s.C * t.BK
    acc_regs = (s.C * (s.C if t.v_inner else 16) + s.C * t.BV + decayed) / threads
    b_cols = 1 if s.scalar_decay else t.BK
    smem = t.num_stages * (2 * s.C * t.BK * s.elem + s.C * b_cols * 4 + s.C * t.BV * s.elem + t.BK * t.BV * s.elem)
    if acc_regs + 32 > dev.max_regs_per_thread:   # 32: addresses, indices, the decay row
        p.feasible, p.why = False, f"{acc_regs:.0f} fp32 registers per thread for accumulators and decayed operands"
    elif smem > dev.smem_per_block:
        p.feasible, p.why = False, f"{smem / 1024:.0f} KB shared memory"
    return p


def chunk_bwd_plan(s: Shape) -> Prediction:
    """`chunk`'s backward, per-key decay (ops/common/chunk.py): dh pass, dA = do vᵀ written in fp32,
    dv reading A, the intra-chunk gradients reading dA and writing fp32 partials, and the kernel
    that adds the state terms and forms db; then db's reverse cumsum."""
    z, tok, grid = _sizes(s), s.B * s.T * s.H, s.B * s.H * s.NT
    A32, qk32, b32 = tok * s.C * 4, tok * s.K * 4, tok * s.K * 4
    C, K, V = s.C, s.K, s.V
    return Prediction("chunk bwd", None, [
        Kernel("dh", z["qk"] + z["v"] + z["b"] + z["h"], 2.0 * grid * C * K * V, s.B * s.H * math.ceil(K / 64) * math.ceil(V / 64)),
        Kernel("dA", 2 * z["v"] + A32, 2.0 * grid * C * C * V, grid),
        Kernel("dv", z["qk"] + z["b"] + z["A"] + 2 * z["v"] + z["h"], 2.0 * grid * (C * C * V + C * K * V), grid * math.ceil(V / 64)),
        Kernel("intra dq, dk", 2 * z["qk"] + z["b"] + A32 + 2 * qk32, 4.0 * grid * C * C * K, grid * math.ceil(K / 64) * (C // 16)),
        Kernel("dq, dk, db", 4 * z["qk"] + 2 * z["v"] + z["b"] + 2 * z["h"] + 2 * qk32 + b32, 4.0 * grid * C * K * V,
               grid * math.ceil(K / 64)),
        Kernel("cumsum", 2 * b32, 0.0, grid)])


def fused_bwd_plan(s: Shape, BK: int = 64, BV: int = 64) -> Prediction:
    """The fused backward (ops/common/fused_chunk.py): the same dh pass, then dv recomputing the scores
    per V tile (q, k, b re-read per V tile) and dq, dk, db recomputing dA = do vᵀ per K tile (v, do
    re-read per K tile); neither A nor dA nor an fp32 partial reaches HBM."""
    z, grid = _sizes(s), s.B * s.H * s.NT
    NK, NV = math.ceil(s.K / BK), math.ceil(s.V / BV)
    C, K, V = s.C, s.K, s.V
    b32 = s.B * s.T * s.H * s.K * 4
    return Prediction("fused bwd", Tiles(BK, BV), [
        Kernel("dh", z["qk"] + z["v"] + z["b"] + z["h"], 2.0 * grid * C * K * V, s.B * s.H * math.ceil(K / 64) * math.ceil(V / 64)),
        Kernel("dv", NV * (2 * z["qk"] + z["b"]) + 2 * z["v"] + z["h"], 2.0 * grid * (NV * C * C * K + C * C * V + C * K * V),
               grid * NV),
        Kernel("dq, dk, db", 4 * z["qk"] + z["b"] + NK * 2 * z["v"] + 2 * z["h"] + b32,
               2.0 * grid * (NK * C * C * V + 2 * C * C * K + 2 * C * K * V), grid * NK),
        Kernel("cumsum", 2 * b32, 0.0, grid)])


def candidates(s: Shape, v_inner: tuple[bool, ...] = (False, True)) -> list[Tiles]:
    dims = lambda D: [x for x in (16, 32, 64, 128) if x <= max(16, D)]  # noqa: E731
    return [Tiles(bk, bv, vi, w, st) for bk, bv, vi, w, st in
            itertools.product(dims(s.K), dims(s.V), v_inner, (4, 8), (1, 2, 3))
            if not (vi and bv >= s.V)]


def choose(s: Shape, dev: Device = H100, v_inner: tuple[bool, ...] = (False, True)) -> tuple[Prediction, list[Prediction]]:
    """The feasible fused plan with the lowest floor, and all plans considered. Ties (the model sees
    bytes, not latency): fewer bytes, then larger tiles (fewer loop trips), V tiles as programs
    rather than an inner loop, fewer warps and stages — warps and stages are left to a sweep."""
    plans = [fused_plan(s, t, dev) for t in candidates(s, v_inner)]
    ok = [p for p in plans if p.feasible]
    if not ok:
        raise ValueError(f"no fused tiling fits {dev.name} for {s}: e.g. {plans[0].why}")
    best = min(ok, key=lambda p: (round(p.floor_s(dev), 12), p.total_bytes, -p.tiles.BK * p.tiles.BV, p.tiles.v_inner,
                                  p.tiles.num_warps, p.tiles.num_stages))
    return best, plans


@functools.lru_cache(maxsize=None)
def kernel_tiles(B: int, T: int, H: int, K: int, V: int, C: int, elem: int, device: str = "H100") -> Tiles:
    """The tiles fused_chunk.fused_chunk_fwd launches with: the model's choice among the loop orders
    that kernel implements (V tiles as programs; the V-inner order is not written yet)."""
    dev = {"H100": H100, "A100": A100}[device]
    return choose(Shape(B, T, H, K, V, C, elem=elem), dev, v_inner=(False,))[0].tiles


SHAPES = {"gla mve": Shape(16, 2048, 12, 64, 64), "gla 340m": Shape(8, 2048, 4, 256, 512),
          "gla state": Shape(16, 2048, 16, 64, 64), "gla long": Shape(1, 32768, 4, 128, 128),
          "ssd mamba2": Shape(8, 2048, 24, 128, 64, scalar_decay=True)}


def main() -> None:
    """The issue shapes on the H100: chunk's bytes and floor, and the fused plan the model picks."""
    print(f"{'shape':<22} {'chunk MB':>9} {'floor ms':>9} | {'fused MB':>9} {'floor ms':>9}  tiles (BK, BV, V inner, warps, stages), "
          "programs; states' programs")
    for name, s in SHAPES.items():
        c = chunk_plan(s)
        f, _ = choose(s)
        t = f.tiles
        print(f"{name:<22} {c.total_bytes / 1e6:9.1f} {c.floor_s(H100) * 1e3:9.3f} | {f.total_bytes / 1e6:9.1f} "
              f"{f.floor_s(H100) * 1e3:9.3f}  ({t.BK}, {t.BV}, {t.v_inner}, {t.num_warps}, {t.num_stages}), {f.programs}; "
              f"{f.kernels[1].programs}")
    print(f"\n{'backward, per-key decay':<22} {'chunk MB':>9} {'floor ms':>9} | {'fused MB':>9} {'floor ms':>9}")
    for name, s in SHAPES.items():
        if not s.scalar_decay:
            c, f = chunk_bwd_plan(s), fused_bwd_plan(s)
            print(f"{name:<22} {c.total_bytes / 1e6:9.1f} {c.floor_s(H100) * 1e3:9.3f} | {f.total_bytes / 1e6:9.1f} "
                  f"{f.floor_s(H100) * 1e3:9.3f}")


if __name__ == "__main__":
    main()
