"""Rank 0's watch on the loss: a warning when it spikes or diverges (standard library only).

Fed the reports every rank already gathers (one mean loss over ranks per report, on reporting
steps only): no collective, nothing per step, no host-device sync of its own. A report is *far
above* the recent loss when its mean loss exceeds

    threshold = median + mads * spread

of the reports before it (the last WINDOW_REPORTS of them, once there are WARMUP_REPORTS),
where spread is the median absolute deviation scaled to a standard deviation (1.4826 MAD) but at
least MIN_SPREAD of the median: the median and the MAD ignore the odd noisy report, a falling
loss stays below its median, and a flat loss does not warn on tiny noise. ``reports`` such
reports in a row make one :class:`LossSpike`; the watch then stays quiet until as many reports
in a row are back under the threshold. Non-finite losses are left to the trainer's own check
(``Trainer._nonfinite``).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ddp_engine.common.runs import fmt_number

WINDOW_REPORTS = 50
"""The recent loss: this many reports before the one judged."""
WARMUP_REPORTS = 10
"""No judgement before this many reports: the first ones say little about the loss's noise."""
MAD_SCALE = 1.4826
"""MAD times this is the standard deviation of normally distributed values."""
MIN_SPREAD = 0.05
"""The spread is at least this fraction of the median: at the default 6 MADs, a flat loss
warns only above 1.3 times its median."""
TINY = 1e-12  # the spread of a loss that is exactly 0


@dataclass(frozen=True)
class LossSpike:
    """Reports far above the recent loss: the fields of the ``warning`` event (cause
    ``loss_spike``), taken at the report that made the warning."""

    step: int
    """The report that made the warning (the last of ``reports`` in a row)."""
    loss: float
    """Its mean loss over ranks."""
    losses: list[float]
    """Its loss on each rank, by rank."""
    median: float
    """The median of the recent reports' mean losses."""
    threshold: float
    """What the loss had to exceed."""
    reports: int
    """Reports in a row above the threshold."""
    since_step: int
    """The first of them."""

    @property
    def message(self) -> str:
        row = f"{self.reports} reports in a row" if self.reports > 1 else "1 report"
        return (f"loss {fmt_number(self.loss)} at step {self.step} is far above its recent "
                f"median {fmt_number(self.median)} (threshold {fmt_number(self.threshold)}, "
                f"{row}): the run may be diverging")

    def event_fields(self) -> dict[str, Any]:
        """The ``warning`` event's fields, message and cause included."""
        return {**asdict(self), "message": self.message, "cause": "loss_spike"}


class LossWatch:
    """Judges each report's mean loss against the recent ones (see the module docstring).

    Args:
        mads: how many scaled median absolute deviations above the median is far (0: off).
        reports: reports in a row above the threshold that make a warning, and below it that
            re-arm the watch.
        window: how many recent reports the median and the MAD are taken over.
        warmup: reports needed before any is judged.
    """

    def __init__(self, mads: float, reports: int, window: int = WINDOW_REPORTS,
                 warmup: int = WARMUP_REPORTS) -> None:
        self.mads = mads
        self.reports = reports
        self.warmup = warmup
        self.recent: deque[float] = deque(maxlen=window)
        self.armed = True
        """False from a warning until the loss has been back under the threshold."""
        self._above = 0  # reports in a row above the threshold
        self._below = 0  # and under it, while not armed
        self._since = 0

    def threshold(self) -> tuple[float, float] | None:
        """The recent median and the threshold above it, or None during the warm-up."""
        if len(self.recent) < max(self.warmup, 1):
            return None
        median = statistics.median(self.recent)
        mad = statistics.median(abs(v - median) for v in self.recent)
        spread = max(MAD_SCALE * mad, MIN_SPREAD * abs(median), TINY)
        return median, median + self.mads * spread

    def add(self, step: int, losses: Sequence[float]) -> LossSpike | None:
        """One report: each rank's loss at ``step``. Returns the spike it completes, if any
        (never while off, and nothing is kept of a report with a non-finite loss)."""
        if self.mads <= 0 or not losses or not all(math.isfinite(v) for v in losses):
            return None
        loss = math.fsum(losses) / len(losses)
        judged = self.threshold()
        self.recent.append(loss)
        if judged is None:
            return None
        median, threshold = judged
        if loss <= threshold:
            self._above = 0
            self._below += 1
            if self._below >= self.reports:
                self.armed = True
            return None
        self._below = 0
        self._above += 1
        if self._above == 1:
            self._since = step
        if not self.armed or self._above < self.reports:
            return None
        self.armed = False
        return LossSpike(step=step, loss=loss, losses=[float(v) for v in losses], median=median,
                         threshold=threshold, reports=self._above, since_step=self._since)
