"""The runner: every variant of a case checked against its oracle (output and every input gradient, relative
error against the family's bound), those that pass timed through utils/timing.py, one row each with the speedup
against the family's peer. FAMILIES maps each op to how its cases are prepared, bounded and timed."""
from __future__ import annotations

import contextlib
from dataclasses import replace

import torch

from bench.attention import GATE_BOUND, prepare_attention, prepare_ramla
from bench.cases import CHAINS, MIXERS, Case, Family, Options, Run, nbytes
from bench.chains import prepare_chain
from bench.mixers import prepare_mixer, prepare_state
from utils.timing import bench_ms, graph_ms, kernel_table, device_ms, on_gpu, peak_mb, profile_steps

FAMILIES = {
    **{op: Family(prepare_mixer, peer="fla") for op in MIXERS},
    "state": Family(prepare_state, peer="fla", warmup=10, rep=50),
    **{op: Family(prepare_chain, peer="naive", bound_from="naive", graph=True) for op in CHAINS},
    "ramla": Family(prepare_ramla, peer="sdpa", bound_from="plain MLA on SDPA (sets the bound)",
                    overrides={"dalpha": GATE_BOUND}, graph=True),
    "attention": Family(prepare_attention, peer="naive", tol=2e-3, graph=True),
}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in fp64; NaN anywhere gives NaN, which fails every bound."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def evaluate(run: Run, dys: list | None = None) -> tuple[list, list, list, list]:
    """The run's outputs, its leaves' gradients for the upstream gradients dys (drawn here, seeded, when None),
    its separate backward's outputs, and the dys used."""
    with run.context():
        outs = tuple(run.forward())
        if dys is None:
            g = torch.Generator(device=outs[0].device).manual_seed(1)
            dys = [torch.randn(o.shape, generator=g, device=o.device) for o in outs]
        grads = torch.autograd.grad(outs, run.leaves, [dy.to(o.dtype) for dy, o in zip(dys, outs)]) \
            if run.leaves else ()
        bwd = tuple(run.backward()) if run.backward is not None else ()
    return [o.detach() for o in outs], list(grads), list(bwd), dys


def check_runs(runs: dict, oracles: dict) -> dict:
    """label → {name: relative error} against the run's oracle, or an exception; the oracles run once each. An
    oracle that runs out of memory raises (the caller checks at B = 1 instead)."""
    refs, out = {}, {}
    for label, run in runs.items():
        if isinstance(run, str) or not run.checked:
            continue
        if run.oracle not in refs:
            with torch.no_grad() if not oracles[run.oracle].leaves else contextlib.nullcontext():
                o, g, b, dys = evaluate(oracles[run.oracle])
            refs[run.oracle] = ([t.float() for t in o], [t.float() for t in g], [t.float() for t in b], dys)
        ref_o, ref_g, ref_b, dys = refs[run.oracle]
        try:
            o, g, b, _ = evaluate(run, dys)
            n_o, n_l = len(o), len(run.leaves)
            names = run.names[:n_o] + ["d" + n for n in run.names[n_o:n_o + n_l]] + run.names[n_o + n_l:]
            out[label] = {n: rel_err(x, y) for n, x, y in zip(names, [*o, *g, *b], [*ref_o, *ref_g, *ref_b])}
            del o, g, b
        except (RuntimeError, ValueError, TypeError) as e:     # out of memory, or a kernel this machine lacks
            out[label] = e
    return out


def bounds_for(family: Family, errs: dict, bound_errs: dict | None) -> dict:
    """name → bound: the family's flat tolerance, or 2 × the bound run's error on that name (its largest where it
    has no such name) + 1e-3; overrides win."""
    out = {}
    for name in errs:
        if name in family.overrides:
            out[name] = family.overrides[name]
        elif bound_errs:
            out[name] = 2 * bound_errs.get(name, max(bound_errs.values())) + 1e-3
        else:
            out[name] = family.tol
    return out


def measure(run: Run, family: Family, profile: bool) -> dict:
    """Times, throughput, peak memory (and with profile, the kernel table) of a run that passed its check."""
    row = {}
    with run.context():
        outs = tuple(run.forward())
        # a generator of its own: a CUDA-graph capture that failed leaves the default generator unusable
        g = torch.Generator(device=outs[0].device).manual_seed(1)
        dys = [torch.randn(o.shape, generator=g, device=o.device).to(o.dtype) for o in outs]
        out_bytes = nbytes(outs)
        del outs

        def fwd_bwd():
            return torch.autograd.grad(run.forward(), run.leaves, dys)
        second = fwd_bwd if run.leaves else run.backward
        row["fwd_ms"] = bench_ms(run.forward, family.warmup, family.rep)
        fwd_bytes = nbytes(run.reads) + out_bytes
        row["fwd_tflops"] = run.flops[0] / row["fwd_ms"] / 1e9
        row["fwd_gbs"] = fwd_bytes / row["fwd_ms"] / 1e6
        if second is not None:
            key = "fwdbwd" if run.leaves else "bwd"
            row[f"{key}_ms"] = ms = bench_ms(second, family.warmup, family.rep)
            if run.leaves:
                more = nbytes(run.reads) + 2 * out_bytes + nbytes(run.leaves)
                row["fwdbwd_gbs"] = (fwd_bytes + more) / ms / 1e6
            else:
                row["bwd_gbs"] = (nbytes(run.bwd_reads) + nbytes(run.backward())) / ms / 1e6
            if run.flops[1] is not None:
                row[f"{key}_tflops"] = run.flops[1] / ms / 1e9
        whole = fwd_bwd if run.leaves else run.forward if run.backward is None else \
            (lambda: (run.forward(), run.backward()))
        if family.graph and run.graph:
            try:
                row["graph_ms"] = graph_ms(whole, family.rep)
            except RuntimeError as e:            # a call that cannot be captured keeps its eager times
                cause = e.__context__ or e           # what broke the capture, not capture_end's own error
                row["graph_error"] = f"{type(cause).__name__}: {str(cause).splitlines()[0][:120]}"
        row["peak_mb"] = peak_mb(whole)
        if profile:
            steps = 5 if on_gpu() else 1              # without a GPU the code path is what is checked, not the time
            prof = profile_steps(whole, steps=steps, warmup=3 if on_gpu() else 0)
            row["kernel_ms"] = device_ms(prof, steps)
            row["kernel_table"] = kernel_table(prof)
    return {k: v for k, v in row.items() if v is not None}


def saved_bytes(run: Run) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of one forward, the inputs' not counted.
    Measured after every run of a case is timed: a forward under saved_tensors_hooks that is never run backward
    leaves its inputs' gradient accumulators (bound to the default stream) alive, and a later CUDA-graph capture
    using the same inputs then fails (the backward would make the default stream wait on the capturing one)."""
    seen = {t.untyped_storage().data_ptr() for t in [*run.leaves, *run.reads] if isinstance(t, torch.Tensor)}
    total = 0

    def pack(t):
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run.forward()
    return total


def run_case(case: Case, opts: Options, device: torch.device, profile: bool = False) -> list[dict]:
    """Check every variant of one case against its oracle, then time those that pass; one row each."""
    family = FAMILIES[case.op]
    runs, oracles = family.prepare(case, opts, device)
    where = ""
    try:
        errors = check_runs(runs, oracles)
    except torch.OutOfMemoryError:           # the oracle's T×T scores: check the same kernels at B = 1
        del runs, oracles
        torch.cuda.empty_cache()
        small = replace(case, dims={**case.dims, "B": 1})
        errors = check_runs(*family.prepare(small, opts, device))
        torch.cuda.empty_cache()
        runs, oracles = family.prepare(case, opts, device)
        where = f"checked at B1 (the oracle ran out of memory at B{case.dims['B']}); "
    del oracles
    bound_errs = errors.get(family.bound_from) if isinstance(errors.get(family.bound_from), dict) else None
    rows = []
    for label, run in runs.items():
        row = {"op": case.op, "shape": case.shape, "dims": {**case.dims, **case.knobs}, "variant": label,
               "backend": run.backend if isinstance(run, Run) else label.split()[0]}
        if isinstance(run, str):
            rows.append({**row, "status": "n/a", "why": run})
            continue
        row["note"] = run.note
        if run.floor:
            row |= {k: v for k, v in zip(("floor_fwd_ms", "floor_fwdbwd_ms"), run.floor) if v is not None}
        err = errors.get(label)
        if isinstance(err, Exception):
            oom = isinstance(err, torch.OutOfMemoryError)
            rows.append({**row, "status": "OOM" if oom else "error", "why": f"{type(err).__name__}: {str(err)[:200]}"})
            continue
        if err is not None and label == family.bound_from:     # the reference of the bounds: its own error
            row |= {"errors": err, "max_rel_err": max(err.values(), default=0.0)}
            row["check"] = where + f"sets the bound ({row['max_rel_err']:.1e})"
        elif err is not None:
            bounds = bounds_for(family, err, bound_errs)
            row |= {"errors": err, "bounds": bounds, "max_rel_err": max(err.values(), default=0.0)}
            bad = [n for n, e in err.items() if not e <= bounds[n]]             # NaN fails too
            if bad:
                row["check"] = "FAIL: " + ", ".join(f"{n} {err[n]:.1e} > {bounds[n]:.1e}" for n in bad)
                rows.append({**row, "status": "FAIL"})
                continue
            row["check"] = where + f"ok ({row['max_rel_err']:.1e})"
        else:
            row["check"] = "not checked"
        if not run.timed:
            rows.append({**row, "status": "bound"})
            continue
        try:
            row |= measure(run, family, profile)
            row["status"] = "ok"
        except torch.OutOfMemoryError:
            row |= {"status": "OOM", "why": "out of memory while timing"}
        except RuntimeError as e:            # e.g. an SDPA kernel this GPU or dtype lacks
            row |= {"status": "error", "why": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        rows.append(row)
        if on_gpu():
            torch.cuda.empty_cache()
    for row in rows:
        run = runs[row["variant"]]
        if row["status"] == "ok" and run.leaves:
            with run.context():
                row["saved_mb"] = saved_bytes(run) / 1e6
    add_speedups(rows, family, runs)
    return rows


def add_speedups(rows: list[dict], family: Family, runs: dict) -> None:
    """peer ÷ this for each timed row, the peer being the row's own (Run.peer) or the first of the family's."""
    ok = {r["variant"]: r for r in rows if r["status"] == "ok"}
    default = next((r for r in rows if r["status"] == "ok" and r["backend"] == family.peer), None)
    for r in ok.values():
        run = runs[r["variant"]]
        peer = ok.get(run.peer) if run.peer else default
        if peer is None or peer is r or r["backend"] == "none":
            continue
        r["peer"] = peer["variant"]
        for key in ("fwd_ms", "fwdbwd_ms", "bwd_ms", "graph_ms"):
            if key in r and key in peer:
                r["speedup_" + key[:-3]] = peer[key] / r[key]


def force_fla_backward() -> str | None:
    """fla 0.6 refuses its gated backward on Hopper with Triton < 3.7.1 (a Triton miscompile, its issue #640): lift
    the refusal so that it can be timed, and return the note that says its backward numbers are timing-only."""
    try:
        import fla.ops.common.chunk_o as chunk_o
    except ImportError:
        return None
    if getattr(chunk_o, "TRITON_ABOVE_3_7_1", True) or not getattr(chunk_o, "IS_NVIDIA_HOPPER", False):
        return None
    chunk_o.TRITON_ABOVE_3_7_1 = True
    return ("fla's gated backward forced on (fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1, Triton < 3.7.1 on Hopper): "
            "its backward times are timing-only, though checked against the oracle like every row")
