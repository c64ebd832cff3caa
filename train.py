"""Train a chunkfuse language model on one backend.

    python train.py --config configs/smoke.yaml                                  # CPU, synthetic data
    accelerate launch train.py --config configs/gla_340m.yaml --backend fused    # GPU(s)
    python train.py --config configs/smoke.yaml --resume                         # continue the run
    python train.py --config configs/smoke.yaml --train.max_steps=200 --optim.lr 1e-3 --train.name=short

Any config key can be overridden as --section.key=value (or --section.key value); the sections are model,
data, optim and train, and config.py lists their keys (--help lists optim's and train's). Unknown keys are errors.
The run folder <train.out_dir>/<train.name> receives config.yaml, run.json (commit, device, versions, per-layer
backends), metrics.jsonl and checkpoints/; --train.log_with=tensorboard or wandb sends the metrics to that tracker
too (utils/trackers.py). One training process at a time holds a run folder (its .lock; a second run with the same
--train.name refuses to start); evaluation reads it without the lock.

Backends: naive (PyTorch reference), chunk (chunkwise Triton kernels), fused (this repository's fused
kernels; --fuse picks among their components), fla (the flash-linear-attention package). A backend an
op lacks or this machine cannot run is an error, never a silent fallback.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from accelerate.utils import set_seed
from tqdm import tqdm

from config import Config, ConfigError, keys_help, load_config, parser_flags, save_config, to_dict
from data.prepare import check_sources, prepare_split
from data.sampler import (BatchSampler, bos_token, cu_seqlens, eval_batches, eval_windows, max_eval_batches,
                          separator_token, windows_to_batch)
from model import build_model
from model.hf import init_from_hf
from utils.activation_checkpointing import checkpoint_activations
from utils.checkpoint import (check_resume_config, clean_stale_tmp, latest_checkpoint, load_checkpoint, read_state,
                              resume_target, save_checkpoint, supersede_after)
from utils.cli import run_cli
from utils.compile import compiled_step, resolve_compile
from utils.cuda_graph import DDP_ENV, DDP_WARMUP, WARMUP, GraphedMicroBatch, ddp_capture, resolve_cuda_graphs
from utils.errors import write_error
from utils.precision import fsdp_plugin, resolve_precision
from utils.runinfo import JsonlWriter, environment, peak_flops, peak_memory_gb
from utils.runlock import take_run_folder
from utils.stepguard import Diverged, StepGuard, finite_mean
from utils.profiling import StepProfiler
from utils.timing import HostCopy, IntervalClock
from utils.trackers import project_config, record, resolve_log_with, start_trackers

# DDP: each gradient lives in its all-reduce bucket (no copy into the bucket and back out each step) and 100 MB
# buckets (fewer all-reduces beside the backward): the same sums, up to NCCL's order. FSDP launches ignore it.
DDP_KWARGS = DistributedDataParallelKwargs(bucket_cap_mb=100, gradient_as_bucket_view=True)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during training, with a message that names the last checkpoint and how to continue."""


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__, epilog=keys_help(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML preset, e.g. configs/gla_125m.yaml")
    p.add_argument("--backend", help="kernel backend for every op: naive, chunk, fused or fla (shorthand for "
                                     "--model.backend)")
    p.add_argument("--fuse", help="with --backend fused: the fused components to use, comma-separated from proj, "
                                  "state, chunk (default: all the ops have; shorthand for --model.fuse)")
    p.add_argument("--init_from", metavar="hf:DIR",
                   help="start from a Hugging Face folder's weights (python -m model.export writes one; fla's GLA, Gated "
                        "DeltaNet and Mamba-2 and transformers' GPT-2 load); its model settings replace the config's, "
                        "except backend, fuse, chunk_size and init_std")
    p.add_argument("--resume", nargs="?", const="latest", default=None,
                   help="continue from the run's latest checkpoint, or from PATH (a checkpoint, or a run folder's "
                        "latest); the run's checkpoints after it move to checkpoints/superseded-<time>/")
    p.add_argument("--allow-changes", action="store_true",
                   help="with --resume: accept settings that differ from the checkpoint's (optimizer, data, seed, "
                        "batch, precision); without it they are an error. Model settings other than backend and "
                        "fuse may never differ.")
    args, overrides = p.parse_known_args(argv)
    args.flags = parser_flags(p)
    return args, overrides


def lr_at(step: int, cfg: Config) -> float:
    """Linear warmup to optim.lr, then cosine to lr · min_lr_ratio at train.max_steps."""
    o, total = cfg.optim, cfg.train.max_steps
    if step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    frac = min(1.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps))
    return o.lr * (o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model: torch.nn.Module, cfg: Config, fused: bool) -> torch.optim.AdamW:
    """AdamW; matrices decay, norms, biases and embeddings do not."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "embed" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                             eps=cfg.optim.eps, fused=fused)


@torch.no_grad()
def evaluate(model, store, cfg: Config, accelerator) -> float:
    """Mean token loss over the split's first train.eval_batches·micro_batch_size windows, shared
    among the ranks. Every rank runs the same number of forwards (a rank with fewer windows runs
    extra ones it does not count): under FSDP each forward gathers parameters from all ranks."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
    T, mb, n, world = cfg.data.seq_len, cfg.train.micro_batch_size, cfg.train.eval_batches, accelerator.num_processes
    bos, sep = bos_token(store, cfg.data.bos), separator_token(store, cfg.data.varlen)
    mine = list(eval_batches(store, T, mb, n, world, accelerator.process_index, bos))
    pad = max_eval_batches(store, T, mb, n, world) - len(mine)
    for i, (x, y) in enumerate(mine + [windows_to_batch(store, [0], T, bos)] * pad):
        cu = None if sep is None else cu_seqlens(x, sep).to(accelerator.device)     # packed documents
        _, loss = model(x.to(accelerator.device), y.to(accelerator.device), return_logits=False, cu_seqlens=cu)
        if i < len(mine):
            total += torch.stack([loss.double() * y.numel(), torch.tensor(y.numel(), device=total.device)])
    model.train()
    total = accelerator.reduce(total, reduction="sum")
    return (total[0] / total[1]).item()


def main(argv: list[str] | None = None) -> dict:
    with ExitStack() as stack:          # holds the run folder's lock until main returns or raises
        return _main(argv, stack)


def _main(argv: list[str] | None, stack: ExitStack) -> dict:
    t_launch = time.time()
    args, overrides = parse_args(argv)
    cfg = load_config(args.config, overrides, args.flags)
    if args.backend:
        cfg.model.backend = args.backend
    if args.fuse:
        cfg.model.fuse = args.fuse
    init_state, init_changes = None, []
    if args.init_from:
        cfg.model, init_state, init_changes = init_from_hf(args.init_from, cfg.model)
    tc = cfg.train
    precision = resolve_precision(tc.precision)
    log_with = resolve_log_with(tc.log_with)
    if args.allow_changes and not args.resume:
        raise ConfigError("--allow-changes applies only with --resume")
    if cfg.data.varlen and cfg.model.family == "gpt2" and cfg.model.backend not in ("naive", "fla"):
        raise ConfigError("data.varlen (packed documents): GPT-2's attention keeps to each document on --backend "
                          "naive or fla; choose one of those, or --data.varlen=false")
    with torch.device("meta"):   # family, backends, shapes and checkpointing checked before any data is downloaded
        meta_model = build_model(cfg.model)
        meta_model.check_trains()
        checkpoint_activations(meta_model, tc.activation_checkpointing)
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    compile_on, compile_why = resolve_compile(cfg, device_type, fsdp_plugin(precision) is not None)
    launched = int(os.environ.get("WORLD_SIZE", 1))
    graphs_on, graphs_why = resolve_cuda_graphs(cfg, device_type, launched, precision,
                                                fsdp_plugin(precision) is not None)
    if graphs_on and launched > 1:
        os.environ.update(DDP_ENV)      # before accelerate starts the process group
    run_dir = Path(tc.out_dir) / tc.name
    # cpu=True without a GPU: accelerate sets up gloo for several CPU processes (torchrun) only when told;
    # without it each process would train alone, all racing for the same run folder
    accelerator = Accelerator(mixed_precision=precision, cpu=not torch.cuda.is_available(),
                              fsdp_plugin=fsdp_plugin(precision), log_with=log_with,
                              project_config=project_config(run_dir), kwargs_handlers=[DDP_KWARGS])
    if accelerator.num_processes != launched:
        raise SystemExit(f"error: {launched} processes were launched but accelerate set up {accelerator.num_processes}; "
                         "launch with `accelerate launch --num_processes N` on GPUs (or torchrun on CPUs)")
    main_proc, device = accelerator.is_main_process, accelerator.device
    log = accelerator.print
    eval_on = bool(tc.eval_interval or tc.eval_batches)
    check_sources(cfg.data, ["train", "valid"] if eval_on else ["train"])   # before any split is tokenized

    take_run_folder(run_dir, accelerator, stack, log)
    if main_proc:
        clean_stale_tmp(run_dir, log)
    resume_from = None
    if args.resume:       # the newest checkpoint that reads back, skipping (with a warning) newer ones that do not
        resume_from = resume_target(run_dir if args.resume == "latest" else Path(args.resume), log)
    elif latest_checkpoint(run_dir) is not None:
        raise FileExistsError(f"{run_dir} already holds checkpoints; pass --resume to continue it or "
                              "choose another --train.name")
    if resume_from is not None:
        saved = read_state(resume_from)
        check_resume_config(saved.get("config"), cfg, args.allow_changes, log)
        if saved["step"] >= tc.max_steps:    # before config.yaml or the metrics are touched
            log(f"{resume_from} is at step {saved['step']} and train.max_steps is {tc.max_steps}: nothing to "
                "train. Raise --train.max_steps to continue the run.")
            return {"steps": saved["step"], "checkpoint": str(resume_from)}
        if "config" in saved and saved["config"]["train"]["max_steps"] != tc.max_steps:
            was = dataclasses.replace(cfg, train=dataclasses.replace(tc,
                                                                     max_steps=saved["config"]["train"]["max_steps"]))
            log(f"resume: the cosine schedule now ends at step {tc.max_steps}, not {was.train.max_steps}: the lr "
                f"at step {saved['step']} moves from {lr_at(saved['step'], was):.3g} to "
                f"{lr_at(saved['step'], cfg):.3g}")

    with accelerator.main_process_first():
        train_store = prepare_split(cfg.data, "train", log=log)
        val_store = prepare_split(cfg.data, "valid", log=log) if eval_on else None
    if cfg.model.vocab_size < train_store.vocab_size:
        raise ConfigError(f"model.vocab_size {cfg.model.vocab_size} < the data's vocabulary "
                          f"{train_store.vocab_size}")
    entropy = train_store.meta.get("entropy_rate")

    set_seed(tc.seed)
    model = build_model(cfg.model)
    if init_state is not None and resume_from is None:
        model.load_state_dict(init_state, strict=True)
        log(f"initialised from {args.init_from}" + (f"; model settings it changed: {', '.join(init_changes)}"
                                                     if init_changes else ""))
    optimizer = make_optimizer(model, cfg, fused=True)      # StepGuard skips bad steps through the fused kernel
    n_params = model.num_params()
    flops_tok = model.flops_per_token(cfg.data.seq_len)
    backends = model.backends()
    compute_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    plans = model.kernel_plans(tc.micro_batch_size, cfg.data.seq_len, compute_dtype, device)
    recompute = checkpoint_activations(model, tc.activation_checkpointing)     # before FSDP2 shards and compile
    with ddp_capture(graphs_on, launched) as capture_stream:
        model, optimizer = accelerator.prepare(model, optimizer)
    step_model = compiled_step(model, cfg) if compile_on else model     # evaluation and checkpoints use `model`
    sampler = BatchSampler(train_store, cfg.data.seq_len, tc.micro_batch_size, tc.grad_accum,
                           accelerator.num_processes, accelerator.process_index, tc.seed,
                           bos_token(train_store, cfg.data.bos))
    tokens_per_step = sampler.global_batch * cfg.data.seq_len

    def micro_step(x: torch.Tensor, y: torch.Tensor, cu: torch.Tensor | None = None) -> torch.Tensor:
        _, loss = step_model(x, y, return_logits=False, cu_seqlens=cu)     # chunked head + loss
        accelerator.backward(loss / tc.grad_accum)
        return loss.detach()
    graphed = GraphedMicroBatch(micro_step, list(model.parameters()), DDP_WARMUP if launched > 1 else WARMUP,
                                capture_stream) if graphs_on else None
    sep = separator_token(train_store, cfg.data.varlen)           # packed documents: split at each separator

    step, last_ckpt, state = 0, None, {}
    if resume_from is not None:
        state = load_checkpoint(accelerator, resume_from)
        step, last_ckpt = state["step"], str(resume_from)
        log(f"resumed from {resume_from} at step {step}")
        if main_proc:
            for moved in supersede_after(run_dir, step, resume_from):
                log(f"resume: {moved.name} is after the resumed step; moved to {moved.parent}")
        accelerator.wait_for_everyone()
    metrics = None
    if main_proc:
        try:
            save_config(cfg, run_dir / "config.yaml")
            info = {"config": to_dict(cfg), "precision": precision, "world_size": accelerator.num_processes,
                    "params": n_params, "backends": [{"layer": i, "op": o, "backend": b} for i, o, b in backends],
                    **environment(device)}
            (run_dir / "run.json").write_text(json.dumps(info, indent=1))
            metrics = JsonlWriter(run_dir / "metrics.jsonl", truncate_after_step=step, log=log)
        except OSError as e:
            raise write_error(e, f"the run folder {run_dir}", "free space or choose a writable --train.out_dir") from None
    per_layer = sorted({f"{o}={b}" for _, o, b in backends})
    log(f"{cfg.model.family}: {n_params / 1e6:.2f}M params, layers' ops: {', '.join(per_layer)} "
        f"(x{cfg.model.n_layers}); {accelerator.num_processes} process(es) on {device}, precision {precision}; "
        f"{tokens_per_step:,} tokens/step")
    for plan in plans:
        log(f"kernel plan: {plan}")
    log(f"compiled step: {'on' if compile_on else 'off'} ({compile_why}); activation checkpointing: {recompute}")
    log(f"CUDA graphs: {'on' if graphs_on else 'off'} ({graphs_why})" + (
        f"; each kind of micro-batch replayed from its own graph, captured after {graphed.warmup} of that kind"
        if graphed else ""))
    if entropy is not None:
        log(f"synthetic source: entropy rate {entropy:.4f} nats/token (the best achievable loss)")
    if val_store is not None:
        asked = tc.eval_batches * tc.micro_batch_size
        held = eval_windows(val_store, cfg.data.seq_len, tc.micro_batch_size, tc.eval_batches)
        if held < asked:
            log(f"validation: the split holds {held} windows of {cfg.data.seq_len} tokens, fewer than the "
                f"{asked} that train.eval_batches x micro_batch_size ask for; all {held} are scored")

    peak = peak_flops(device, precision)
    guard = StepGuard(tc.max_bad_steps, accelerator.scaler is not None, bad_steps=state.get("bad_steps", 0),
                      reduce=(lambda t: accelerator.reduce(t, "sum")) if accelerator.num_processes > 1 else None)
    result = {"steps": step}
    bar = tqdm(total=tc.max_steps, initial=step, disable=not (main_proc and tc.progress), unit="step",
               dynamic_ncols=True)
    warn = bar.write if main_proc else (lambda message: None)      # the guard's warnings, printed above the bar
    profiler = StepProfiler(tc.profile if main_proc else None, run_dir / "profile", start=step)
    if profiler.skipped:
        log(f"train.profile={tc.profile}: the run resumes after step {step}, too late for the window (its first step "
            "compiles); not profiled")
    model.train()
    try:
        start_trackers(accelerator, cfg, run_dir, step)      # inside the try: end_training below closes them
        tokens_since, interval_losses, first_step_s, pending = 0, [], None, None
        clock = IntervalClock(device)

        def write_row() -> None:
            """The pending log row, read back from the GPU (the first wait for its step), if there is one."""
            nonlocal pending
            if pending is None:
                return
            (at, lr, values, tokens, mark), pending = pending, None
            guard.check(last_ckpt, warn)
            tps = tokens / clock.seconds(mark)
            loss_val, gnorm_val = values.tolist()
            row = {"step": at, "loss": loss_val, "lr": lr, "grad_norm": gnorm_val, "tokens_per_s": tps,
                   "mfu": flops_tok * tps / (peak * accelerator.num_processes) if peak else None,
                   "peak_mem_gb": peak_memory_gb(device), "tokens": at * tokens_per_step,
                   "epoch": sampler.epoch_of(at), "first_step_s": first_step_s, "bad_steps": guard.bad_steps}
            record(row, metrics, accelerator)
            bar.set_postfix(loss=f"{loss_val:.4f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}")
            result.update(loss=loss_val, tokens_per_s=tps)
        while step < tc.max_steps:
            lr = lr_at(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=device)
            for micro in range(tc.grad_accum):
                x, y = sampler.batch(step, micro)
                cu = None if sep is None else cu_seqlens(x, sep).to(device)
                if device.type == "cuda":       # a copy from pageable memory would wait for the GPU's queued work
                    x, y = x.pin_memory(), y.pin_memory()
                sync = micro == tc.grad_accum - 1
                with nullcontext() if sync else accelerator.no_sync(model):
                    # one graph per kind of micro-batch: DDP's syncing ones launch the all-reduce too; a step's
                    # first micro-batch writes the gradients rather than adding them into zeros
                    loss = graphed(x, y, key=sync if launched > 1 else None, first=micro == 0) \
                        if graphed else micro_step(*(t.to(device, non_blocking=True) for t in (x, y)), cu)
                loss_sum += loss / tc.grad_accum
            write_row()           # the last logged step's row: this step is queued behind it, so the GPU keeps busy
            # max_norm = inf measures the norm without clipping
            gnorm = accelerator.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or math.inf)
            if hasattr(gnorm, "full_tensor"):      # FSDP2's norm is a (replicated) DTensor: a plain tensor for logging
                gnorm = gnorm.full_tensor()
            gnorm = torch.as_tensor(gnorm, device=device).detach().float()
            guard.step(optimizer, step + 1, loss_sum, gnorm)     # no update when the loss or the norm is not finite
            if graphed is None:   # (a graphed step's first micro-batch writes the next step's gradients afresh)
                optimizer.zero_grad(set_to_none=True)
            step += 1
            tokens_since += tokens_per_step
            interval_losses.append(loss_sum)
            bar.update(1)
            if first_step_s is None:
                first_step_s = time.time() - t_launch

            is_last = step == tc.max_steps
            # the row's numbers are reduced and copied out now, and read once the next step is queued (or before a
            # sync) without waiting for it
            if step % tc.log_interval == 0 or is_last:
                loss_mean = accelerator.reduce(finite_mean(interval_losses), reduction="mean")
                pending = (step, lr, HostCopy(torch.stack([loss_mean.float(), gnorm])), tokens_since, clock.mark())
                tokens_since, interval_losses = 0, []
            if summary := profiler.after_step(step):
                warn(f"steps {tc.profile}: {summary['step_ms']:.1f} ms a step, GPU busy {summary['busy']:.1%}, "
                     f"host gaps {summary['gap_ms']:.1f} ms, exposed NCCL {summary['exposed_comm_ms']:.1f} ms "
                     f"(profiled): {run_dir / 'profile'}")
            evaluate_now = val_store is not None and ((tc.eval_interval and step % tc.eval_interval == 0) or is_last)
            save_now = (tc.ckpt_interval and step % tc.ckpt_interval == 0) or is_last
            if evaluate_now or save_now:
                write_row()

            if evaluate_now:
                guard.check(last_ckpt, warn)
                val = evaluate(model, val_store, cfg, accelerator)
                record({"step": step, "val_loss": val, "val_ppl": math.exp(min(val, 50))}, metrics, accelerator)
                if main_proc:
                    bar.write(f"step {step}: val loss {val:.4f}"
                              + (f" (entropy rate {entropy:.4f})" if entropy else ""))
                result["val_loss"] = val

            if save_now:
                guard.check(last_ckpt, warn)
                if guard.ok_to_save(step, last_ckpt, warn):
                    extra = {"config": to_dict(cfg), "bad_steps": guard.bad_steps}
                    last_ckpt = str(save_checkpoint(accelerator, run_dir, step, extra, tc.keep_ckpts, model))
    except Diverged as e:
        record({"step": e.step, "error": str(e)}, metrics, accelerator)
        raise
    except KeyboardInterrupt:
        where = (f"the last checkpoint is {last_ckpt}. Continue with the same command and --resume" if last_ckpt
                 else "no checkpoint was saved")
        raise Interrupted(f"interrupted at step {step}; {where}") from None
    finally:             # also on a UserError (a checkpoint or the metrics could not be written: it says what to do)
        bar.close()
        if metrics:
            metrics.close()
        if graphed:      # graphs that captured NCCL work go before end_training destroys the process group
            graphed.release()
        accelerator.end_training()      # the trackers' files closed and the process group destroyed, on every path
    if graphed:
        log(f"CUDA graphs: {graphed.replays} micro-batches replayed")
    result.update(steps=step, checkpoint=last_ckpt, entropy_rate=entropy,
                  graph_replays=graphed.replays if graphed else None)
    if "val_loss" in result and entropy is not None:
        log(f"final val loss {result['val_loss']:.4f} nats; source entropy rate {entropy:.4f}; "
            f"gap {result['val_loss'] - entropy:+.4f}")
    return result


if __name__ == "__main__":
    run_cli(main)
