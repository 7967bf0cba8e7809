"""Which optimizer steps are a watched script's steps: the optimizers it steps (held weakly: a
stage the script left is freed as under torchrun), the one that counts, the one whose step
ends an iteration, and the steps a GradScaler skips."""

from __future__ import annotations

import weakref

import torch

SCALER_SKIPS_DIVERGED = 20
"""Steps a GradScaler skips in a row before the loss counts as non-finite (the run's
``nonfinite_loss`` policy): by then it has cut its scale 2^20-fold and still overflows."""

Ref = weakref.ref  # of an optimizer


def _get(ref: Ref | None) -> torch.optim.Optimizer | None:
    return ref() if ref is not None else None


class StepCounter:
    """One step of the run per iteration of the script, however many optimizers it steps.

    The first optimizer that steps is the *counting* one: one step of the run per step of it.
    Where that step ends is learnt from the first iteration: the counting optimizer's first
    step leaves the step *pending*; if another optimizer steps next, that one *closes* every
    iteration from then on (a GAN: the discriminator's step, then the generator's; the step's
    loss holds both backward passes); if the counting one steps again first, it closes its
    own steps, and the pending one ends just before its second step. A pending step also ends
    before the counting optimizer steps again when the closing one skipped an iteration.
    An optimizer that steps twice while the counting one does not takes over (a new stage's
    optimizer); one freed with its stage leaves the next to count, learnt afresh."""

    def __init__(self) -> None:
        self._optimizers: list[Ref] = []
        self._counter: Ref | None = None
        self._closer: Ref | None = None  # None: not known yet
        self.pending = False
        """The counting optimizer stepped; the step ends at the closing one's step (or before
        the counting one's next)."""
        self._other_steps = 0  # steps of neither since the counting one stepped
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
        counter = _get(self._counter)
        return ([counter] if counter is not None else []) + [o for o in alive
                                                             if o is not counter]

    def forget(self) -> None:
        self._optimizers, self._counter, self._closer, self.pending = [], None, None, False

    def is_counter(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` counts the steps (or would: none stepped yet)."""
        counter = _get(self._counter)
        return counter is None or counter is optimizer

    def before(self, optimizer: torch.optim.Optimizer) -> bool:
        """``optimizer`` is about to step: whether the pending step ends first (the counting
        optimizer steps again before any other closed its last step). No change otherwise."""
        if not self.pending or _get(self._counter) is not optimizer:
            return False
        self.pending = False
        if _get(self._closer) is None:
            self._closer = self._counter  # it steps alone: it closes its own steps
        return True

    def end_pending(self) -> bool:
        """The script's iteration is over (``should_stop()``, its end): whether a pending
        step ends now."""
        if not self.pending:
            return False
        self.pending = False
        return True

    def stepped(self, optimizer: torch.optim.Optimizer, skipped: bool = False) -> bool:
        """``optimizer`` stepped (or its GradScaler ``skipped`` it); returns whether a step of
        the run ends here (else it may be :attr:`pending`)."""
        if not any(r() is optimizer for r in self._optimizers):
            self._optimizers.append(weakref.ref(optimizer))
        if self._scaler is not None and self._scaler[0] == id(optimizer):
            self._scaler = (id(optimizer), True)
        counter, closer = _get(self._counter), _get(self._closer)
        if counter is None:  # the first step, or the counting optimizer left with its stage
            self._counter, self._closer = weakref.ref(optimizer), None
            counter = optimizer
        if optimizer is counter:
            self._other_steps = 0
            if not skipped:
                self.skipped_in_row = 0
            if closer is counter:
                return True
            self.pending = True  # a closer not known yet, or another one
            return False
        if self.pending and (closer is None or closer is optimizer):
            self._closer, self.pending = weakref.ref(optimizer), False
            return True
        if closer is optimizer:
            return False  # the closing optimizer again, in the same iteration
        self._other_steps += 1
        if self._other_steps < 2:
            return False
        # a new stage's optimizer, the old one still held: it counts and closes from now
        self._counter = self._closer = weakref.ref(optimizer)
        self._other_steps, self.pending = 0, False
        return True

    def scaler_begins(self, optimizer: torch.optim.Optimizer) -> None:
        self._scaler = (id(optimizer), False)

    def scaler_skipped(self, optimizer: torch.optim.Optimizer) -> bool:
        """``scaler.step(optimizer)`` returned: whether it skipped the step (the optimizer did
        not step: inf gradients). A skip of the counting optimizer's step is counted."""
        scaler, self._scaler = self._scaler, None
        if scaler is None or scaler[0] != id(optimizer) or scaler[1]:
            return False
        if self.is_counter(optimizer):
            self.skipped += 1
            self.skipped_in_row += 1
        return True

    def take_skipped(self) -> int:
        """Skipped steps since the last call (a report's)."""
        n, self.skipped = self.skipped, 0
        return n
