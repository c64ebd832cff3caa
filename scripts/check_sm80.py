"""Will every Triton kernel launch on an A100? Compile each launch the models make for sm80 (and sm90), no GPU needed.

    python scripts/check_sm80.py                                  # every config × chunk and fused
    python scripts/check_sm80.py --configs gla_340m --backends fused
    python scripts/check_sm80.py --configs gdn_125m --backends fused --kernels delta_h_bwd_kernel
    python scripts/check_sm80.py --compile-with /path/to/venv/bin/python    # compile with that venv's Triton

Users also train on A100s, so every Triton kernel must run on sm80 as well as sm90. Where no A100 is at hand,
a kernel whose tiles need more shared memory than the A100's 163 KB per block (the H100 has
227 KB) fails there at its first launch. This script finds those launches on a CPU:

1. capture (a subprocess under TRITON_INTERPRET=1): each config's model, one layer, trains one step at B1 T64 in
   bf16 autocast on each backend, and every kernel launch's arguments, constexprs and launch options are recorded.
   The data-movement model plans the fused scan for the A100 (movement.device_model) and for the training shape,
   B8 T2048 (the tiles it would pick there, not at T64); the kernels take T as a runtime argument. Other choices
   that depend on the shape (the state scan's split into segments, RA+MLA's heads per program) are the ones T64
   makes. Pointers 16-byte aligned and ints divisible by 16 get Triton's divisibility hints, as on a GPU.
2. compile: each distinct launch is compiled ahead of time for sm80 and sm90 with Triton's own compiler, whose
   ptxas run reports registers and spills. The table gives shared memory per block against each device's limit,
   and for sm90 the layout conversions Triton left in the kernel and its block barriers: a memory-bound kernel
   with many of either moves its tiles through shared memory, where its loads alone would not.

What it does not show: that the kernels are right on sm80 (only running them there can), autotuned kernels (their
configs are chosen on the GPU, which skips any that do not fit; on a CPU they run one fixed config, compiled here),
Hopper-only kernels (proj_in's TMA dx: the capture takes the A100's pointer kernel, so the sm90 column shows that
one too; tests/ops/test_triton_lowering.py lowers the TMA kernel for sm90), and the WMMA CUDA kernel (nvcc; its
shared memory is checked by ops.attention.fused.plan_split). Writes <out>/sm80-compile.{md,json} (default out
runs/bench).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LIMITS = {80: 166_912, 90: 232_448}      # opt-in shared memory per block: A100 (163 KB), H100 (227 KB)
CONFIGS = ["gla_125m", "gla_340m", "gdn_125m", "gdn_340m", "mamba2_130m", "mamba2_370m", "gpt2_ramla_124m"]
TRAIN_B, TRAIN_T = 8, 2048
CAPTURE_VOCAB = 1024


def capture(config: str, backend: str, only: set[str] | None = None) -> list[dict]:
    """Run in a TRITON_INTERPRET=1 process: every distinct kernel launch of one training step of `config`. With
    `only`, the launches of those kernels alone, and no kernel is interpreted: each returns at once, its outputs
    left unwritten (the tiles and launch options depend on shapes and dtypes, never on values)."""
    import dataclasses

    import torch
    import triton.runtime.interpreter as interpreter

    from config import load_config
    from model import build_model
    import ops.gla.scan as fused_scan
    import ops.gla.fused as gla_fused
    import ops.proj_in.fused as proj_in_fused
    from ops.gla import movement

    # plan for the A100 at the training shape, whatever shape this small step has
    fused_scan.device_model = gla_fused.device_model = lambda device: "A100"
    # an A100 has no TMA: proj_in's dx runs by pointer loads there (its TMA kernel is lowered for sm90 by
    # tests/ops/test_triton_lowering.py)
    proj_in_fused.tma_addressable = lambda tensors: False
    fused_scan.kernel_tiles = lambda B, T, *a: movement.kernel_tiles(TRAIN_B, TRAIN_T, *a)
    gla_fused.scan_pays = lambda B, T, *a: movement.scan_pays(TRAIN_B, TRAIN_T, *a)

    seen: dict[str, dict] = {}
    run = interpreter.InterpretedFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        if only is None or self.fn.__name__ in only:
            values = {**dict(zip(self.arg_names, args)), **kwargs}
            spec = {name: arg_spec(v) for name, v in values.items()}
            key = json.dumps([self.fn.__module__, self.fn.__name__, spec], sort_keys=True)
            seen.setdefault(key, {"module": self.fn.__module__, "kernel": self.fn.__name__, "args": spec})
        return run(self, *args, grid=grid, warmup=warmup, **kwargs) if only is None else None

    interpreter.InterpretedFunction.run = record
    # the embedding, LM head and loss launch no Triton kernel on a CPU, and their bf16 GEMMs at a 50,257-word
    # vocabulary take seconds each there: a small vocabulary changes no launch
    model_cfg = load_config(ROOT / "configs" / f"{config}.yaml").model
    cfg = dataclasses.replace(model_cfg, backend=backend, n_layers=1,
                              vocab_size=min(CAPTURE_VOCAB, model_cfg.vocab_size))
    model = build_model(cfg)
    idx = torch.randint(0, cfg.vocab_size, (1, 65))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return list(seen.values())


def arg_spec(v: object) -> list:
    """A launch argument as JSON: [kind, value]; a tensor as ["ptr", dtype, 16-byte aligned]."""
    import torch

    if isinstance(v, torch.Tensor):
        return ["ptr", str(v.dtype).removeprefix("torch."), v.data_ptr() % 16 == 0]
    if v is None:
        return ["none", None]
    if isinstance(v, (bool, int, float, str)):
        return [type(v).__name__, v]
    return ["value", repr(v)]


TRITON_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64", "int32": "i32",
                "int64": "i64", "int8": "i8", "uint8": "u8", "bool": "i1"}


def compile_launch(launch: dict, cc: int) -> dict:
    """Compile one captured launch for compute capability cc: shared memory, registers, spills."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(launch["module"]), launch["kernel"])
    while not isinstance(fn, triton.runtime.JITFunction):   # autotune / heuristics wrappers
        fn = fn.fn
    args, signature, constexprs, attrs = launch["args"], {}, {}, {}
    options = {k: args[k][1] for k in ("num_warps", "num_stages") if k in args}
    for i, p in enumerate(fn.params):
        kind, value, *aligned = args[p.name] if p.name in args else ("default", p.default)
        if p.is_constexpr or kind in ("none", "default", "str"):
            signature[p.name], constexprs[p.name] = "constexpr", value
        elif kind == "ptr":
            signature[p.name] = "*" + TRITON_TYPES[value]
        else:
            signature[p.name] = {"bool": "i1", "float": "fp32"}.get(kind) or ("i32" if abs(value) < 2 ** 31 else "i64")
        # the hints a GPU launch specialises on: 16-byte-aligned pointers and ints divisible by 16 (they decide
        # vectorised and cp.async loads, so shared memory and registers)
        if not p.is_constexpr and not getattr(p, "do_not_specialize", False) and (
                (kind == "ptr" and aligned[0]) or (kind == "int" and value % 16 == 0)):
            attrs[(i,)] = [["tt.divisibility", 16]]
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", cc, 32),
                                options=options)
    out = log.getvalue()
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    return {"shared": kernel.metadata.shared, "registers": int(regs.group(1)) if regs else None,
            "spill_bytes": int(spills.group(1)) if spills else None,
            # layout conversions left after Triton's passes (each a trip through shared memory or shuffles), and
            # the block barriers in the code (conversions, cross-warp reductions, pipelined loads), counted once
            # each where they are written: how much of a kernel's time can go to moving its own tiles
            "conversions": kernel.asm["ttgir"].count("ttg.convert_layout"),
            "barriers": len(re.findall(r"\bbar(?:rier)?\.sync\b", kernel.asm["ptx"])),
            "tiles": {k: v for k, v in constexprs.items() if v is not None},
            "num_warps": options.get("num_warps", 4), "num_stages": options.get("num_stages", 3)}


def compile_all(launches: list[dict], archs: tuple[int, ...] = (80, 90)) -> list[dict]:
    """Run in a process without TRITON_INTERPRET (the kernels must be JITFunctions): one row per launch, compiled
    for each compute capability in archs."""
    import triton
    from tqdm import tqdm

    triton.knobs.compilation.always_compile = True     # a cached kernel would skip ptxas and its log
    triton.knobs.nvidia.dump_ptxas_log = True          # Triton's own ptxas run prints its -v report
    rows = []
    for launch in tqdm(launches, desc="compile " + ", ".join(f"sm{cc}" for cc in archs), unit="launch"):
        row = {k: launch[k] for k in ("module", "kernel", "users", "args")}
        try:
            row.update({f"sm{cc}": compile_launch(launch, cc) for cc in archs})
        except Exception as e:            # reported per launch: one kernel that does not compile is a finding
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        rows.append(row)
    return rows


def run_captures(configs: list[str], backends: list[str], kernels: list[str] | None = None
                 ) -> tuple[dict[str, dict], list[str]]:
    """{launch key: launch with the (config, backend) pairs that make it}, and the pairs that could not run; with
    `kernels`, those kernels' launches alone (capture's `only`)."""
    from tqdm import tqdm

    launches: dict[str, dict] = {}
    skipped = []
    pairs = [(c, b) for c in configs for b in backends]
    only = ["--capture-only", ",".join(kernels)] if kernels else []
    for config, backend in tqdm(pairs, desc="capture (interpreter)", unit="model"):
        r = subprocess.run([sys.executable, __file__, "--capture", config, backend, *only], capture_output=True,
                           text=True, env={**os.environ, "TRITON_INTERPRET": "1"}, cwd=ROOT)
        if r.returncode:
            why = (r.stderr.strip().splitlines() or ["no output"])[-1]
            skipped.append(f"{config} on {backend}: {why}")
            continue
        for launch in json.loads(r.stdout.strip().splitlines()[-1]):
            key = json.dumps([launch["module"], launch["kernel"], launch["args"]], sort_keys=True)
            launches.setdefault(key, {**launch, "users": []})["users"].append(f"{config}/{backend}")
    return launches, skipped


def to_markdown(rows: list[dict], skipped: list[str], env: dict, command: str) -> str:
    """The report: one table row per launch, the summary line first."""
    over = [r for r in rows if r.get("sm80", {}).get("shared", 0) > LIMITS[80]]
    failed = [r for r in rows if "error" in r]
    lines = [f"# Triton kernels compiled for the A100 (sm80) and the H100 (sm90) — {env['date']}", "",
             f"Command: `{command}`  ", f"compiled by triton {env['triton']} (captured under triton "
             f"{env.get('triton_capture', env['triton'])}'s interpreter), torch {env['torch']}, on a CPU (no GPU): "
             "each launch one training step of each config makes, compiled ahead of time; tiles planned for the A100 "
             f"at B{TRAIN_B} T{TRAIN_T}. Shared memory per block against the opt-in limit: "
             f"{LIMITS[80]:,} B on the A100, {LIMITS[90]:,} B on the H100.", "",
             f"**{len(rows)} distinct launches; {len(over)} exceed the A100's shared memory; {len(failed)} did not "
             f"compile; {len(skipped)} config/backend pairs not captured (listed below).**", "",
             "| kernel | constexprs | warps, stages | sm80 shared B | sm80 regs, spill B | sm90 shared B "
             "| sm90 regs, spill B | sm90 conversions, barriers | fits the A100 | used by |", "|" + "---|" * 10]
    for r in sorted(rows, key=lambda r: (r["module"], r["kernel"])):
        name = f"`{r['module'].removeprefix('ops.')}.{r['kernel']}`"
        if "error" in r:
            lines.append(f"| {name} | | | | | | | | compile error: {r['error']} | {', '.join(r['users'])} |")
            continue
        a, h = r["sm80"], r.get("sm90")
        tiles = " ".join(f"{k}={v}" for k, v in a["tiles"].items())
        sm90 = (f"{h['shared']:,} | {h['registers']}, {h['spill_bytes']} | {h.get('conversions', '—')}, "
                f"{h.get('barriers', '—')}") if h else "— | — | —"
        lines.append(f"| {name} | {tiles} | {a['num_warps']}, {a['num_stages']} | {a['shared']:,} | "
                     f"{a['registers']}, {a['spill_bytes']} | {sm90} | "
                     f"{'yes' if a['shared'] <= LIMITS[80] else '**no**'} | {', '.join(sorted(set(r['users'])))} |")
    lines += [""] + [f"- not captured: {s}" for s in skipped]
    lines += ["", "Registers and spills are what this Triton's ptxas reports; a GPU with another Triton version "
              "compiles with its own ptxas, whose numbers may differ."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    """Capture, compile, write the report; returns its rows (empty in the capture and compile subprocesses)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated config names (configs/*.yaml)")
    p.add_argument("--backends", default="chunk,fused", help="comma-separated backends")
    p.add_argument("--out", default="runs/bench", help="folder for sm80-compile.{md,json} (default runs/bench)")
    p.add_argument("--kernels", help="comma-separated kernel names: capture and compile only their launches "
                                     "(default: all)")
    p.add_argument("--compile-with", default=sys.executable, metavar="PYTHON",
                   help="the Python whose Triton compiles (e.g. a venv with the GPU machine's Triton version)")
    p.add_argument("--sm80-only", action="store_true", help="compile for the A100 alone (half the compile time)")
    p.add_argument("--capture", nargs=2, metavar=("CONFIG", "BACKEND"), help=argparse.SUPPRESS)   # subprocesses
    p.add_argument("--capture-only", help=argparse.SUPPRESS)
    p.add_argument("--compile", metavar="LAUNCHES_JSON", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.capture:
        print(json.dumps(capture(*args.capture, set(args.capture_only.split(",")) if args.capture_only else None)))
        return []
    if args.compile:
        import triton

        rows = compile_all(json.loads(Path(args.compile).read_text()), (80,) if args.sm80_only else (80, 90))
        print(json.dumps({"triton": triton.__version__, "rows": rows}))
        return []
    configs = args.configs.split(",")
    if unknown := [c for c in configs if not (ROOT / "configs" / f"{c}.yaml").is_file()]:
        p.error(f"no config {', '.join(unknown)} under configs/")
    from ops import BACKENDS

    if unknown := [b for b in args.backends.split(",") if b not in BACKENDS]:
        p.error(f"unknown backend(s) {', '.join(unknown)}; backends: {', '.join(BACKENDS)}")
    import torch
    import triton

    kernels = args.kernels.split(",") if args.kernels else None
    launches, skipped = run_captures(configs, args.backends.split(","), kernels)
    if kernels:
        wanted = set(kernels)
        if missing := wanted - {v["kernel"] for v in launches.values()}:
            p.error(f"no launch of {', '.join(sorted(missing))} in {args.configs} on {args.backends}")
        launches = {k: v for k, v in launches.items() if v["kernel"] in wanted}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:     # compiled in a process without the interpreter
        json.dump(list(launches.values()), f)
        f.flush()
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        r = subprocess.run([args.compile_with, __file__, "--compile", f.name] + ["--sm80-only"] * args.sm80_only,
                           stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    if r.returncode:
        sys.exit(f"error: the compile step failed (exit {r.returncode}); its messages are above")
    compiled = json.loads(r.stdout.strip().splitlines()[-1])
    rows = compiled["rows"]
    env = {"date": datetime.date.today().isoformat(), "triton": compiled["triton"],
           "triton_capture": triton.__version__, "torch": torch.__version__}
    command = ("python scripts/check_sm80.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    stem = Path(args.out) / "sm80-compile"
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(to_markdown(rows, skipped, env, command))
    stem.with_suffix(".json").write_text(json.dumps({"env": env, "command": command, "skipped": skipped,
                                                     "rows": rows}, indent=1, default=str))
    print(stem.with_suffix(".md").read_text())
    return rows


if __name__ == "__main__":
    main()
