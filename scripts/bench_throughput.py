"""How many tokens/s does each backend train my model at? Whole training steps per config and backend.

    python scripts/bench_throughput.py --configs gla_125m,gla_340m --backends naive,chunk,fla
    python scripts/bench_throughput.py --configs gla_125m --backends "chunk,fused[state],fused[chunk,state]"
    python scripts/bench_throughput.py --configs gpt2_124m --backends naive --batch 8 --seq-len 2048
    python scripts/bench_throughput.py --configs gla_340m --backends fused --modes eager,compiled
    python scripts/bench_throughput.py --configs gla_340m --backends fused,chunk --modes compiled,graphed --no-peer
    python scripts/bench_throughput.py --configs mamba2_370m --backends naive --batch 8 --checkpointing none,full

Every row is whole training steps (forward, backward, fused AdamW) on the same random batch, bf16
autocast on a GPU, measured in its own process so that every row starts alike: the time from launch
to the first finished step (compilation and autotuning included), then --warmup steps, then --steps
timed steps, their wall time between two synchronizations (utils/timing.py step_seconds). The peer row of
each config is the reference implementation at the same size: flash-linear-attention's own model class (GLA,
Gated DeltaNet, Mamba-2) or transformers' GPT2LMHeadModel with SDPA. A row that cannot run (no fla, out of
memory, time limit) says why. --checkpointing: our rows once per activation-checkpointing mode (train.py's
--train.activation_checkpointing; peak memory is the column to read). --modes: each row eager, compiled (our
models with torch.compile(fullgraph=True), as train.py's --train.compile; the peer with a plain torch.compile, graph
breaks allowed) and/or graphed (compiled, and each step's forward and backward replayed from one CUDA graph, as
train.py's --train.cuda_graphs; utils/cuda_graph.py). MFU: model FLOPs per token
(model/'s formula, the peer counted as our model of the same size) × tokens/s, against the GPU's datasheet bf16 peak
and against the peak a large bf16 GEMM reaches here (measured once per table).
Writes <out>/throughput.{md,json,png} (default out runs/bench).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

T_LAUNCH = time.time()
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.report import DEFAULT_OUT
from bench.runner import force_fla_backward
from ops import parse_backend, split_backends
from utils.cuda_graph import GraphedMicroBatch
from utils.timing import step_seconds, sync

REPO = Path(__file__).resolve().parents[1]
PEER = "peer"


def peer_model(cfg) -> torch.nn.Module:
    """The reference implementation of `cfg`'s family at the same size, as the peer row."""
    if cfg.family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        c = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.max_seq_len, n_embd=cfg.d_model, n_layer=cfg.n_layers,
                       n_head=cfg.n_heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        c._attn_implementation = "sdpa"
        return GPT2LMHeadModel(c)
    import fla.models as fm

    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                  tie_word_embeddings=cfg.tie_embeddings)
    if cfg.family == "gla":
        c = fm.GLAConfig(num_heads=cfg.n_heads, expand_k=cfg.n_heads * cfg.head_k_dim / cfg.d_model,
                         expand_v=cfg.n_heads * cfg.head_v_dim / cfg.d_model, intermediate_size=cfg.swiglu_hidden(),
                         attn_mode="chunk", **common)
        return fm.GLAForCausalLM(c)
    if cfg.family == "gated_deltanet":
        c = fm.GatedDeltaNetConfig(num_heads=cfg.n_heads, head_dim=cfg.head_k_dim, expand_v=cfg.head_v_dim / cfg.head_k_dim,
                                   conv_size=cfg.conv_size, intermediate_size=cfg.swiglu_hidden(), **common)
        return fm.GatedDeltaNetForCausalLM(c)
    if cfg.family == "mamba2":
        c = fm.Mamba2Config(head_dim=cfg.ssm_head_dim, state_size=cfg.ssm_state, expand=cfg.expand,
                            n_groups=cfg.ssm_groups, conv_kernel=cfg.conv_size, **common)
        return fm.Mamba2ForCausalLM(c)
    raise ValueError(f"no peer model for family {cfg.family!r}")


def worker(config: str, backend: str, batch: int, seq_len: int, warmup: int, steps: int,
           logits: bool = False, mode: str = "eager", compile_backend: str = "inductor",
           checkpointing: str = "none", compile_scope: str = "model") -> dict:
    """One row, in this process: build, train warmup + steps steps, measure. logits: our models' loss through
    the whole [B, T, vocab] logits (F.linear + F.cross_entropy) instead of ops/loss/'s chunked head.
    mode 'compiled': the model under torch.compile (fullgraph for ours) with `compile_backend`. checkpointing:
    utils.activation_checkpointing's mode for our models, applied before compile as train.py does. compile_scope
    'blocks': our compiled rows compile block by block (utils.compile.compile_blocks), as --train.compile_scope."""
    from config import load_config
    from model import build_model
    from utils.activation_checkpointing import checkpoint_activations
    from utils.compile import compile_blocks

    cfg = load_config(config).model
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    forced = force_fla_backward() if device == "cuda" and (backend == "fla" or backend == PEER and cfg.family != "gpt2") else None
    if backend == PEER:
        model = peer_model(cfg).to(device)
        fwd = torch.compile(model, backend=compile_backend) if mode != "eager" else model
        loss_of = lambda x: fwd(input_ids=x[:, :-1], labels=x[:, :-1]).loss  # noqa: E731  (HF shifts labels)
    else:
        cfg.backend, cfg.fuse = parse_backend(backend)
        model = build_model(cfg).to(device)
        model.check_trains()        # refused here, not as an exception inside Dynamo's trace
        checkpoint_activations(model, checkpointing)
        if mode != "eager" and compile_scope == "blocks":
            compile_blocks(model, compile_backend)
            fwd = model
        else:
            fwd = torch.compile(model, fullgraph=True, dynamic=False, backend=compile_backend) if mode != "eager" \
                else model
        loss_of = lambda x: fwd(x[:, :-1], x[:, 1:], return_logits=logits)[1]  # noqa: E731  (as train.py)
    with torch.device("meta"):
        flops_tok = build_model(cfg).flops_per_token(seq_len)   # the peer too: our model of its size
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    x = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), device=device)

    def forward_backward(x, _=None):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = loss_of(x)
        loss.backward()
        return loss.detach()
    graphed = GraphedMicroBatch(forward_backward, list(model.parameters())) if mode == "graphed" else None

    def step():
        loss = graphed(x, x, first=True) if graphed else forward_backward(x)     # a graph writes the gradients
        opt.step()
        if graphed is None:
            opt.zero_grad(set_to_none=True)
        return loss

    step()
    sync()
    first_step_s = time.time() - T_LAUNCH
    loss = None

    def timed_step():
        nonlocal loss
        loss = step()
    elapsed = step_seconds(timed_step, steps, warmup) * steps
    note = None
    if backend == PEER and cfg.family == "mamba2" and importlib.util.find_spec("mamba_ssm") is None:
        note = "fla's Mamba2 without mamba_ssm runs its PyTorch fallback: not a speed peer"
    note = "; ".join(n for n in (forced, note) if n) or None
    if mode != "eager" and compile_scope == "blocks" and backend != PEER:
        mode += " (blocks)"
    return {"config": Path(config).stem, "backend": backend, "mode": mode, "checkpointing": checkpointing,
            "status": "ok", "loss": loss.item(),
            "note": note, "flops_per_token": flops_tok,
            "params": sum(p.numel() for p in model.parameters()), "tokens_per_s": batch * seq_len * steps / elapsed,
            "step_ms": 1e3 * elapsed / steps, "first_step_s": first_step_s,
            "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None}


def error_line(stderr: str) -> str:
    """The line of a row's stderr that says what failed: our own error (a backend or config refused) where the
    traceback holds one, else the last exception line, else the last line. (torch.compile's failures end with
    hints, not with the cause.)"""
    lines = stderr.strip().splitlines()
    raised = [line for line in lines if re.match(r"[\w.]*(Error|Exception|Unsupported|Failed)\w*: ", line)]
    ours = [line for line in raised if "BackendError" in line or "ConfigError" in line]
    return (ours or raised or lines or ["(no output)"])[-1]


def run_row(config: str, backend: str, mode: str, args, timeout: float, checkpointing: str = "none") -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--configs", config, "--backends", backend,
           "--batch", str(args.batch), "--seq-len", str(args.seq_len), "--warmup", str(args.warmup),
           "--steps", str(args.steps), "--modes", mode, "--compile-backend", args.compile_backend,
           "--checkpointing", checkpointing, "--compile-scope", args.compile_scope] + (
               ["--logits"] if args.logits else [])
    row = {"config": Path(config).stem, "backend": backend, "mode": mode, "checkpointing": checkpointing}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout", "why": f"no result within {timeout:.0f} s (--row-timeout, --deadline)"}
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode or not lines:
        err = error_line(p.stderr)
        status = "OOM" if "OutOfMemory" in p.stderr else "n/a" if "BackendError" in p.stderr else "error"
        return {**row, "status": status, "why": err[:300]}
    return json.loads(lines[-1])


def to_markdown(rows: list[dict], env: dict, command: str, args) -> str:
    lines = [f"# Training throughput — {env['date']}, {env['device']}", "", f"Command: `{command}`  ",
             f"torch {env['torch']}, triton {env['triton']}, fla {env['fla']}; B{args.batch} T{args.seq_len}, "
             f"{'bf16 autocast, fused AdamW' if env['device'] != 'cpu' else 'fp32, AdamW (CPU)'}, {args.warmup} warm-up + "
             f"{args.steps} timed steps, one process per row. `peer` is fla's model class (GLA, Gated DeltaNet, "
             "Mamba-2) or transformers' GPT2LMHeadModel (SDPA) at the same size. Our rows' loss: "
             + ("PyTorch's head and cross-entropy over the whole logits (--logits)." if args.logits else
                "ops/loss/'s chunked head and cross-entropy, as train.py runs it."), "",
             f"MFU: model FLOPs/s ÷ the datasheet bf16 peak ({fmt_tflops(env.get('peak_flops'))}) and ÷ a large bf16 "
             f"GEMM's measured rate ({fmt_tflops(env.get('gemm_flops'))}). ÷ peer: against the peer in the same mode.",
             "", "| config | backend | mode | params | tokens/s | ÷ peer | MFU datasheet | MFU GEMM | step ms | peak GB | "
             "launch → first step s | status |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    peers = {(r["config"], r.get("mode")): r for r in rows if r["backend"] == PEER and r["status"] == "ok"}
    for r in rows:
        head = f"| {r['config']} | {r['backend']} | {label(r)} |"
        if r["status"] != "ok":
            lines.append(f"{head} | | | | | | | | {r['status']}: {r.get('why', '')} |")
            continue
        peer = peers.get((r["config"], r.get("mode", "eager").split(" (")[0]))
        ratio = f"{r['tokens_per_s'] / peer['tokens_per_s']:.2f}×" if peer else ""
        mem = f"{r['peak_mem_gb']:.1f}" if r["peak_mem_gb"] is not None else "—"
        mfu = [f"{r['flops_per_token'] * r['tokens_per_s'] / peak:.1%}" if peak else "—"
               for peak in (env.get("peak_flops"), env.get("gemm_flops"))]
        lines.append(f"{head} {r['params'] / 1e6:.1f}M | {r['tokens_per_s']:,.0f} | {ratio} | {mfu[0]} | {mfu[1]} | "
                     f"{r['step_ms']:.1f} | {mem} | {r['first_step_s']:.1f} | ok{'; ' + r['note'] if r.get('note') else ''} |")
    return "\n".join(lines) + "\n"


def label(r: dict) -> str:
    """The row's mode, with its activation checkpointing where there is any: 'eager', 'compiled, ckpt full'."""
    ckpt = r.get("checkpointing", "none")
    return r.get("mode", "eager") + ("" if ckpt == "none" else f", ckpt {ckpt}")


def fmt_tflops(x: float | None) -> str:
    return "n/a" if not x else f"{x / 1e12:,.0f} TFLOP/s"


def gemm_flops(n: int = 8192, reps: int = 10) -> float | None:
    """The bf16 FLOP/s of an n×n×n matrix product on this GPU (mean of `reps` after three warm-ups); None on a CPU."""
    if not torch.cuda.is_available():
        return None
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return 2 * n ** 3 / step_seconds(lambda: a @ b, reps, warmup=3)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(ok)), 4.5))
    ax.bar([f"{r['config']}\n{r['backend']}\n{label(r)}" for r in ok], [r["tokens_per_s"] for r in ok])
    ax.set(ylabel="tokens/s", title="training throughput")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="gla_125m", help="comma-separated presets (names under configs/ or paths)")
    p.add_argument("--backends", default="naive,chunk", help=f"comma-separated, e.g. chunk,fused[state]; '{PEER}' is added per config")
    p.add_argument("--no-peer", action="store_true", help="leave out the reference implementation's row")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--row-timeout", type=int, default=1200, help="seconds per row (fla autotunes for minutes)")
    p.add_argument("--deadline", type=int, default=0,
                   help="seconds for the whole table (0: none); rows not started by then are marked skipped")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder for throughput.{{md,json,png}} (default "
                   f"{DEFAULT_OUT})")
    p.add_argument("--logits", action="store_true",
                   help="our rows compute the loss through the whole logits (PyTorch's head + cross-entropy), as "
                        "before ops/loss/; for A/B runs of memory and speed")
    p.add_argument("--modes", help="comma-separated: eager, compiled, graphed (default: eager and compiled on a GPU, "
                                   "eager on a CPU)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend for compiled rows")
    p.add_argument("--compile-scope", default="model", choices=("model", "blocks"),
                   help="our compiled rows: the whole model as one graph, or block by block (--train.compile_scope)")
    p.add_argument("--checkpointing", default="none",
                   help="comma-separated activation-checkpointing modes of our rows: none, full, selective")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    configs = [c if c.endswith(".yaml") else str(REPO / "configs" / f"{c}.yaml") for c in args.configs.split(",")]
    modes = (args.modes or ("eager,compiled" if torch.cuda.is_available() else "eager")).split(",")
    if set(modes) - {"eager", "compiled", "graphed"}:
        p.error(f"--modes takes eager, compiled and/or graphed, got {args.modes!r}")
    if "graphed" in modes and args.warmup < 2:
        p.error("graphed rows capture their graph in the warm-up: pass --warmup 2 or more")
    if args.worker:
        print(json.dumps(worker(configs[0], args.backends, args.batch, args.seq_len, args.warmup, args.steps,
                                args.logits, modes[0], args.compile_backend, args.checkpointing,
                                args.compile_scope)))
        return []
    backends = split_backends(args.backends) + ([] if args.no_peer else [PEER])
    command = "python scripts/bench_throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])
    env = environment()
    stem = args.out / "throughput"
    stem.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    env["gemm_flops"] = gemm_flops()
    ckpts = args.checkpointing.split(",")
    if set(ckpts) - {"none", "full", "selective"}:
        p.error(f"--checkpointing takes none, full and/or selective, got {args.checkpointing!r}")
    for config, b, mode, ckpt in ((c, b, m, k) for c in configs for b in backends for m in modes
                                  for k in (["none"] if b == PEER else ckpts)):
        left = args.deadline - (time.time() - T_LAUNCH) if args.deadline else float("inf")
        if left < 30:
            rows.append({"config": Path(config).stem, "backend": b, "mode": mode, "checkpointing": ckpt,
                         "status": "skipped", "why": f"the table's --deadline {args.deadline} s had passed"})
        else:
            rows.append(run_row(config, b, mode, args, timeout=min(args.row_timeout, left), checkpointing=ckpt))
        r = rows[-1]
        done = (f"{r['tokens_per_s']:>10,.0f} tokens/s  peak {r['peak_mem_gb'] or 0:.1f} GB  first step "
                f"{r['first_step_s']:.1f} s" if r["status"] == "ok" else f"{r['status']}: {r.get('why', '')}")
        print(f"{r['config']:<16} {b:<6} {label(r):<20} {done}", flush=True)
        # after every row, so that a run cut short keeps what it measured
        stem.with_suffix(".md").write_text(to_markdown(rows, env, command.strip(), args))
        stem.with_suffix(".json").write_text(json.dumps({"env": env, "command": command, "rows": rows}, indent=1))
    plot(rows, stem.with_suffix(".png"))
    print(stem.with_suffix(".md").read_text())
    return rows


def environment() -> dict:
    import triton

    from utils.runinfo import fla_version, peak_flops

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    peak = peak_flops(torch.device("cuda"), "bf16") if torch.cuda.is_available() else None
    return {"device": device, "torch": torch.__version__, "triton": triton.__version__, "fla": fla_version(),
            "date": datetime.date.today().isoformat(), "peak_flops": peak}


if __name__ == "__main__":
    main()
