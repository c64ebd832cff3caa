"""Where does chunked linear attention overtake softmax attention? The 125M configs' token mixers over T.

    python scripts/bench_crossover.py                          # T = 512 … 16384 at 16,384 tokens per call
    python scripts/bench_crossover.py --lengths 1024,4096 --backends fused,fla

At WikiText-103's block sizes (T = 1–2 k) softmax attention with FlashAttention is expected to be the faster
mixer, with the crossover near 2–4 k tokens; that is reported, not tuned away. Every row is one layer's mixer op
at the same number of tokens per call (B = tokens / T), so a linear op's work stays the same while softmax
attention's grows with T (at large T the linear ops' B·H programs may no longer fill the GPU, which shows in
their times). The 125M configs all have d = 768:

    attention    gpt2_124m    H12 D64              SDPA as the model calls it; SDPA held to FlashAttention-2
    gla          gla_125m     H12 K = V = 64
    gated_delta  gdn_125m     H6  K = V = 128
    ssd          mamba2_130m  H24 P64 N128 G1

Only the mixer is timed: the projections around it differ by family, not by T. Each linear backend goes through the
runner of scripts/bench_ops.py (bench/runner.py: inputs from the op's builder, checked against the fp32 naive oracle
before it is timed, naive timed too), and FlashAttention-2 is checked against SDPA's default. Times are bench_ms
medians (utils/timing.py), forward and forward+backward, bf16. fla's kernels autotune at first use: minutes per op
on the H100, so a run with the fla backend spends that long before its first fla row. Writes
<out>/crossover.{md,json,png} (default out runs/bench), after every length so that a cut-off run keeps what it
measured.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.cases import Case, Options
from bench.report import DEFAULT_OUT, environment
from bench.runner import force_fla_backward, rel_err, run_case
from ops import BACKENDS, BackendError, get_op, list_backends
from utils.timing import bench_ms

LINEAR = {"gla": lambda B, T: Case("gla", "gla_125m", dict(B=B, T=T, H=12, K=64, V=64)),
          "gated_delta": lambda B, T: Case("gated_delta", "gdn_125m", dict(B=B, T=T, H=6, K=128, V=128)),
          "ssd": lambda B, T: Case("ssd", "mamba2_130m", dict(B=B, T=T, H=24, P=64, G=1, N=128))}
ATTENTION = ("sdpa", "sdpa-fa2")    # SDPA's default choice (cuDNN on the H100), and FlashAttention-2 alone
BASELINE = "sdpa"
TOLERANCE = 5e-3                    # FlashAttention-2 against SDPA's default, output and every gradient (bf16)


def attention_rows(B: int, T: int, H: int = 12, D: int = 64) -> list[dict]:
    """gpt2_124m's attention op ([B, T, H, D], causal, inputs from its builder), as SDPA picks its kernel and
    held to FlashAttention-2, which is checked against the first."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ops.attention.naive import make_inputs

    attention = get_op("attention", "naive")
    kw = make_inputs(dict(B=B, T=T, H=H, D=D), torch.bfloat16, "cuda", seed=T)
    args = [kw["q"], kw["k"], kw["v"]]
    do = torch.randn(B, T, H, D, device="cuda", generator=torch.Generator("cuda").manual_seed(T + 1)).bfloat16()
    rows, ref = [], None
    for variant in ATTENTION:
        def fn():
            if variant == "sdpa-fa2":
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return attention(*args)
            return attention(*args)

        row = {"op": "attention", "shape": "gpt2_124m", "dims": dict(B=B, T=T, H=H, D=D), "backend": variant}
        try:
            out = fn()
        except RuntimeError as e:          # e.g. no FlashAttention-2 kernel for this GPU or dtype
            rows.append({**row, "status": "n/a", "why": str(e).splitlines()[0]})
            continue
        grads = torch.autograd.grad(out, args, do)
        if ref is None:
            ref, row["check"] = [out.float(), *(t.float() for t in grads)], "SDPA's default"
        else:
            errs = [rel_err(a, b) for a, b in zip([out, *grads], ref)]
            row["max_rel_err"] = max(errs)
            if not all(e <= TOLERANCE for e in errs):             # NaN fails too
                rows.append({**row, "status": "FAIL", "check": "FAIL: errors " + ", ".join(f"{e:.1e}" for e in errs)})
                continue
            row["check"] = f"ok ({max(errs):.1e} vs SDPA)"
        del out, grads
        row["fwd_ms"] = bench_ms(fn)
        row["fwdbwd_ms"] = bench_ms(lambda: torch.autograd.grad(fn(), args, do))
        rows.append({**row, "status": "ok"})
    return rows


def linear_rows(op: str, B: int, T: int, backends: list[str]) -> list[dict]:
    """The linear op's rows at (B, T): naive and each chosen backend, checked then timed by bench_ops' runner."""
    chosen = ["naive", *(b for b in list_backends(op) if b != "naive" and (not backends or b in backends))]
    opts = Options(chosen, [], [], torch.bfloat16)
    return [{**r, "backend": r["variant"]} for r in run_case(LINEAR[op](B, T), opts, torch.device("cuda"))]


def crossover(lengths: list[int], mine: list[float], base: list[float]) -> str:
    """The T at which `mine` (ms per length) drops below `base`, interpolated in log T between the two measured
    lengths that bracket it (log of the time ratio taken as linear in log T); '< first' / '> last' outside."""
    pts = [(T, math.log(m / b)) for T, m, b in zip(lengths, mine, base) if m == m and b == b]   # NaN: not measured
    if not pts:
        return "n/a"
    if pts[0][1] < 0:
        return f"< {pts[0][0]}"
    for (t0, r0), (t1, r1) in zip(pts, pts[1:]):
        if r1 < 0:
            x = math.log2(t0) + r0 / (r0 - r1) * (math.log2(t1) - math.log2(t0))
            return f"≈ {2 ** x:,.0f}"
    return f"> {pts[-1][0]}"


def series(rows: list[dict], lengths: list[int], key: str) -> dict[tuple[str, str], list[float]]:
    """(op, backend) → `key` per length, NaN where the row is missing or failed."""
    out: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        out.setdefault((r["op"], r["backend"]), [math.nan] * len(lengths))
        if r["status"] == "ok":
            out[(r["op"], r["backend"])][lengths.index(r["dims"]["T"])] = r[key]
    return out


def to_markdown(rows: list[dict], lengths: list[int], tokens: int, env: dict, command: str, notes: list[str]) -> str:
    """The report: forward+backward and forward tables, each linear row with its crossover T against each
    attention variant, then every check's largest error and every row that did not run."""
    lines = [f"# Linear attention against softmax attention over T — {env['date']}, {env['device']}", "",
             f"Command: `{command}`  ", f"torch {env['torch']}, triton {env['triton']}, fla {env['fla']}; bf16; "
             f"{tokens:,} tokens per call (B = {tokens:,} / T); do_bench medians in ms. The mixers of the 125M "
             "configs (d = 768): attention H12 D64, gla H12 K=V=64, gated_delta H6 K=V=128, ssd H24 P64 N128.", ""]
    lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    for key, title in (("fwdbwd_ms", "Forward+backward"), ("fwd_ms", "Forward")):
        s = series(rows, lengths, key)
        nan = [math.nan] * len(lengths)
        base = s.get(("attention", BASELINE), nan)
        lines += [f"## {title}", "", "| op | backend | " + " | ".join(f"T {T}" for T in lengths)
                  + "".join(f" | faster than {a} from T" for a in ATTENTION) + " |",
                  "|" + "---|" * (len(lengths) + 2 + len(ATTENTION))]
        for (op, backend), ms in s.items():
            cells = [("—" if m != m else f"{m:.3f}" + ("" if op == "attention" or b != b else f" ({b / m:.2f}×)"))
                     for m, b in zip(ms, base)]
            cross = ["" if op == "attention" else crossover(lengths, ms, s.get(("attention", a), nan))
                     for a in ATTENTION]
            lines.append(f"| {op} | {backend} | " + " | ".join(cells + cross) + " |")
        lines.append("")
    errs: dict[tuple[str, str], float] = {}
    for r in rows:
        if "max_rel_err" in r and r["status"] == "ok":
            errs[(r["op"], r["backend"])] = max(errs.get((r["op"], r["backend"]), 0.0), r["max_rel_err"])
    lines += ["Checked before timing, output and every input gradient, largest relative error over the lengths: "
              + "; ".join(f"{op}/{b} {e:.1e} against {'SDPA' if op == 'attention' else 'naive'}"
                          for (op, b), e in errs.items()) + " (the bound is 5e-3).", ""]
    unavailable = {(r["op"], r["backend"]): r["why"] for r in rows if r["status"] == "n/a"}   # once, not per T
    lines += [f"- {op}/{backend}: n/a, {why}" for (op, backend), why in unavailable.items()]
    lines += [f"- {r['op']}/{r['backend']} at T {r['dims']['T']}: {r.get('check') or 'FAIL'}"
              for r in rows if r["status"] == "FAIL"]
    lines += ["", f"(x×): {BASELINE}'s time ÷ this row's, so above 1 the linear op is faster. Each crossover is "
              "interpolated between the two measured lengths that bracket it (the log of the time ratio linear in "
              "log T); "
              f"{BASELINE} is SDPA's own choice of kernel, sdpa-fa2 SDPA held to FlashAttention-2."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], lengths: list[int], path: Path) -> None:
    """ms against T, forward and forward+backward, every row but naive's, log-log."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key in zip(axes, ("fwd_ms", "fwdbwd_ms")):
        for (op, backend), ms in series(rows, lengths, key).items():
            if backend != "naive":          # the PyTorch oracle: in the tables, off the plot's scale
                ax.plot(lengths, ms, marker="o", ls="-" if op == "attention" else "--", label=f"{op}/{backend}")
        ax.set(xscale="log", yscale="log", xlabel="T (tokens per call fixed)", ylabel="ms (median)",
               title=key.replace("_ms", "").replace("fwdbwd", "fwd+bwd"))
        ax.set_xticks(lengths, [str(T) for T in lengths])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> list[dict]:
    """Check and time every length; returns the rows written to the report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="512,1024,2048,4096,8192,16384", help="comma-separated T")
    p.add_argument("--tokens", type=int, default=16384, help="B·T per call; every T must divide it")
    p.add_argument("--ops", default=",".join(LINEAR), help="comma-separated linear ops")
    p.add_argument("--backends", default="", help="linear ops' backends besides naive (default: all)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder for crossover.{{md,json,png}} (default "
                   f"{DEFAULT_OUT})")
    args = p.parse_args(argv)
    try:
        lengths = sorted({int(t) for t in args.lengths.split(",")})
    except ValueError:
        p.error(f"--lengths {args.lengths!r}: expected comma-separated integers, e.g. 512,1024,2048")
    if lengths[0] < 1:
        p.error("--lengths: every T must be at least 1")
    if bad := [T for T in lengths if args.tokens % T]:
        p.error(f"--tokens {args.tokens} is not a multiple of T = {', '.join(map(str, bad))}")
    if unknown := sorted(set(args.ops.split(",")) - set(LINEAR)):
        p.error(f"unknown op(s) {', '.join(unknown)}; linear ops: {', '.join(LINEAR)}")
    if args.backends and (unknown := sorted(set(args.backends.split(",")) - set(BACKENDS))):
        p.error(f"unknown backend(s) {', '.join(unknown)}; backends: {', '.join(BACKENDS)}")
    if not torch.cuda.is_available():
        sys.exit("error: the crossover benchmark times GPU kernels; run it on a CUDA machine")
    with_fla = not args.backends or "fla" in args.backends.split(",")
    notes = [n for n in [force_fla_backward() if with_fla else None] if n]
    env = environment(torch.device("cuda"))
    env["device"] = env.get("gpu")
    stem = args.out / "crossover"
    stem.parent.mkdir(parents=True, exist_ok=True)
    command = ("python scripts/bench_crossover.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    rows: list[dict] = []

    def record(row: dict) -> None:
        rows.append(row)
        print(f"T {row['dims']['T']:>6} {row['op']:>11} {row['backend']:<8} {row['status']:<4} "
              + (f"fwd {row['fwd_ms']:.3f}  fwd+bwd {row['fwdbwd_ms']:.3f} ms" if row["status"] == "ok"
                 else str(row.get("why") or row.get("check", ""))), flush=True)

    for T in lengths:
        B = args.tokens // T
        for row in attention_rows(B, T):
            record(row)
        for op in args.ops.split(","):
            for row in linear_rows(op, B, T, args.backends.split(",") if args.backends else []):
                record(row)
        torch.cuda.empty_cache()
        write_results(rows, lengths, args.tokens, env, command, notes, stem)
    print(stem.with_suffix(".md").read_text())
    return rows


def write_results(rows: list[dict], lengths: list[int], tokens: int, env: dict, command: str, notes: list[str],
                  stem: Path) -> None:
    """<stem>.md, .json and .png, rewritten after every length."""
    stem.with_suffix(".md").write_text(to_markdown(rows, lengths, tokens, env, command, notes))
    stem.with_suffix(".json").write_text(json.dumps({"env": env, "command": command, "notes": notes,
                                                     "tokens": tokens, "rows": rows}, indent=1, default=str))
    plot(rows, lengths, stem.with_suffix(".png"))


if __name__ == "__main__":
    try:
        main()
    except BackendError as e:
        sys.exit(f"error: {e}")
