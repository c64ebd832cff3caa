"""A bad step never lands (utils/stepguard.py): a step whose loss or gradient norm is not finite leaves the weights
and the optimizer state exactly as a run that never took it, is counted, logged and warned about, and
train.max_bad_steps consecutive ones stop the run (tests/test_train.py's divergence test: the stop and its
message). Faults are injected with a gradient hook, as tests/test_faults.py injects its faults: by patching."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

import train
from tests.helpers import reset_accelerate
from tests.test_activation_checkpointing import batch, fsdp2_shard, one_process_group, tiny_model
from tests.test_train import losses, tiny
from utils.stepguard import Diverged, StepGuard, finite_mean

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def test_a_skipped_step_equals_one_never_taken_and_the_streak_stops_the_run():
    """Fused AdamW (weight decay on) over five steps whose third gradient holds a NaN and fourth an inf, against
    the same optimizer that never takes those two steps: equal weights, moments and step counts; then
    `max_bad` bad steps in a row raise Diverged naming the checkpoint, and no checkpoint is saved mid-streak."""
    torch.manual_seed(0)
    grads = [torch.randn(3, 4) for _ in range(5)]
    grads[2][1, 2], grads[3][0, 0] = float("nan"), float("inf")
    model = torch.nn.Linear(4, 3, bias=False)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1, fused=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1, weight_decay=0.1, fused=True)
    guard, warnings = StepGuard(max_bad=3, scaler=False), []
    for i, g in enumerate(grads):
        model.weight.grad = g.clone()
        guard.step(opt, i + 1, torch.tensor(2.0), g.norm())
        if i not in (2, 3):
            ref.weight.grad = g.clone()
            ref_opt.step()
    guard.check("ckpt/step_4", warnings.append)
    assert guard.ok_to_save(5, "ckpt/step_4", warnings.append)        # step 5 was good: the streak is over
    assert torch.equal(model.weight, ref.weight)
    state, ref_state = opt.state_dict()["state"][0], ref_opt.state_dict()["state"][0]
    assert state.keys() == ref_state.keys() and all(torch.equal(state[k], ref_state[k]) for k in state)
    assert state["step"].item() == 3
    assert [w.split(";")[0] for w in warnings] == ["warning: step 3: loss 2 / grad norm nan is not finite",
                                                   "warning: step 4: loss 2 / grad norm inf is not finite"]
    assert "(2 in a row, 2 in this run)" in warnings[1] and (guard.bad_steps, guard.streak) == (2, 0)

    for step in (6, 7):                      # a NaN loss with a finite norm is a bad step too
        guard.step(opt, step, torch.tensor(float("nan")), torch.tensor(1.0))
    guard.check("ckpt/step_4", warnings.append)
    assert (guard.bad_steps, guard.streak) == (4, 2)
    assert not guard.ok_to_save(7, "ckpt/step_4", warnings.append)         # mid-streak weights are not saved
    assert warnings[-1] == ("warning: step 7: no checkpoint while steps are being skipped (2 in a row); the last "
                            "good checkpoint stays ckpt/step_4")
    guard.step(opt, 8, torch.tensor(2.0), torch.tensor(float("inf")))
    with pytest.raises(Diverged, match=r"at step 8 is not finite: 3 consecutive steps \(6-8\) were, and "
                                       r"train.max_bad_steps is 3; stopping.*last good checkpoint is ckpt/step_4"):
        guard.check("ckpt/step_4", warnings.append)
    assert torch.equal(model.weight, ref.weight) and opt.state_dict()["state"][0]["step"].item() == 3


def test_a_skipped_step_leaves_fsdp2_sharded_parameters_untouched():
    """Under FSDP2 the parameters and the gradient norm are DTensors: the flag still reaches the fused kernel (one
    gloo process; the sharding is accelerate's, tests/test_activation_checkpointing.py)."""
    model = tiny_model("gla")
    x, y = batch()
    with one_process_group():
        model = fsdp2_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
        guard = StepGuard(max_bad=3, scaler=False)
        for step, fault in ((1, 1.0), (2, float("nan")), (3, 1.0)):
            model(x, y, return_logits=False)[1].backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).full_tensor() * fault
            before = [p.full_tensor().clone() for p in model.parameters()]
            guard.step(opt, step, torch.tensor(2.0), gnorm)
            opt.zero_grad(set_to_none=True)
            same = all(torch.equal(a, p.full_tensor()) for a, p in zip(before, model.parameters()))
            assert same == (step == 2) and opt.state_dict()["state"][0]["step"].item() == {1: 1, 2: 1, 3: 2}[step]


def test_the_logged_loss_leaves_out_non_finite_losses():
    assert finite_mean([torch.tensor(1.0), torch.tensor(float("nan")), torch.tensor(3.0)]).item() == 2.0
    assert finite_mean([torch.tensor(float("inf"))]).isnan()


def inject(monkeypatch, faults: dict[int, float]) -> None:
    """Write faults[n] into one element of the final norm's gradient at the n-th backward (1-based) of the run."""
    real, calls = train.build_model, [0]

    def hook(g: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if calls[0] in faults:
            g = g.clone()
            g[0] = faults[calls[0]]
        return g

    def build(cfg):
        model = real(cfg)
        if not model.norm.weight.is_meta:
            model.norm.weight.register_hook(hook)
        return model

    monkeypatch.setattr(train, "build_model", build)


def never_step(monkeypatch, skip: set[int]) -> None:
    """The optimizer's n-th step() call is not made, for n in `skip`: the run that never took those steps."""
    real, calls = train.make_optimizer, [0]

    def make(*a, **k):
        opt = real(*a, **k)
        step = opt.step

        def maybe(*a, **k):
            calls[0] += 1
            return None if calls[0] in skip else step(*a, **k)

        opt.step = maybe
        return opt

    monkeypatch.setattr(train, "make_optimizer", make)


def test_an_injected_nan_and_inf_leave_the_run_of_the_steps_never_taken(tmp_path, monkeypatch, capsys):
    """Two micro-batches a step: a NaN in step 3's second micro-batch gradient and an inf in step 5's first. The
    final weights and optimizer state equal those of a run whose optimizer skipped steps 3 and 5 outright, the
    losses (same data order) are the same, and the skipped steps are warned about and counted."""
    common = ["--train.eval_interval=0", "--train.eval_batches=0", "--train.max_steps=6", "--train.ckpt_interval=6",
              "--train.log_interval=3", "--train.grad_accum=2"]
    never_step(monkeypatch, {3, 5})
    train.main(tiny(tmp_path, "ref", *common))
    monkeypatch.undo()
    reset_accelerate()
    inject(monkeypatch, {6: float("nan"), 9: float("inf")})
    train.main(tiny(tmp_path, "bad", *common))
    out = capsys.readouterr().out
    assert "warning: step 3: loss" in out and "grad norm nan is not finite; the update was skipped (1 in a row, " \
                                              "1 in this run)" in out
    assert "warning: step 5: loss" in out and "grad norm inf is not finite" in out
    assert "(1 in a row, 2 in this run)" in out
    ref, bad = (tmp_path / "runs" / n / "checkpoints" / "step_00000006" for n in ("ref", "bad"))
    weights, ref_weights = load_file(bad / "model.safetensors"), load_file(ref / "model.safetensors")
    assert weights.keys() == ref_weights.keys() and all(torch.equal(weights[k], ref_weights[k]) for k in weights)
    state, ref_state = (torch.load(c / "optimizer.bin", weights_only=True)["state"] for c in (bad, ref))
    assert state.keys() == ref_state.keys()
    for i in state:
        assert all(torch.equal(state[i][k], ref_state[i][k]) for k in ("step", "exp_avg", "exp_avg_sq"))
        assert state[i]["step"].item() == 4
    assert losses(tmp_path / "runs" / "bad") == losses(tmp_path / "runs" / "ref")
    rows = [json.loads(line) for line in (tmp_path / "runs" / "bad" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["bad_steps"]) for r in rows] == [(3, 1), (6, 2)]
    assert json.loads((bad / "trainer_state.json").read_text())["bad_steps"] == 2      # a resumed run continues it
