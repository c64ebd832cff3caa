"""Where does a training step's time go? GPU busy fraction, top kernels, host gaps and, under DDP, how much of the
all-reduce is exposed, for one or several DDP settings in one launch.

    python scripts/profile_step.py --config configs/gla_340m.yaml --backend fused
    accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 4 scripts/profile_step.py \\
        --config configs/gla_340m.yaml --variants local,ddp,ddp:bucket=100:view,ddp:compile

Each variant trains --warmup steps, then --steps steps under torch.profiler (forward, backward, gradient clipping,
fused AdamW; bf16 autocast; random tokens at the config's micro-batch and length, one micro-batch per step), all
ranks at once. Variants (`:`-separated options after the kind):
  local        every rank steps its own model copy with no communication: the one-GPU step, measured while the
               other GPUs do the same
  ddp          DistributedDataParallel; options: bucket=MB (bucket_cap_mb, default 25), view
               (gradient_as_bucket_view), static (static_graph), compile (torch.compile of the DDP module, as
               train.py's --train.compile_scope=model: Dynamo's DDPOptimizer splits it at the buckets), blocks
               (each block compiled inside the DDP module, as train.py's default scope), graph (the forward and
               backward captured as a CUDA graph, DDP's all-reduce with them, as train.py's --train.cuda_graphs),
               ctas=N (NCCL's CTAs per all-reduce at most: fewer SMs taken from the kernels it overlaps), bf16
               (the all-reduce in bf16 through torch's bf16_compress_hook: half the bytes, each gradient rounded).
               train.py's DDP is `ddp:blocks:graph:view:bucket=100` (its DDP_KWARGS, compiled blocks, graphs)
  fsdp         FSDP2 as configs/accelerate/fsdp.yaml shards it (each Block, then the root; bf16 parameters, fp32
               gradient reduction); options: noreshard (reshard_after_forward=False: the backward reuses the
               forward's gathered parameters), compile (each block compiled, as train.py's block scope)
  (`local:compile` compiles the local step fullgraph; `local:blocks` compiles each block, as train.py's default;
  `local:graph` captures the local forward and backward. A graph variant warms up at least as many steps as its
  capture needs.)
From rank 0's kernel timeline (utils/profiling.py): step time (wall, between two synchronizations, per step), GPU
busy, compute busy (without NCCL's kernels), host gaps, communication and exposed communication, and the top
kernels by total time. train.py's own steps, data and logging included: its --train.profile=A:N.
Writes <out>/profile.{md,json}; --trace also keeps rank 0's Chrome trace per variant.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from config import load_config  # noqa: E402
from model import build_model  # noqa: E402
from train import make_optimizer  # noqa: E402
from utils.compile import compile_blocks  # noqa: E402
from utils.cuda_graph import DDP_ENV, DDP_WARMUP, WARMUP, GraphedMicroBatch, ddp_capture  # noqa: E402
from utils.profiling import analyse  # noqa: E402


def parse_variant(text: str) -> dict:
    kind, *opts = text.split(":")
    if kind not in ("local", "ddp", "fsdp"):
        raise SystemExit(f"variant {text!r}: the kind must be local, ddp or fsdp")
    v = {"name": text, "kind": kind, "bucket": 25, "view": False, "static": False, "compile": False, "blocks": False,
         "reshard": True, "graph": False, "ctas": 0, "bf16": False}
    for o in opts:
        key, _, val = o.partition("=")
        if key in ("bucket", "ctas") and kind == "ddp" and val.isdigit() and int(val) > 0:
            v[key] = int(val)
        elif key in ("view", "static", "bf16") and kind == "ddp" and not val:
            v[key] = True
        elif key == "compile" and not val:
            v["compile"] = True
        elif key == "blocks" and kind != "fsdp" and not val:
            v["blocks"] = True
        elif key == "noreshard" and kind == "fsdp" and not val:
            v["reshard"] = False
        elif key == "graph" and kind != "fsdp" and not val:
            v["graph"] = True
        else:
            raise SystemExit(f"variant {text!r}: unknown option {o!r} (ddp takes bucket=MB, ctas=N, view, static, "
                             "bf16, compile, blocks, graph; fsdp takes noreshard, compile; local takes compile, "
                             "blocks, graph)")
    if v["compile"] and v["blocks"]:
        raise SystemExit(f"variant {text!r}: compile (the whole model) and blocks (each block) exclude each other")
    if v["graph"] and v["compile"]:
        raise SystemExit(f"variant {text!r}: graph captures compiled blocks (blocks), not the whole compiled model")
    return v


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--backend", default="fused")
    p.add_argument("--variants", default="local", help="comma-separated, e.g. local,ddp,ddp:bucket=100:view")
    p.add_argument("--micro-batch", type=int, help="default: the config's train.micro_batch_size")
    p.add_argument("--seq-len", type=int, help="default: the config's data.seq_len")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("runs/profile"))
    p.add_argument("--trace", action="store_true", help="keep rank 0's Chrome trace of each variant")
    p.add_argument("--top", type=int, default=12, help="kernels listed per variant, by total time")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variants.split(",") if v]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if any(v["kind"] == "ddp" for v in variants) and world < 2:
        raise SystemExit("ddp variants need several processes: run under accelerate launch --num_processes N "
                         "(or torchrun)")
    cuda = torch.cuda.is_available()
    if any(v["graph"] for v in variants) and not cuda:
        raise SystemExit("graph variants need a CUDA GPU")
    if any(v["graph"] and v["kind"] == "ddp" for v in variants):
        os.environ.update(DDP_ENV)          # before the process group starts
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    fsdp_alone = world == 1 and any(v["kind"] == "fsdp" for v in variants)
    if world > 1 or fsdp_alone:            # one-process FSDP2 (the one-GPU baseline) still needs a process group
        store = {"store": torch.distributed.HashStore(), "rank": 0, "world_size": 1} if fsdp_alone else {}
        torch.distributed.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None, **store)
    cfg = load_config(args.config, [f"--model.backend={args.backend}"])
    B, T = args.micro_batch or cfg.train.micro_batch_size, args.seq_len or cfg.data.seq_len
    g = torch.Generator(device=device).manual_seed(rank)
    x, y = (torch.randint(0, cfg.model.vocab_size, (B, T), device=device, generator=g) for _ in range(2))
    results = []
    for v in variants:
        r = profile_variant(v, cfg, x, y, device, local, world, args)
        if rank == 0:
            results.append(r)
            print(f"{v['name']}: {r['step_ms']:.1f} ms/step, busy {r['busy']:.1%}, comm {r['comm_ms']:.1f} ms, "
                  f"exposed {r['exposed_comm_ms']:.1f} ms", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if rank == 0:
        write(results, args, world, B, T)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return results


def profile_variant(v: dict, cfg, x: torch.Tensor, y: torch.Tensor, device: torch.device, local: int, world: int,
                    args) -> dict | None:
    """Warm-up, then the profiled steps of one variant on a fresh model; rank 0's numbers (None elsewhere)."""
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    module = build_model(cfg.model).to(device)
    if v["kind"] == "fsdp":
        shard(module, device, world, v["reshard"])
        if v["compile"]:
            compile_blocks(module)
        step_fn = model = module
        stream = None
    else:
        with ddp_capture(v["graph"], world if v["kind"] == "ddp" else 1) as stream:
            model = module if v["kind"] == "local" else torch.nn.parallel.DistributedDataParallel(
                module, device_ids=[local] if cuda else None, bucket_cap_mb=v["bucket"],
                gradient_as_bucket_view=v["view"], static_graph=v["static"], process_group=nccl_group(v["ctas"]))
            if v["bf16"]:
                model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        if v["blocks"]:
            compile_blocks(module)
        step_fn = torch.compile(model, fullgraph=v["kind"] == "local", dynamic=False) if v["compile"] else model
    opt = make_optimizer(module, cfg, fused=cuda)                      # train.py's, parameter groups and all

    def forward_backward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", torch.bfloat16) if cuda else contextlib.nullcontext():
            loss = step_fn(x, y, return_logits=False)[1]
        loss.backward()
        return loss.detach()

    capture_after = DDP_WARMUP if v["kind"] == "ddp" else WARMUP
    graphed = GraphedMicroBatch(forward_backward, list(module.parameters()), capture_after, stream) \
        if v["graph"] else None

    def step() -> None:
        graphed(x, y, first=True) if graphed else forward_backward(x, y)     # as train.py: a graph writes .grad
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        if not graphed:
            opt.zero_grad(set_to_none=True)

    t0 = time.time()
    step()
    first_s = time.time() - t0
    for _ in range(max(args.warmup, capture_after + 1 if graphed else 0) - 1):
        step()
    sync(cuda, world)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        if cuda:
            torch.cuda.synchronize()       # this rank's steps; the barrier below stays out of its timeline
        wall_us = (time.perf_counter() - t0) * 1e6
    if graphed:
        graphed.release()                  # a graph holding NCCL work goes before the process group
    sync(cuda, world)
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"trace-{v['name'].replace(':', '_').replace('=', '')}.json"
    prof.export_chrome_trace(str(path))
    r = {**v, **analyse(json.loads(path.read_text()), wall_us, args.steps, args.top), "first_step_s": first_s,
         "tokens_per_s_per_gpu": x.numel() * args.steps / (wall_us / 1e6)}
    if not args.trace:
        path.unlink()
    return r


def nccl_group(max_ctas: int):
    """The default process group, or (max_ctas > 0) a new NCCL group of every rank whose collectives use at most
    max_ctas thread blocks (NCCL's maxCTAs)."""
    if not max_ctas:
        return None
    opts = torch.distributed.ProcessGroupNCCL.Options()
    opts.config.max_ctas = max_ctas
    return torch.distributed.new_group(backend="nccl", pg_options=opts)


def shard(module: torch.nn.Module, device: torch.device, world: int, reshard: bool) -> None:
    """FSDP2 in place, as accelerate's TRANSFORMER_BASED_WRAP applies it: each Block its own unit, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if device.type == "cuda" else None,
                              reduce_dtype=torch.float32)
    for block in module.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(module, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)


def sync(cuda: bool, world: int) -> None:
    if cuda:
        torch.cuda.synchronize()
    if world > 1:
        torch.distributed.barrier()


def write(results: list[dict], args, world: int, B: int, T: int) -> None:
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    base = next((r for r in results if r["kind"] == "local"), None)
    lines = [f"# Step profile: {Path(args.config).stem} on {args.backend}, {world} process(es), {dev}", "",
             f"Command: `{' '.join(['python', *sys.argv])}`  ", f"torch {torch.__version__}; micro-batch {B} × "
             f"{T} tokens per GPU, one micro-batch per step, "
             f"{'bf16 autocast' if torch.cuda.is_available() else 'fp32'}, {args.steps} profiled steps after "
             f"{args.warmup}.", "",
             "| variant | ms / step | tokens/s per GPU | ÷ local | GPU busy | compute busy | host gaps ms | NCCL ms | "
             "exposed NCCL ms | first step s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ratio = f"{r['tokens_per_s_per_gpu'] / base['tokens_per_s_per_gpu']:.3f}" if base else ""
        lines.append(f"| {r['name']} | {r['step_ms']:.1f} | {r['tokens_per_s_per_gpu']:,.0f} | {ratio} | "
                     f"{r['busy']:.1%} | {r['compute_busy']:.1%} | {r['gap_ms']:.1f} | {r['comm_ms']:.1f} | "
                     f"{r['exposed_comm_ms']:.1f} | "
                     f"{r['first_step_s']:.1f} |")
    for r in results:
        lines += ["", f"Top kernels, {r['name']} (ms per step, calls per step):", ""]
        lines += [f"- {k['ms_per_step']:.2f} ms ×{k['calls_per_step']:.0f} `{k['name'][:90]}`" for k in r["top"]]
    (args.out / "profile.md").write_text("\n".join(lines) + "\n")
    (args.out / "profile.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines[:6 + len(results) + 2]))


if __name__ == "__main__":
    main()
