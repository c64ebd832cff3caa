"""scripts/parity.py: its runs (eval/parity_runs.py: specs, commands, GPU placement) as pure functions, and end to
end on a tiny GLA with the synthetic source (its statistics: tests/eval/test_parity_stats.py).

End to end, one run over two seeds with a floor, launched in parallel and scored teacher-forced, gives every verdict:
naive re-specified with a logging setting (Δ exactly 0) is `equivalent`, naive initialised at 50 times the scale is
`different`, and naive with a thousand times the norm eps (Δ of one sign, spread far above the floor's) is
`undecided`. Its train.py runs go through this process (one start-up of torch instead of ten); a second, one-seed
run goes through the real command line and train.py processes."""
from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import threading

import pytest

from config import ConfigError
from eval import parity_report as report
from eval import parity_runs as runs
from eval import parity_stats as stats
from scripts.parity import FLA_WARMUP, REPO, cli, fla_warmup, main

TINY = ["--train.precision=fp32", "--train.progress=false", "--model.d_model=32", "--model.n_layers=1",
        "--model.n_heads=2", "--model.head_k_dim=16", "--model.head_v_dim=16", "--model.mlp_hidden=64",
        "--data.seq_len=32", "--train.micro_batch_size=4", "--train.eval_batches=2", "--train.log_interval=20",
        "--optim.warmup_steps=4", "--data.synthetic.train_tokens=20000", "--data.synthetic.eval_tokens=600"]


# --- the runs ---

def test_run_specs_and_floor_overrides():
    from config import ConfigError
    from ops import BackendError

    specs = runs.split_specs("naive,fused[chunk,state]@optim.lr=3e-4@model.norm_eps=1e-2,chunk")
    assert [s.text for s in specs] == ["naive", "fused[chunk,state]@optim.lr=3e-4@model.norm_eps=1e-2", "chunk"]
    assert specs[1].backend == "fused[chunk,state]" and specs[1].overrides == ("--optim.lr=3e-4", "--model.norm_eps=1e-2")
    assert runs.slug(specs[1].text) == "fused-chunk-state-optim-lr-3e-4-model-norm_eps-1e-2"
    for bad in ("naive@", "naive@lr", "naive@=3"):
        with pytest.raises(ConfigError, match="is not key=value"):
            runs.parse_spec(bad)
    with pytest.raises(ConfigError, match="parity sets train.seed"):
        runs.parse_spec("naive@train.seed=3")
    with pytest.raises(BackendError, match="only 'fused' takes components"):
        runs.parse_spec("chunk[state]@optim.lr=1")
    with pytest.raises(ConfigError, match="distinct run specs"):
        runs.split_specs("naive,naive")
    assert [s.text for s in runs.split_specs("fused")] == ["fused"]          # alone: its floor only
    assert runs.floor_overrides("configs/smoke.yaml", ["--train.micro_batch_size=4"], 4) == [
        "--train.micro_batch_size=1", "--train.grad_accum=4", "--train.eval_batches=64"]
    for split in (1, 3):
        with pytest.raises(ConfigError, match="must be 2 or more and divide it"):
            runs.floor_overrides("configs/smoke.yaml", ["--train.micro_batch_size=4"], split)


def test_the_train_commands(tmp_path):
    """Every spec at every seed with the seed and its own overrides last; the floor re-sums its spec; with --teacher
    the reference keeps a checkpoint per evaluation; a run folder already there stops the plan."""
    specs = runs.split_specs("naive,fused[state]@optim.lr=3e-4,chunk")
    plan = runs.plan_runs("configs/smoke.yaml", ["--data.seq_len=32"], specs, "fused[state]@optim.lr=3e-4", [7, 8],
                          10, 5, True, tmp_path)
    floor = "fused[state]@optim.lr=3e-4~"
    assert plan.floor == floor and plan.pairs == {specs[1].text: "naive", "chunk": "naive", floor: specs[1].text}
    assert list(plan.jobs) == [f"smoke_{n}_s{s}" for s in (7, 8) for n in
                               ("naive", "fused-state-optim-lr-3e-4", "chunk", "fused-state-optim-lr-3e-4_floor")]
    fused = plan.jobs["smoke_fused-state-optim-lr-3e-4_s8"]
    assert fused[1] == str(REPO / "train.py") and fused[-6:] == ["--train.seed=8", "--backend", "fused", "--fuse",
                                                                 "state", "--optim.lr=3e-4"]
    assert {"--train.max_steps=10", "--train.eval_interval=5", f"--train.out_dir={tmp_path}"} <= set(fused)
    assert plan.jobs["smoke_fused-state-optim-lr-3e-4_floor_s7"][-4:] == [
        "--optim.lr=3e-4", "--train.micro_batch_size=4", "--train.grad_accum=2", "--train.eval_batches=32"]
    assert plan.jobs["smoke_naive_s7"][-2:] == ["--train.ckpt_interval=5", "--train.keep_ckpts=3"]
    assert "--train.keep_ckpts=3" not in plan.jobs["smoke_chunk_s7"] and plan.data["chunk"] == ["--data.seq_len=32"]
    assert plan.runs["naive"][8] == tmp_path / "smoke_naive_s8"
    (tmp_path / "smoke_chunk_s8").mkdir()
    with pytest.raises(FileExistsError, match="smoke_chunk_s8 already exist"):
        runs.plan_runs("configs/smoke.yaml", [], specs, None, [7, 8], 10, 5, False, tmp_path)


def test_runs_go_round_robin_over_the_gpus(tmp_path, monkeypatch):
    assert runs.pick_device([], {}) is None and runs.pick_device(["0"], {"0": 3}) is None    # one device: shared
    busy = {}
    started = []
    for _ in range(5):
        d = runs.pick_device(["0", "1", "2"], busy)
        busy[d] = busy.get(d, 0) + 1
        started.append(d)
    assert started == ["0", "1", "2", "0", "1"]
    busy["2"] -= 1
    busy["0"] -= 1
    assert runs.pick_device(["0", "1", "2"], busy) == "2"      # the least busy, the first listed on a tie

    # train_all: all at once, each run's CUDA_VISIBLE_DEVICES; two at a time, never two on one device
    for limit, jobs in ((0, 4), (2, 6)):
        lock, running, seen = threading.Lock(), {}, []
        gate = threading.Barrier(limit or jobs)     # the runs of a round all start before any ends

        def fake_run(cmd, env=None, stdout=None, stderr=None):
            d = env["CUDA_VISIBLE_DEVICES"]
            with lock:
                running[d] = running.get(d, 0) + 1
                seen.append((d, running[d]))
            gate.wait(timeout=10)
            with lock:
                running[d] -= 1
            return subprocess.CompletedProcess(cmd, 0)

        monkeypatch.setattr(runs.subprocess, "run", fake_run)
        runs.train_all({f"r{i}": ["x"] for i in range(jobs)}, tmp_path, limit, ["3", "5"])
        assert sorted(d for d, _ in seen) == sorted(["3", "5"] * (jobs // 2))
        assert max(n for _, n in seen) == (1 if limit else jobs // 2)

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert runs.visible_devices() == ["4", "6"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert runs.visible_devices() == ["0", "1"]


def test_settings_and_backends_are_checked_before_any_training(tmp_path, monkeypatch):
    """A typo in an option, an override or a run spec, or a backend this machine cannot run, fails at once with the
    remedy (a UserError: one `error:` line on the command line), not after the reference backend has trained."""
    from config import ConfigError
    from ops import BackendError

    def unreachable(*args, **kwargs):
        raise AssertionError("a training started before the settings were checked")

    monkeypatch.setattr(subprocess, "run", unreachable)
    monkeypatch.setattr(subprocess, "Popen", unreachable)
    base = ["--config", "configs/smoke.yaml", "--out", str(tmp_path / "p")]
    with pytest.raises(ConfigError, match="unknown option '--tolerence': did you mean --tolerance"):
        main(base + ["--tolerence", "0.1"])
    with pytest.raises(ConfigError, match="unknown option '--floor': did you mean --floor-backend"):
        main(base + ["--floor", "--teacher"])
    with pytest.raises(ConfigError, match="'train.max_stepz'.*did you mean 'max_steps'"):
        main(base + ["--train.max_stepz=3"])
    with pytest.raises(ConfigError, match="'model.nrom_eps'.*did you mean 'norm_eps'"):
        main(base + ["--backends", "naive,naive@model.nrom_eps=1"])
    with pytest.raises(ConfigError, match="parity sets train.max_steps for every run: pass --steps instead"):
        main(base + ["--train.max_steps", "30"])
    with pytest.raises(ConfigError, match="--seeds, --steps and --eval-interval must be 1 or more"):
        main(base + ["--seeds", "0"])
    with pytest.raises(ConfigError, match="alone compares nothing"):
        main(base + ["--backends", "naive", "--floor-backend", "none"])
    with pytest.raises(ConfigError, match="--floor-backend 'fla' is not one of --backends"):
        main(base + ["--floor-backend", "fla"])
    with pytest.raises(ConfigError, match="the floor splits the micro-batch"):
        main(base + ["--train.micro_batch_size=3"])
    with pytest.raises(BackendError, match="unknown backend 'nope' for op 'gla'"):
        main(base + ["--backends", "naive,nope"])
    with pytest.raises(BackendError, match=r"unknown fused component\(s\) warp"):
        main(base + ["--backends", "naive,fused[warp]"])
    assert not (tmp_path / "p").exists()


def test_a_bad_spec_is_one_error_line(tmp_path, monkeypatch):
    from utils.cli import run_cli

    monkeypatch.setattr(sys, "argv", ["scripts/parity.py", "--config", "configs/smoke.yaml", "--backends",
                                      "naive,naive@lr", "--out", str(tmp_path / "p")])
    with pytest.raises(SystemExit) as e:
        run_cli(cli)
    assert e.value.code == "error: run spec 'naive@lr': 'lr' is not key=value (e.g. naive@model.norm_eps=1e-2)"


# --- end to end ---

@pytest.fixture
def trains_in_process(monkeypatch):
    """train.py's runs and the test split's scoring (eval/perplexity.py) in this process, one at a time, with the same arguments (their output into the run's log): a
    torch start-up per run is most of a tiny run's time."""
    import train

    lock, real = threading.Lock(), subprocess.run

    from eval import perplexity

    mains = {str(REPO / "train.py"): train.main, str(REPO / "eval" / "perplexity.py"): perplexity.main}

    def run(cmd, env=None, stdout=None, stderr=None, **kwargs):
        if cmd[0] != sys.executable or cmd[1] not in mains:
            return real(cmd, env=env, stdout=stdout, stderr=stderr, **kwargs)
        with lock, contextlib.redirect_stdout(stdout or sys.stdout), contextlib.redirect_stderr(stdout or sys.stderr):
            mains[cmd[1]](cmd[2:])
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(runs.subprocess, "run", run)


def test_every_verdict_in_one_run(tmp_path, trains_in_process):
    same, wild, eps = "naive@train.log_interval=5", "naive@model.init_std=1.0", "naive@model.norm_eps=1e-3"
    result = main(["--config", "configs/smoke.yaml", "--backends", f"naive,{same},{wild},{eps}", "--seeds", "2",
                   "--steps", "8", "--eval-interval", "4", "--parallel", "3", "--teacher", "--out", str(tmp_path),
                   f"--data.cache_dir={tmp_path / 'cache'}", *TINY])
    assert result["seeds"] == [1337, 1338] and result["floor"] == "naive~" and result["exit_status"] == 1
    c = result["compared"]
    floor = c["naive~"]
    # re-summed: it moves by rounding alone, at one seed at least (a seed may round back to the same fp32 loss)
    assert floor["against"] == "naive" and all(abs(d) < 1e-4 for d in floor["deltas"]), floor
    assert any(d != 0 for d in floor["deltas"]), floor
    assert c[same]["deltas"] == [0.0, 0.0] and c[same]["verdict"] == "equivalent" and c[same]["spread_ok"]
    assert c[wild]["verdict"] == "different" and c[wild]["lo"] > 1, c[wild]
    assert c[eps]["verdict"] == "undecided" and c[eps]["lo"] < 0 < c[eps]["hi"] and not c[eps]["spread_ok"], c[eps]
    assert c[eps]["seeds_to_decide"][0] > 2 and "seeds would decide" in c[eps]["reason"]

    # every run at every seed in its own folder; the floor splits the micro-batch; the seeds differ
    for folder in ("smoke_naive_s1337", "smoke_naive-train-log_interval-5_s1338", "smoke_naive-model-init_std-1-0_s1337",
                   "smoke_naive_floor_s1338"):
        assert (tmp_path / folder / "eval_test.json").is_file() and (tmp_path / f"{folder}.log").is_file()
    cfg = (tmp_path / "smoke_naive_floor_s1338" / "config.yaml").read_text()
    assert "micro_batch_size: 2" in cfg and "grad_accum: 2" in cfg and "eval_batches: 4" in cfg and "seed: 1338" in cfg
    r = result["runs"]
    assert r["naive"]["seeds"][1337]["final_val_loss"] != r["naive"]["seeds"][1338]["final_val_loss"]
    assert list(r["naive"]["seeds"][1337]["val_loss"]) == [4, 8] and math.isfinite(r[wild]["val_slope_mean"])
    assert r["naive"]["seeds"][1337]["test"]["token_ppl"] > 1

    # the window SE: 0 for identical runs; for the wild one a warning with the windows that would do
    assert c[same]["window_se"] == 0 and c[same]["windows"] == 8 and c[same]["windows_needed"] is None
    assert c[wild]["window_se"] > stats.WINDOW_SE_TARGET and c[wild]["windows_needed"] > 8
    assert any(w.startswith(f"`{wild}` − `naive` at seed 1337: paired window SE") and "--train.eval_batches=" in w
               for w in result["warnings"]), result["warnings"]

    # teacher-forced, per seed and checkpoint: init_std and logging do not change the function, the norm eps does;
    # a spec that changes the parameters' shapes cannot be scored on the reference's weights
    for seed in (1337, 1338):
        t = result["teacher"][seed]
        assert list(t["naive"]["delta"]) == [4, 8] and t["naive"]["pass"] and t[same]["pass"] and t[wild]["pass"]
        assert set(t[same]["delta"].values()) == set(t[wild]["delta"].values()) == {0.0}
        assert not t[eps]["pass"] and all(d != 0 for d in t[eps]["delta"].values())
    wider = "naive@model.mlp_hidden=32"
    skip = runs.teacher_forced(tmp_path / "smoke_naive_s1337", [runs.parse_spec(s) for s in ("naive", wider)],
                               [f"--data.cache_dir={tmp_path / 'cache'}"], 1e-4)
    assert skip["naive"]["pass"] and "other shapes" in skip[wider]["skipped"]

    md = (tmp_path / "parity.md").read_text()
    assert f"| `{wild}` |" in md and "**different**" in md and "| equivalent |" in md and "| undecided: " in md
    assert "`naive~` − `naive` (floor)" in md and "Pass: every |Δ| ≤ 0.0001" in md and "**FAIL**" in md and "Command: `python scripts/parity.py" in md
    saved = json.loads((tmp_path / "parity.json").read_text())
    assert saved["compared"][same]["verdict"] == "equivalent" and saved["exit_status"] == 1
    assert (tmp_path / "parity.png").stat().st_size > 0


def test_a_failed_run_is_left_out_and_the_rest_is_reported(tmp_path, trains_in_process, monkeypatch):
    """One training run fails and one scoring job fails once (as concurrent scorers running out of GPU memory do):
    the others are still trained, scored and compared over the seeds they finished, the failed scoring is run again
    on its own, the report names what was left out, and the exit status is 1."""
    inner, scored = runs.subprocess.run, []
    lost, flaky = "smoke_naive-train-log_interval-5_s1338", str(tmp_path / "smoke_naive_s1337" / "eval_test.json")

    def run(cmd, **kwargs):
        if flaky in cmd:
            scored.append(cmd)
        if f"--train.name={lost}" in cmd or len(scored) == 1 and flaky in cmd:
            return subprocess.CompletedProcess(cmd, 1)
        return inner(cmd, **kwargs)

    monkeypatch.setattr(runs.subprocess, "run", run)
    same = "naive@train.log_interval=5"
    result = main(["--config", "configs/smoke.yaml", "--backends", f"naive,{same}", "--seeds", "2", "--steps", "4",
                   "--eval-interval", "4", "--parallel", "2", "--out", str(tmp_path),
                   f"--data.cache_dir={tmp_path / 'cache'}", *TINY])
    assert result["exit_status"] == 1
    assert list(result["runs"][same]["seeds"]) == [1337] and result["compared"][same]["deltas"] == [0.0]
    assert result["compared"]["naive~"]["n"] == 2 and result["window_seed"] == 1337
    assert any(w.startswith(f"`{same}` at seed 1338 failed and is left out") for w in result["warnings"])
    assert len(scored) == 2 and result["runs"]["naive"]["seeds"][1337]["test"]["token_ppl"] > 1   # the second try
    assert "failed and is left out" in (tmp_path / "parity.md").read_text()


def test_the_command_line(tmp_path):
    """The script as typed, training in train.py processes one after the other: one seed decides nothing (exit 2),
    without a floor the report says so, and a warm-up as long as the run is a warning."""
    r = subprocess.run([sys.executable, "scripts/parity.py", "--config", "configs/smoke.yaml", "--backends",
                        "naive,naive@train.log_interval=1", "--seeds", "1", "--floor-backend", "none", "--steps", "2",
                        "--eval-interval", "2", "--out", str(tmp_path), f"--data.cache_dir={tmp_path / 'cache'}", *TINY,
                        "--train.eval_batches=1"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "== smoke_naive_s1337" in r.stdout and "naive@train.log_interval=1: undecided" in r.stdout
    saved = json.loads((tmp_path / "parity.json").read_text())
    c = saved["compared"]["naive@train.log_interval=1"]
    assert c["deltas"] == [0.0] and "one seed" in c["reason"] and saved["floor"] is None
    md = (tmp_path / "parity.md").read_text()
    assert "No floor was run" in md and "not annealed" in md


def fake_result(seeds: list[int], finals: dict[str, list[float]], **over) -> dict:
    """A finished parity result as parity.json holds it (JSON keys are strings): naive, fused and the floor."""
    runs_ = {name: {"seeds": {str(s): {"final_val_loss": v, "val_slope": -1e-3, "val_loss": {"50": v + 1, "100": v},
                                      "train_loss": {"100": v}, "test": {"token_ppl": 2.0}}
                              for s, v in zip(seeds, vals)}} for name, vals in finals.items()}
    curves = {n: {"seeds": {int(s): r for s, r in c["seeds"].items()}} for n, c in runs_.items()}
    compared = report.compare(curves, {"fused": "naive", "fused~": "fused"}, "fused~", {}, 0.01)
    return {"config": "configs/smoke.yaml", "steps": 100, "tolerance": 0.01, "reference": "naive", "floor": "fused~",
            "seeds": seeds, "runs": runs_, "compared": compared, "device": "cpu", "warnings": [],
            "overrides": [f"--train.seed={seeds[0]}", "--data.cache_dir=/x"], **over}


def test_merge_pools_disjoint_seeds_and_recomputes_the_verdict(tmp_path):
    """Three seeds cannot decide; the same protocol's next three, pooled, can: the verdict is recomputed from all
    six Δs. Tests of another protocol or with a shared seed are refused, naming why."""
    a = fake_result([1, 2, 3], {"naive": [4.0, 4.1, 4.2], "fused": [4.008, 4.094, 4.205],
                                "fused~": [4.014, 4.087, 4.209]})
    b = fake_result([4, 5, 6], {"naive": [4.3, 4.4, 4.5], "fused": [4.302, 4.398, 4.501],
                                "fused~": [4.297, 4.404, 4.499]})
    assert a["compared"]["fused"]["verdict"] == "undecided"
    for i, r in enumerate((a, b)):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "parity.json").write_text(json.dumps(r))
    result = main(["--merge", str(tmp_path / "0"), str(tmp_path / "1" / "parity.json"), "--out", str(tmp_path / "m")])
    fused = result["compared"]["fused"]
    assert result["seeds"] == [1, 2, 3, 4, 5, 6] and fused["n"] == 6
    assert fused["deltas"] == pytest.approx([0.008, -0.006, 0.005, 0.002, -0.002, 0.001])
    assert fused["verdict"] == "equivalent" and result["exit_status"] == 0
    assert "1, 2, 3, 4, 5, 6" in (tmp_path / "m" / "parity.md").read_text() and (tmp_path / "m" / "parity.png").exists()
    other = fake_result([4, 5, 6], {"naive": [4.3] * 3, "fused": [4.3] * 3, "fused~": [4.3] * 3}, steps=200)
    (tmp_path / "1" / "parity.json").write_text(json.dumps(other))
    with pytest.raises(ConfigError, match="different protocols"):
        main(["--merge", str(tmp_path / "0"), str(tmp_path / "1"), "--out", str(tmp_path / "m")])
    with pytest.raises(ConfigError, match="share seeds \\[1, 2, 3\\]"):
        main(["--merge", str(tmp_path / "0"), str(tmp_path / "0"), "--out", str(tmp_path / "m")])
    with pytest.raises(ConfigError, match="--merge needs --out"):
        main(["--merge", str(tmp_path / "0")])
    with pytest.raises(ConfigError, match="trains nothing: drop --train.seed=3"):
        main(["--merge", str(tmp_path / "0"), "--out", str(tmp_path / "m"), "--train.seed=3"])


def test_a_rate_left_at_the_configs_for_a_smaller_batch_is_a_warning():
    """gla_125m trains 65,536 tokens a step at 3e-4; parity's 8,192 at that rate gets the square-root rule's 1.06e-4
    as a warning, and none once --optim.lr is set or the batch is the config's."""
    from config import load_config
    from scripts.parity import lr_warning

    cfg = load_config("configs/gla_125m.yaml", [])
    small = ["--train.micro_batch_size=2", "--train.grad_accum=2"]
    (w,) = lr_warning(cfg, load_config("configs/gla_125m.yaml", small))
    assert "8,192 tokens a step, 0.125 of the config's 65,536" in w and "--optim.lr=0.00011" in w
    assert lr_warning(cfg, load_config("configs/gla_125m.yaml", small + ["--optim.lr=1e-4"])) == []
    assert lr_warning(cfg, cfg) == []


def test_an_fla_spec_gets_one_short_run_first_to_autotune(tmp_path):
    """The warm-up is the first fla run's own command (its shapes, data and seed) cut to two steps with an
    evaluation after each, under a name of its own; a test without fla has none."""
    specs = runs.split_specs("naive,fla,fused")
    plan = runs.plan_runs("configs/smoke.yaml", [], specs, "fla", [7, 8], 10, 5, False, tmp_path)
    warm = fla_warmup(plan, specs)
    first_fla = plan.jobs[plan.runs["fla"][7].name]
    assert list(warm) == [FLA_WARMUP] and warm[FLA_WARMUP][:len(first_fla)] == first_fla
    assert warm[FLA_WARMUP][len(first_fla):] == [f"--train.name={FLA_WARMUP}", "--train.max_steps=2",
                                                 "--train.eval_interval=1"]
    assert FLA_WARMUP not in plan.jobs
    specs = runs.split_specs("naive,fused")
    assert fla_warmup(runs.plan_runs("configs/smoke.yaml", [], specs, None, [7], 10, 5, False, tmp_path / "b"),
                      specs) == {}
