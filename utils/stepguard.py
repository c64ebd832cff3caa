"""A bad step never lands: train.py's optimizer update is skipped, on the device, when the step's loss or gradient
norm is not finite (`--train.max_bad_steps`).

Each step reduces [loss, gradient norm] to one finite-or-not flag (the norm `clip_grad_norm_` already returns is
non-finite if any gradient element is) and hands it to the fused AdamW as its `found_inf`, the flag through which
torch's GradScaler skips steps: the kernel leaves parameters and moments untouched and the step counts are put
back, so optimizer state after a skipped step equals that of a run that never took it. Nothing waits for the
flag: no host synchronisation is added, and the flags are read back with the step's losses at the next log,
evaluation or checkpoint boundary, where the loop already synchronises. There each skipped step prints a warning,
the log row counts them (`bad_steps`, since the run began), and `max_bad_steps` consecutive ones stop the run with
the last good checkpoint named. So the stop comes at that boundary; no checkpoint is saved while a streak runs.

A skipped step still counts as a step: its batch is consumed and the learning-rate schedule moves on, so the data
order ((seed, step) → batch, data/sampler.py) and the schedule stay those of the run without the fault, and a
resumed run continues both where they were. Gradients are zeroed after every step, skipped or not.

Under several processes the gradient norm is already global; the loss is each rank's own, so its flag is summed
over the ranks (one scalar all-reduce, no synchronisation with the host) and every rank skips the same steps.
Under fp16, GradScaler already skips steps whose gradients overflow (expected while it finds its scale, so they are
not counted); there a step counts as bad when its loss is not finite.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from utils.errors import UserError
from utils.timing import HostCopy


class Diverged(UserError, RuntimeError):
    """The run stopped: too many consecutive steps had a non-finite loss or gradient norm."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def finite_mean(losses: list[torch.Tensor]) -> torch.Tensor:
    """The mean of the finite entries (NaN when none is), for the interval's logged loss: skipped steps' non-finite
    losses would make it NaN."""
    x = torch.stack(losses)
    return torch.where(torch.isfinite(x), x, torch.nan).nanmean()


class StepGuard:
    """Skips the optimizer update of a step whose loss or gradient norm is not finite, counts the skipped steps and
    stops the run after `max_bad` consecutive ones. `scaler`: a GradScaler skips overflowing steps itself (fp16).
    `reduce`: sums a flag over the ranks. `bad_steps` continues a resumed run's count (a checkpoint is never saved
    mid-streak, so a resumed run starts without one)."""

    def __init__(self, max_bad: int, scaler: bool, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 bad_steps: int = 0):
        self.max_bad, self.scaler, self.reduce = max_bad, scaler, reduce
        self.bad_steps, self.streak = bad_steps, 0
        self.pending: list[tuple[int, HostCopy]] = []

    def step(self, optimizer: torch.optim.Optimizer, step: int, loss: torch.Tensor, gnorm: torch.Tensor) -> None:
        """optimizer.step() for the step numbered `step` (1-based), a no-op on the device when `loss` or `gnorm` is
        not finite. The optimizer (or the one accelerate's wrapper holds) must be a fused AdamW/Adam: its kernel
        reads the flag."""
        values = torch.stack([loss.detach().float().reshape(()), gnorm.detach().float().reshape(())])
        bad = (~torch.isfinite(values[:1] if self.scaler else values)).any().float()
        if self.reduce is not None:
            bad = (self.reduce(bad) > 0).float()
        inner = getattr(optimizer, "optimizer", optimizer)
        if self.scaler:             # the scaler sets and removes found_inf itself
            optimizer.step()
        else:
            if not inner.defaults.get("fused"):
                raise ValueError("StepGuard needs a fused optimizer (its kernel reads found_inf)")
            inner.found_inf = bad
            try:
                optimizer.step()
            finally:
                del inner.found_inf
        self.pending.append((step, HostCopy(torch.cat([values, bad[None]]))))

    def check(self, last_ckpt: str | None, log: Callable[[str], None]) -> None:
        """Read back the flags of the steps since the last check (each copied out when its step was made): warn
        about each skipped step and raise Diverged once `max_bad` consecutive steps were skipped."""
        if not self.pending:
            return
        rows = [v.tolist() for _, v in self.pending]     # each waits for its own step, not for the steps queued since
        steps = [s for s, _ in self.pending]
        self.pending.clear()
        for step, (loss, gnorm, bad) in zip(steps, rows):
            if not bad:
                self.streak = 0
                continue
            self.bad_steps += 1
            self.streak += 1
            log(f"warning: step {step}: loss {loss:.4g} / grad norm {gnorm:.4g} is not finite; the update was "
                f"skipped ({self.streak} in a row, {self.bad_steps} in this run)")
            if self.streak >= self.max_bad:
                first = step - self.streak + 1
                raise Diverged(f"loss {loss} / grad norm {gnorm} at step {step} is not finite: {self.streak} "
                               f"consecutive steps ({first}-{step}) were, and train.max_bad_steps is {self.max_bad}; "
                               "stopping. Their updates were skipped. The last good checkpoint is "
                               f"{last_ckpt or 'none (none was saved)'}; none is saved while steps are skipped. "
                               "Lower optim.lr or raise warmup.", step)

    def ok_to_save(self, step: int, last_ckpt: str | None, log: Callable[[str], None]) -> bool:
        """Whether a checkpoint may be saved at `step` (after check()): not while a streak of skipped steps is
        running, since a finite-loss update may have landed weights that fail every later step, and the last good
        checkpoint must stay the one a stop names."""
        if self.streak:
            log(f"warning: step {step}: no checkpoint while steps are being skipped ({self.streak} in a row); the "
                f"last good checkpoint stays {last_ckpt or 'none'}")
        return not self.streak
