"""A profile asked for on rank 0 and agreed by every rank, as a stop is (issue 31): rank 0's
ask rides in every round's row until a round carries it; every rank reads that round after the
same step, so every rank starts its profiler at the same step. Torch-free."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_engine.common.profile_files import DEFAULT_STEPS, MAX_STEPS, PROFILES_DIR

SHAPES = 1
STACKS = 2
"""Bits of an ask's flags: record input shapes, record Python stacks."""


@dataclass(frozen=True)
class Agreed:
    """A profile every rank agreed on: the id (rank 0's clock when asked) and what to record."""

    asked_at: float
    steps: int
    flags: int

    @property
    def shapes(self) -> bool:
        return bool(self.flags & SHAPES)

    @property
    def stacks(self) -> bool:
        return bool(self.flags & STACKS)


class ProfileAsk:
    """The profile columns of a round's row: (asked at, steps, flags), zeros when none."""

    NONE = (0.0, 0.0, 0.0)

    def __init__(self) -> None:
        self._pending: tuple[float, float, float] | None = None  # set from another thread
        self._seen = 0.0  # the latest agreed ask's id
        self._agreed: Agreed | None = None
        self.recording = False
        """A profile is recording on this rank (the rounds name their collectives)."""

    def ask(self, steps: int, *, shapes: bool = False, stacks: bool = False) -> float:
        """Ask (rank 0; thread-safe: one assignment) for ``steps`` profiled steps from the next
        round on. Returns the ask's id. An ask not yet agreed is replaced."""
        asked_at = max(time.time(), self._seen + 1e-3)  # ids only grow
        self._pending = (asked_at, float(steps), float((SHAPES if shapes else 0)
                                                       | (STACKS if stacks else 0)))
        return asked_at

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def row(self) -> tuple[float, float, float]:
        return self._pending or self.NONE

    def read(self, columns: list[list[float]]) -> None:
        """A round's profile columns, row r for rank r: a newer ask than the last agreed one
        (the same on every rank) is agreed now."""
        newest = max(columns, key=lambda c: c[0])
        if newest[0] > self._seen:
            self._seen = newest[0]
            self._agreed = Agreed(newest[0], int(newest[1]), int(newest[2]))
            pending = self._pending
            if pending is not None and pending[0] <= newest[0]:
                self._pending = None

    def take(self) -> Agreed | None:
        """The profile agreed by the round just read, once."""
        agreed, self._agreed = self._agreed, None
        return agreed


def answer(ask: ProfileAsk, run_dir: Path, msg: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's reply to a viewer's ``{"type": "profile", "steps": N, "shapes": bool,
    "stacks": bool}`` (its server thread): an ack with the ask's id, or an error. Registered
    with the telemetry server when it starts, so an ask made while the run is still starting is
    kept for its first round."""
    steps = msg.get("steps", DEFAULT_STEPS)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        return _error(f"steps must be a whole number between 1 and {MAX_STEPS}, got {steps!r}")
    if ask.recording:
        return _error("a profile is already being taken; ask again when it is written "
                      f"(under {run_dir / PROFILES_DIR})")
    if ask.pending:
        return _error("a profile was asked for already and waits for the ranks' next "
                      "agreement round (rounds come with the reports; a script whose ranks "
                      "never call init_process_group has none)")
    asked = ask.ask(steps, shapes=msg.get("shapes") is True, stacks=msg.get("stacks") is True)
    return {"type": "ack", "command": "profile", "id": asked, "steps": steps}


def _error(message: str) -> dict[str, Any]:
    return {"type": "error", "command": "profile", "message": message}
