"""An analytical data-movement model for the chunkwise GLA forward: HBM bytes, FLOPs and a time floor per
kernel plan, under a device's shared-memory and register budgets, and the tile choice that minimises the
floor. Chimera-style: count what each loop order must move, reject what does not fit on chip, take the
cheapest. No measurement enters it; scripts/bench_ops.py prints its floor beside the measured times.

Plans for one layer's forward (q, k [B, T, H, K], v, o [B, T, H, V], chunk C, NT = ⌈T/C⌉ chunks):
- `chunk` (the `chunk` backend, four launches): cumsum g → b; states h (reads k, v, b; writes h per
  chunk); intra (reads q, k, b; writes A [B, T, H, C]); output (reads q, b, h, A, v; writes o).
- `fused` (scan.py): one kernel, one program per (batch, head, V tile), scanning its chunks
  with the state in registers: reads q, k, g once per V tile and v once, writes o and, for the
  backward, b and the chunk states h. A, the states' round trip and the cumsum pass never reach HBM.
  The grid is only B·H·V/BV programs, so the floor is stretched when they leave SMs idle.
Tiles: BV ∈ {64, 128} (MIN_BV: narrower tiles miscompile on Hopper); the whole of K per program;
num_warps from the register budget (the state [K, BV], the scores [C, C], o [C, BV] and the decayed
q, k [C, K] are fp32 registers). No feasible tiling (K = 256 on the H100) means the scan does not pay:
ops.gla.fused then runs chunk's parallel forward.
The backward (per-key decay) is counted for both plans too (chunk_bwd_plan, fused_bwd_plan), at
the tiles its kernels launch with; the model does not choose those yet.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Device:
    name: str
    hbm_bytes_per_s: float        # achievable: measured device-to-device copy (read + write)
    flops: float                  # achievable bf16 tensor-core rate: measured 8192³ matmul
    n_sm: int
    smem_per_block: int           # bytes a block may opt into
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255


# Measured on the H100: 3.0 TB/s device-to-device copy, 786 TFLOP/s bf16 matmul; 132 SMs, 227 KB shared memory.
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
    64 × 64 state tile), sequential over chunks (ops/chunkwise/state.py), so a short grid leaves SMs idle."""
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


def fused_plan(s: Shape, t: Tiles, dev: Device, save: bool = True) -> Prediction:
    """The fused scan forward with V tiles t.BV (t.BK unused: every program holds all of K); `save`:
    it also writes b and h for the backward. Infeasible if it does not fit on chip."""
    z = _sizes(s)
    NV = math.ceil(s.V / t.BV)
    scan = Kernel("fused scan", NV * (2 * z["qk"] + z["b"]) + 2 * z["v"] + (z["b"] + z["h"] if save else 0),
                  _out_flops(s) + 2.0 * s.B * s.H * s.NT * s.C * s.K * s.V, s.B * s.H * NV)
    p = Prediction("fused", t, [scan])
    threads = 32 * t.num_warps
    # fp32 registers: the state [K, BV], the scores [C, C], o [C, BV], the decayed q and k [C, K]
    regs = (s.K * t.BV + s.C * s.C + s.C * t.BV + 2 * s.C * s.K) / threads
    # shared memory: the dots' operands, q̃ and k̃ in two parts each (scan.dot_split), A and v
    smem = 4 * s.C * s.K * s.elem + s.C * s.C * s.elem + s.C * t.BV * s.elem
    if regs + 32 > dev.max_regs_per_thread:       # 32: addresses, indices, the decay row
        p.feasible, p.why = False, f"{regs:.0f} fp32 registers per thread for the state, scores and operands"
    elif smem > dev.smem_per_block:
        p.feasible, p.why = False, f"{smem / 1024:.0f} KB shared memory"
    return p


def chunk_bwd_plan(s: Shape) -> Prediction:
    """`chunk`'s backward, per-key decay (ops/chunkwise/): dh pass, dA = do vᵀ written in fp32,
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


def bwd_key_tile(K: int) -> int:
    """The fused backward's key tile (scan_bwd.py): all of K up to 64, one launch with dv; else 32, with dv
    apart (faster than 64 in the H100 sweeps at K = 128, V = 256)."""
    return 1 << max(4, (K - 1).bit_length()) if K <= 64 else 32


def fused_bwd_plan(s: Shape, BK: int | None = None, BV: int = 64) -> Prediction:
    """The fused backward (scan_bwd.py): the same dh pass, then per (K tile, chunk) dq, dk, db
    from dA = do vᵀ (v, do re-read per K tile), with dv in the same kernel when K fits one tile, else
    per (V tile, chunk) dv from Aᵀ over all of K (q, k, b re-read per V tile); then db's reverse
    cumsum. Neither A nor dA nor an fp32 partial reaches HBM. BK: bwd_key_tile's by default."""
    BK = BK or bwd_key_tile(s.K)
    z, grid = _sizes(s), s.B * s.H * s.NT
    NK, NV = math.ceil(s.K / BK), math.ceil(s.V / BV)
    C, K, V = s.C, s.K, s.V
    b32 = s.B * s.T * s.H * s.K * 4
    dqk = Kernel("dq, dk, db" + (", dv" if NK == 1 else ""),
                 4 * z["qk"] + z["b"] + NK * 2 * z["v"] + 2 * z["h"] + b32 + (z["v"] if NK == 1 else 0),
                 2.0 * grid * (NK * 2 * C * C * V + 6 * C * C * K + 2 * C * K * V), grid * NK)
    dv = [] if NK == 1 else [Kernel("dv", NV * (2 * z["qk"] + z["b"]) + 2 * z["v"] + z["h"],
                                    2.0 * grid * (3 * NV * C * C * K + C * C * V + C * K * V), grid * NV)]
    return Prediction("fused bwd", Tiles(BK, BV), [
        Kernel("dh", z["qk"] + z["v"] + z["b"] + z["h"], 2.0 * grid * C * K * V, s.B * s.H * math.ceil(K / 64) * math.ceil(V / 64)),
        dqk, *dv, Kernel("cumsum", 2 * b32, 0.0, grid)])


# Triton 3.6 on the H100 miscompiles the scan's forward with V tiles of 16 or 32 when it stores nothing for
# the backward (inference, evaluation): o wrong at 4 warps, a fault at 8, whatever num_stages; BV 64 (also
# masked) and every tile with the stores are right.
MIN_BV = 64


def candidates(s: Shape) -> list[Tiles]:
    return [Tiles(s.K, bv, False, w, 1) for bv, w in
            itertools.product([x for x in (64, 128) if x == MIN_BV or x <= s.V], (4, 8))]


def choose(s: Shape, dev: Device = H100) -> tuple[Prediction | None, list[Prediction]]:
    """The feasible fused plan with the lowest floor (None if none fits), and all plans considered.
    Ties (the model sees bytes, not latency): fewer bytes, larger V tiles, fewer warps."""
    plans = [fused_plan(s, t, dev) for t in candidates(s)]
    ok = [p for p in plans if p.feasible]
    best = min(ok, key=lambda p: (round(p.floor_s(dev), 12), p.total_bytes, -p.tiles.BV, p.tiles.num_warps),
               default=None)
    return best, plans


@functools.lru_cache(maxsize=None)
def device_model(device: torch.device) -> str:
    """Which device budget to plan for: sm80 gets the A100's, anything else (sm90, and the interpreter)
    the H100's. Cached: every forward asks."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) == (8, 0):
        return "A100"
    return "H100"


@functools.lru_cache(maxsize=None)
def kernel_tiles(B: int, T: int, H: int, K: int, V: int, C: int, elem: int, device: str = "H100") -> Tiles | None:
    """The tiles scan.fused_scan_fwd launches with, or None where no scan tiling fits on chip."""
    best, _ = choose(Shape(B, T, H, K, V, C, elem=elem), {"H100": H100, "A100": A100}[device])
    return best.tiles if best else None


@functools.lru_cache(maxsize=None)
def scan_pays(B: int, T: int, H: int, K: int, V: int, C: int, elem: int, device: str = "H100") -> bool:
    """Whether the scan's floor is below chunk's parallel forward's: false where the B·H·V/BV programs
    leave SMs idle (one long sequence) or where wide keys force narrow V tiles (K = 256)."""
    dev, s = {"H100": H100, "A100": A100}[device], Shape(B, T, H, K, V, C, elem=elem)
    best, _ = choose(s, dev)
    return best is not None and best.floor_s(dev) < chunk_plan(s).floor_s(dev)


SHAPES = {"gla mve": Shape(16, 2048, 12, 64, 64), "gla 340m": Shape(8, 2048, 4, 256, 512),
          "gla 340m model": Shape(8, 2048, 4, 128, 256), "gla state": Shape(16, 2048, 16, 64, 64),
          "gla long": Shape(1, 32768, 4, 128, 128),
          "ssd mamba2": Shape(8, 2048, 24, 128, 64, scalar_decay=True)}


def main() -> None:
    """The benchmark shapes on the H100: chunk's bytes and floor, and the fused plan the model picks."""
    print(f"{'shape':<22} {'chunk MB':>9} {'floor ms':>9} | {'fused MB':>9} {'floor ms':>9}  "
          "tiles (BV, warps), programs")
    for name, s in SHAPES.items():
        if s.scalar_decay:
            continue
        c = chunk_plan(s)
        f, plans = choose(s)
        if f is None:
            print(f"{name:<22} {c.total_bytes / 1e6:9.1f} {c.floor_s(H100) * 1e3:9.3f} | no scan fits: {plans[-1].why}")
            continue
        print(f"{name:<22} {c.total_bytes / 1e6:9.1f} {c.floor_s(H100) * 1e3:9.3f} | {f.total_bytes / 1e6:9.1f} "
              f"{f.floor_s(H100) * 1e3:9.3f}  ({f.tiles.BV}, {f.tiles.num_warps}), {f.programs}")
    print(f"\n{'backward, per-key decay':<22} {'chunk MB':>9} {'floor ms':>9} | {'fused MB':>9} {'floor ms':>9}")
    for name, s in SHAPES.items():
        if not s.scalar_decay:
            c, f = chunk_bwd_plan(s), fused_bwd_plan(s)
            print(f"{name:<22} {c.total_bytes / 1e6:9.1f} {c.floor_s(H100) * 1e3:9.3f} | {f.total_bytes / 1e6:9.1f} "
                  f"{f.floor_s(H100) * 1e3:9.3f}")


if __name__ == "__main__":
    main()
