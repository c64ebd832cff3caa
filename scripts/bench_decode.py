"""How fast does each model generate? Decode tokens/s through the recurrent cache, beside the peer's own generate.

    python scripts/bench_decode.py --configs gla_340m,gdn_340m,mamba2_370m,gpt2_124m --backend fused
    python scripts/bench_decode.py --configs gla_340m --backend chunk --batches 1 --prompt 512 --new 128
    python scripts/bench_decode.py --configs gla_125m --lengths 512,2048,8192,32768 --no-peer

Per config: a P-token random prompt (--prompt, default 2048) at each batch size (--batches, default 1,64) is
prefilled once (model.prefill: the full-sequence forward on --backend), then N greedy tokens are decoded one step
at a time (--new, default 512; model.step, the decode ops of model.decode.DECODE_BACKEND, named in each row).
Decode tokens/s = B·N / (wall time of the N steps between two synchronizations); prefill is timed apart. The peer
row is the reference implementation at the same size with random weights: flash-linear-attention's model classes
(GLA, Gated DeltaNet, Mamba-2) or transformers' GPT2LMHeadModel, through their `generate` with the KV / recurrent
cache (greedy, no early stop); its decode time is generate(N) − generate(1), so its prefill is left out the same way.
Then the time per token at batch 1 after prompts of each --lengths (default 512,2048,8192): flat for the recurrent
families, growing for attention. A short warm-up generation at each batch size compiles (and autotunes) every
kernel before its timing. bf16 autocast on a GPU (fp32 weights, as eval/generate.py), fp32 on a CPU, where Triton
runs interpreted and times mean nothing.
Model overrides (--model.d_model=64 ...) apply to every config (the tests' toy sizes).
Writes <out>/decode.{md,json,png} (default out runs/bench), rewritten after every config.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.report import DEFAULT_OUT, environment
from config import load_config
from model import build_model
from model.decode import GraphedStep, graphable
from ops import BackendError, parse_backend
from utils.timing import sync

REPO = Path(__file__).resolve().parents[1]
PEER = "peer"
PEER_NAME = {"gla": "fla GLAForCausalLM", "gated_deltanet": "fla GatedDeltaNetForCausalLM",
             "mamba2": "fla Mamba2ForCausalLM", "gpt2": "transformers GPT2LMHeadModel"}


def timed(fn) -> float:
    """Wall seconds of fn() between two synchronizations."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def ours_decode(model, B: int, P: int, N: int, device: str) -> dict:
    """Prefill B random P-token prompts, then N greedy decode steps: the row's times. On a GPU the steps of the
    recurrent families replay one CUDA graph (model.decode.GraphedStep, as model.generate does); its capture is
    timed apart."""
    idx = torch.randint(0, model.cfg.vocab_size, (B, P), device=device)
    state = {}

    def prefill():
        state["logits"], state["cache"] = model.prefill(idx, capacity=P + N)

    def capture():
        cache = state["cache"]
        state["step"] = (GraphedStep(model, cache, state["logits"].argmax(-1)) if uses_graph(model, device)
                         else lambda t: model.step(t, cache))

    def decode():
        logits = state["logits"]
        for _ in range(N):
            logits = state["step"](logits.argmax(-1))

    prefill_s = timed(prefill)
    capture_s = timed(capture)
    decode_s = timed(decode)
    return {"prefill_s": prefill_s, "capture_s": capture_s, "decode_s": decode_s, "decode_tok_s": B * N / decode_s,
            "ms_per_token": 1e3 * decode_s / N}


def uses_graph(model, device: str) -> bool:
    """Whether our decode replays a CUDA graph here (model.generate's default)."""
    return device == "cuda" and graphable(model)


def peer_decode(peer, B: int, P: int, N: int, vocab: int, device: str) -> dict:
    """The peer's generate with its cache: generate(N) − generate(1) is its decode time for N − 1 tokens."""
    idx = torch.randint(0, vocab, (B, P), device=device)
    kw = dict(do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)
    prefill_s = timed(lambda: peer.generate(idx, max_new_tokens=1, min_new_tokens=1, **kw))
    total_s = timed(lambda: peer.generate(idx, max_new_tokens=N, min_new_tokens=N, **kw))
    if total_s <= prefill_s:
        raise RuntimeError(f"generate({N}) took {total_s:.3f} s, no longer than generate(1) ({prefill_s:.3f} s): "
                           "the timing is invalid (was the first call still compiling?)")
    decode_s = total_s - prefill_s
    return {"prefill_s": prefill_s, "decode_s": decode_s, "decode_tok_s": B * (N - 1) / decode_s,
            "ms_per_token": 1e3 * decode_s / max(N - 1, 1)}


def peer_warmup(peer, B: int, P: int, vocab: int, device: str) -> None:
    """generate(1) and generate(4) at the row's shape, untimed: the peer's kernels compiled and autotuned."""
    idx = torch.randint(0, vocab, (B, P), device=device)
    for n in (1, 4):
        peer.generate(idx, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True, eos_token_id=None,
                      pad_token_id=0)


def build_peer(cfg, device: str):
    """The peer model (scripts/bench_throughput.py's peer_model), or the reason it cannot run here."""
    if cfg.family == "gpt2" and cfg.attention != "mha":
        return None, "no peer implementation of RA+MLA"
    if cfg.family != "gpt2" and (importlib.util.find_spec("fla") is None or device != "cuda"):
        return None, "flash-linear-attention is not installed" if importlib.util.find_spec("fla") is None \
            else "flash-linear-attention's kernels need a CUDA GPU"
    from scripts.bench_throughput import peer_model

    return peer_model(cfg).to(device).eval(), None


def run_config(name: str, cfg, backend: str, args, device: str, record) -> None:
    """Every row of one config: ours and the peer at each batch size, then ours over the prompt lengths."""
    cfg.backend, cfg.fuse = parse_backend(backend)
    torch.manual_seed(0)
    model = build_model(cfg).to(device).eval()
    decode = ", ".join(f"{op}: {b}" for op, b in model.decode_backends().items()) + (
        ", CUDA graph" if uses_graph(model, device) else "")
    peer, why = build_peer(cfg, device) if args.peer else (None, "--no-peer")
    base = {"config": name, "family": cfg.family}
    positions = cfg.max_seq_len if cfg.family == "gpt2" else None
    amp = torch.autocast("cuda", torch.bfloat16) if device == "cuda" else nullcontext()
    with amp, torch.no_grad():
        for B in args.batches:
            ours_decode(model, B, args.prompt, 4, device)     # warm-up at this shape: kernels compiled and tuned
            fits = positions is None or args.prompt + args.new <= positions
            row = {**base, "model": "ours", "backend": backend, "decode": decode, "batch": B, "prompt": args.prompt,
                   "new": args.new}
            record({**row, "status": "ok", **ours_decode(model, B, args.prompt, args.new, device)} if fits else
                   {**row, "status": "n/a", "why": f"prompt + new > the {positions} learned positions"})
            prow = {**base, "model": PEER, "backend": PEER_NAME[cfg.family], "batch": B, "prompt": args.prompt,
                    "new": args.new}
            if peer is None or not fits:
                record({**prow, "status": "n/a", "why": why or f"prompt + new > the {positions} learned positions"})
                continue
            try:
                peer_warmup(peer, B, args.prompt, cfg.vocab_size, device)       # at this shape, as ours
                record({**prow, "status": "ok", **peer_decode(peer, B, args.prompt, args.new, cfg.vocab_size, device)})
            except (RuntimeError, torch.OutOfMemoryError) as e:         # the peer's failure is a row, not the end
                record({**prow, "status": "error", "why": str(e).splitlines()[0][:200]})
        ours_decode(model, 1, 16, 4, device)
        for P in args.lengths:
            row = {**base, "model": "ours", "backend": backend, "decode": decode, "batch": 1, "prompt": P,
                   "new": args.flat_new, "series": "flat"}
            if positions is not None and P + args.flat_new > positions:
                record({**row, "status": "n/a", "why": f"prompt + new > the {positions} learned positions"})
                continue
            record({**row, "status": "ok", **ours_decode(model, 1, P, args.flat_new, device)})
    del model, peer
    if device == "cuda":
        torch.cuda.empty_cache()


def to_markdown(rows: list[dict], env: dict, command: str, lengths: list[int]) -> str:
    where = env.get("gpu") or "CPU (fp32; Triton interpreted: times mean nothing)"
    lines = [f"# Decode throughput — {env['date']}, {where}", "", f"Command: `{command}`  ",
             f"torch {env['torch']}, triton {env['triton']}, fla {env['fla']}, commit {env.get('commit')}"
             f"{' (dirty)' if env.get('dirty') else ''}. Greedy decoding after one prefill; decode time only "
             "(see scripts/bench_decode.py); graph capture s: recording our CUDA-graph step, once per generation.", "",
             "| config | model | backend | decode ops | batch | prompt | new | prefill s | graph capture s | "
             "decode tokens/s | ms/token | ours ÷ peer |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    main = [r for r in rows if r.get("series") != "flat"]
    for r in main:
        peer = next((p for p in main if p["model"] == PEER and p["config"] == r["config"] and p["batch"] == r["batch"]
                     and p["status"] == "ok"), None)
        if r["status"] != "ok":
            lines.append(f"| {r['config']} | {r['model']} | {r['backend']} | {r.get('decode', '')} | {r['batch']} | "
                         f"{r['prompt']} | {r['new']} | {r['status']}: {r.get('why', '')} |  |  |  |  |")
            continue
        ratio = f"{r['decode_tok_s'] / peer['decode_tok_s']:.2f}×" if peer and r["model"] == "ours" else ""
        capture = f"{r['capture_s']:.3f}" if "capture_s" in r else ""
        lines.append(f"| {r['config']} | {r['model']} | {r['backend']} | {r.get('decode', '')} | {r['batch']} | "
                     f"{r['prompt']} | {r['new']} | {r['prefill_s']:.3f} | {capture} | {r['decode_tok_s']:,.1f} | "
                     f"{r['ms_per_token']:.3f} | {ratio} |")
    flat = [r for r in rows if r.get("series") == "flat"]
    if flat:
        lines += ["", "## ms per token at batch 1 after a prompt of P tokens", "",
                  "| config | backend | " + " | ".join(f"P = {P}" for P in lengths) + " |",
                  "|---|---|" + "---|" * len(lengths)]
        for cfg in dict.fromkeys(r["config"] for r in flat):
            cells = {r["prompt"]: (f"{r['ms_per_token']:.3f}" if r["status"] == "ok" else r["status"])
                     for r in flat if r["config"] == cfg}
            backend = next(r["backend"] for r in flat if r["config"] == cfg)
            lines.append(f"| {cfg} | {backend} | " + " | ".join(cells.get(P, "") for P in lengths) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], lengths: list[int], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    flat = [r for r in rows if r.get("series") == "flat" and r["status"] == "ok"]
    for cfg in dict.fromkeys(r["config"] for r in flat):
        pts = sorted((r["prompt"], r["ms_per_token"]) for r in flat if r["config"] == cfg)
        ax.plot([p for p, _ in pts], [m for _, m in pts], marker="o", label=cfg)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("ms per decoded token (batch 1)")
    ax.set_ylim(bottom=0)
    if flat:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(rows: list[dict], env: dict, command: str, lengths: list[int], stem: Path) -> None:
    stem.with_suffix(".md").write_text(to_markdown(rows, env, command, lengths))
    stem.with_suffix(".json").write_text(json.dumps({"env": env, "command": command, "rows": rows}, indent=1,
                                                    default=str))
    plot(rows, lengths, stem.with_suffix(".png"))


def ints(p: argparse.ArgumentParser, flag: str, text: str) -> list[int]:
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        p.error(f"{flag} {text!r}: expected comma-separated integers")
    if not out or min(out) < 1:
        p.error(f"{flag} {text!r}: every value must be at least 1")
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    """Measure every config; returns the rows written to the report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="gla_340m,gdn_340m,mamba2_370m,gpt2_124m",
                   help="comma-separated names in configs/ (or YAML paths)")
    p.add_argument("--backend", default="fused", help="our models' backend, e.g. fused, chunk, fused[state]")
    p.add_argument("--batches", default="1,64", help="comma-separated batch sizes")
    p.add_argument("--prompt", type=int, default=2048, help="prompt tokens P")
    p.add_argument("--new", type=int, default=512, help="decoded tokens N")
    p.add_argument("--lengths", default="512,2048,8192", help="prompt lengths of the per-token time series")
    p.add_argument("--flat-new", type=int, default=64, help="tokens decoded per length of that series")
    p.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True, help="time the peer models")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder for decode.{{md,json,png}} ({DEFAULT_OUT})")
    args, overrides = p.parse_known_args(argv)
    args.batches, args.lengths = ints(p, "--batches", args.batches), ints(p, "--lengths", args.lengths)
    if args.prompt < 1 or args.new < 2 or args.flat_new < 1:
        p.error("--prompt and --flat-new must be ≥ 1 and --new ≥ 2")
    if bad := [o for o in overrides if not o.startswith("--model.")]:
        p.error(f"unknown argument(s) {' '.join(bad)}; model overrides look like --model.d_model=64")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    env = environment(torch.device(device))
    stem = args.out / "decode"
    stem.parent.mkdir(parents=True, exist_ok=True)
    command = ("python scripts/bench_decode.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    rows: list[dict] = []

    def record(row: dict) -> None:
        rows.append(row)
        what = (f"decode {row['decode_tok_s']:,.1f} tokens/s, {row['ms_per_token']:.3f} ms/token, prefill "
                f"{row['prefill_s']:.3f} s" if row["status"] == "ok" else f"{row['status']}: {row.get('why', '')}")
        print(f"{row['config']:>14} {row['model']:<4} B {row['batch']:>3} P {row['prompt']:>6} {what}", flush=True)

    for name in args.configs.split(","):
        path = Path(name) if name.endswith((".yaml", ".yml")) else REPO / "configs" / f"{name}.yaml"
        cfg = load_config(path, overrides).model
        run_config(path.stem, cfg, args.backend, args, device, record)
        write_results(rows, env, command, args.lengths, stem)
    print(stem.with_suffix(".md").read_text())
    return rows


if __name__ == "__main__":
    try:
        main()
    except BackendError as e:
        sys.exit(f"error: {e}")
