"""The built-in loop's learning-rate schedule: linear warm-up from 0, then constant, cosine or
linear decay to 0, or steps down to x0.1 and x0.01 (``RunConfig.lr_schedule``), as one
:class:`~torch.optim.lr_scheduler.LambdaLR` whose factor is a function of the global step.

The step counts optimizer steps of the whole run (a resumed run's included), so a resumed run
rebuilds its schedule at the step it resumes from and follows the same learning rates as a run
that was never interrupted. The learning rate after ``k`` steps (the one step ``k + 1`` uses) is
``lr * lr_factor(...)(k)``: 0 at step 0, ``lr`` at the end of the warm-up, 0 at the last step
for cosine and linear.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR

from ddp_engine.common.config import RunConfig


def lr_factor(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """The multiplier of the base learning rate after ``step`` optimizer steps.

    Args:
        schedule: constant, cosine, linear or step (validated by RunConfig).
        warmup_steps: steps of linear warm-up from 0 to 1; they count towards the total.
        total_steps: optimizer steps of the whole run.
    """
    decay_steps = max(total_steps - warmup_steps, 1)
    half, three_quarters = total_steps / 2, total_steps * 3 / 4

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / warmup_steps
        if schedule == "constant":
            return 1.0
        if schedule == "step":
            return 1.0 if step < half else 0.1 if step < three_quarters else 0.01
        progress = min((step - warmup_steps) / decay_steps, 1.0)
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress  # linear

    return factor


class LrSchedule:
    """A LambdaLR over the optimizer's groups from base ``cfg.lr``, stepped once per
    optimizer step."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: RunConfig, total_steps: int,
                 start_step: int = 0) -> None:
        """``start_step``: optimizer steps already done (a resumed run's checkpoint step)."""
        for group in optimizer.param_groups:  # the base: --lr, whatever a checkpoint held
            group["initial_lr"] = cfg.lr
        self.scheduler = LambdaLR(optimizer,
                                  lr_factor(cfg.lr_schedule, cfg.warmup_steps, total_steps),
                                  last_epoch=start_step - 1)  # its first step sets start_step's lr
        # Mixed precision: GradScaler skips the optimizer step whose gradients are not finite
        # (often the very first, at its initial scale). The schedule counts steps, taken or
        # not, and torch's one check (on the first scheduler step, that the optimizer stepped
        # before it) would then warn of a mistake that is not one.
        self._first = True

    @classmethod
    def build(cls, optimizer: torch.optim.Optimizer, cfg: RunConfig, total_steps: int,
              start_step: int = 0) -> LrSchedule | None:
        """The schedule ``cfg`` names, or None where the learning rate stays ``cfg.lr`` (the
        optimizer is then left exactly as it was built or resumed)."""
        if cfg.lr_schedule == "constant" and cfg.warmup_steps == 0:
            return None
        return cls(optimizer, cfg, total_steps, start_step)

    def step(self) -> None:
        """Advance one optimizer step (call it after the optimizer's, or GradScaler's, step)."""
        if not self._first:
            self.scheduler.step()
            return
        self._first = False
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step",
                                    category=UserWarning)
            self.scheduler.step()
