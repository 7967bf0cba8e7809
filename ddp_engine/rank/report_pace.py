"""Which steps report (issue 29): each report costs a round and a row (about 1.5 ms on 2 CPU
ranks; at 3.5 ms steps a report every 10 steps was 4-5% of the run), so by default reports are
paced by time as well as by steps. Torch-free: :class:`~ddp_engine.rank.distributed.StopFlag`
keeps one and feeds it the agreed step time, so every rank reports at the same steps."""

from __future__ import annotations

import math

from ddp_engine.common.config import RunConfig

DEFAULT_EVERY = 10
"""With ``log_every`` 0 (the default): reports fall on multiples of this many steps..."""
DEFAULT_S = 0.2
"""... at least this many seconds apart."""


class ReportPace:
    """Reports on multiples of ``every`` steps, at least ``seconds`` apart at an agreed step
    time (0: every ``every`` steps)."""

    def __init__(self, every: int = DEFAULT_EVERY, seconds: float = 0.0) -> None:
        self.every = every
        self.seconds = seconds
        self._next = 0  # the first multiple of every from here is a reporting step

    @classmethod
    def of(cls, cfg: RunConfig) -> ReportPace:
        """``log_every`` N: every N steps exactly; 0 (the default): paced by time."""
        return cls(cfg.log_every) if cfg.log_every else cls(DEFAULT_EVERY, DEFAULT_S)

    def due(self, step: int) -> bool:
        """Whether ``step`` reports (beyond the reports a step makes for its own reasons)."""
        return step % self.every == 0 and step >= self._next

    def reported(self, step: int, per_step_s: float | None) -> None:
        """A report was made at ``step``: the next falls ``seconds`` on at ``per_step_s`` (an
        agreed pace, so every rank schedules alike; None: not known yet)."""
        gap = math.ceil(self.seconds / per_step_s) if self.seconds and per_step_s else 1
        self._next = step + gap

    def steps_to_next(self, step: int) -> int:
        """Steps from ``step`` to the next reporting step (at least one)."""
        return -(-max(self._next, step + 1) // self.every) * self.every - step
