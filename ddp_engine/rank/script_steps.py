"""Which optimizer steps are a watched script's steps: the optimizers it steps (held weakly: a
stage the script left is freed as under torchrun), the one that counts, and the steps a
GradScaler skips."""

from __future__ import annotations

import weakref

import torch

SCALER_SKIPS_DIVERGED = 20
"""Steps a GradScaler skips in a row before the loss counts as non-finite (the run's
``nonfinite_loss`` policy): by then it has cut its scale 2^20-fold and still overflows."""


class StepCounter:
    """The first optimizer that steps counts the steps; one that steps twice while it does
    not takes over (a new stage's optimizer); a GAN's second optimizer does not count."""

    def __init__(self) -> None:
        self._optimizers: list[weakref.ref[torch.optim.Optimizer]] = []
        self._counter: weakref.ref[torch.optim.Optimizer] | None = None
        self._other_steps = 0  # steps of other optimizers since the counting one stepped
        self._scaler: tuple[int, bool] | None = None  # (id of its optimizer, stepped)
        self.skipped = 0
        """GradScaler-skipped steps since :meth:`take_skipped`."""
        self.skipped_in_row = 0

    @property
    def started(self) -> bool:
        """Whether any optimizer stepped."""
        return self._counter is not None

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Every optimizer that stepped and is still held, the counting one first."""
        alive = [o for o in (r() for r in self._optimizers) if o is not None]
        counter = self._counter() if self._counter is not None else None
        return ([counter] if counter is not None else []) + [o for o in alive
                                                             if o is not counter]

    def forget(self) -> None:
        self._optimizers, self._counter = [], None

    def counts(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether a step of ``optimizer`` now would be a step of the run (no change)."""
        counter = self._counter() if self._counter is not None else None
        return counter is None or counter is optimizer

    def stepped(self, optimizer: torch.optim.Optimizer) -> bool:
        """``optimizer`` stepped; returns whether that is a step of the run."""
        if not any(r() is optimizer for r in self._optimizers):
            self._optimizers.append(weakref.ref(optimizer))
        if self._scaler is not None and self._scaler[0] == id(optimizer):
            self._scaler = (id(optimizer), True)
        if not self.counts(optimizer):
            self._other_steps += 1
            if self._other_steps < 2:
                return False
        self._counter, self._other_steps = weakref.ref(optimizer), 0
        self.skipped_in_row = 0
        return True

    def scaler_begins(self, optimizer: torch.optim.Optimizer) -> None:
        self._scaler = (id(optimizer), False)

    def scaler_skipped(self, optimizer: torch.optim.Optimizer) -> bool:
        """``scaler.step(optimizer)`` returned: whether it skipped a step of the run (the
        optimizer did not step: inf gradients). Counts it."""
        scaler, self._scaler = self._scaler, None
        if scaler is None or scaler[1] or not self.counts(optimizer):
            return False
        self.skipped += 1
        self.skipped_in_row += 1
        return True

    def take_skipped(self) -> int:
        """Skipped steps since the last call (a report's)."""
        n, self.skipped = self.skipped, 0
        return n
