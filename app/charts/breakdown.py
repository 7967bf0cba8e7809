"""Where a step's time goes, in the measures Holistic Trace Analysis (HTA) defines, but live
from the reports (no Qt, no torch: the sync panel's caption words these).

- Communication overlap: the share of a step's gradient all-reduce time during which
  backward was still computing, ``(sync_time_s - sync_exposed_s) / sync_time_s``.
  ``sync_time_s`` is the union of the buckets' in-flight intervals; ``sync_exposed_s`` is how
  long backward waited after its compute ended (from the last bucket's hand-over, when the
  last gradients were computed, to the end of ``backward()``), at most ``sync_time_s``
  (ddp_engine/rank/sync_timing.py). All-reduce time before that moment ran beside compute;
  after it, it is exposed. 100%: the all-reduce hid entirely behind backward; 0%: the step
  waited for all of it (gloo on CPU, typically).
- Exposed communication: ``sync_exposed_s`` itself, per step.
- Achieved FLOP/s per rank: the ``flops`` event's ``flops_per_step`` (counted once by the
  rank, ddp_engine/rank/flops.py) over the rank's ``step_time_s``; on GPUs, model FLOPs
  utilization (MFU) = that over the GPU's dense peak in the run's precision
  (ddp_engine/common/gpu_peaks.py). A user's own script has no ``flops`` event: no line.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from app.metric_store import MetricStore
from ddp_engine.common.gpu_peaks import PRECISIONS, Peak, flops_words, gpu_model, peak_flops


def finite(value: float | None) -> float | None:
    """``value`` where it is a finite number, else None (null, NaN and inf alike)."""
    return value if value is not None and math.isfinite(value) else None


def overlap_share(sync_time_s: float | None, sync_exposed_s: float | None) -> float | None:
    """The share (0..1) of all-reduce time that overlapped backward's compute; None where
    either time is unknown or no all-reduce time was measured."""
    sync, exposed = finite(sync_time_s), finite(sync_exposed_s)
    if sync is None or exposed is None or sync <= 0:
        return None
    return min(1.0, max(0.0, (sync - exposed) / sync))


def rank_overlap(store: MetricStore, rank: int) -> float | None:
    """``rank``'s overlap share in its latest report."""
    return overlap_share(store.get(rank, "sync_time_s").last(),
                         store.get(rank, "sync_exposed_s").last())


def median_overlap(store: MetricStore) -> float | None:
    """The median over ranks of each rank's latest overlap share (ranks without one left
    out): the median rank's, not the share of the median times."""
    shares = [s for r in store.ranks() if (s := rank_overlap(store, r)) is not None]
    return statistics.median(shares) if shares else None


def sync_words(exposed_s: float | None, sync_s: float | None, share: float | None) -> str | None:
    """The breakdown's sync part, in ms: "exposed sync 1.0 of 3.0, 67% overlapped"; just
    "exposed sync 1.0" where the whole sync time is unknown; None where nothing is known."""
    exposed, sync = finite(exposed_s), finite(sync_s)
    if exposed is None:
        return None
    if sync is None or sync <= 0 or share is None:
        return f"exposed sync {exposed * 1e3:.1f}"
    return f"exposed sync {exposed * 1e3:.1f} of {sync * 1e3:.1f}, {100 * share:.0f}% overlapped"


class FlopsEvents:
    """The run's latest usable ``flops`` event, found by reading only the events that came
    since the last look (the store's event list only grows until it is cleared)."""

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] | None = None
        self._seen = 0
        self.latest: dict[str, Any] | None = None

    def find(self, store: MetricStore) -> dict[str, Any] | None:
        events = store.events
        if events is not self._events or len(events) < self._seen:  # cleared: start over
            self._events, self._seen, self.latest = events, 0, None
        for e in events[self._seen:]:
            if e.get("kind") == "flops" and _count(e) is not None:
                self.latest = e
        self._seen = len(events)
        return self.latest


def _count(event: dict[str, Any]) -> float | None:
    value = event.get("flops_per_step")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def flops_text(store: MetricStore, event: dict[str, Any] | None) -> str | None:
    """The achieved FLOP/s line: per rank (median, and the slowest rank's), and on GPUs the
    MFU against the GPU's peak, or why there is none. None without a ``flops`` event or a
    step time."""
    count = _count(event) if event is not None else None
    if event is None or count is None:
        return None
    steps = {r: v for r in store.ranks()
             if (v := finite(store.get(r, "step_time_s").last())) is not None and v > 0}
    if not steps:
        return None
    achieved = {r: count / v for r, v in steps.items()}
    slow = max(steps, key=lambda r: steps[r])
    head = f"model FLOPs {flops_words(count).replace('/s', '')} a step: "
    if len(achieved) == 1:
        head += f"rank {slow} {flops_words(achieved[slow])}"
    else:
        head += (f"{flops_words(statistics.median(achieved.values()))} per rank (median; "
                 f"slowest, rank {slow}: {flops_words(achieved[slow])})")
    return head + _mfu(store, event, achieved, slow)


def _mfu(store: MetricStore, event: dict[str, Any], achieved: dict[int, float],
         slow: int) -> str:
    """", MFU 41% of 989 TFLOP/s (H200 SXM, bf16 dense)", or why there is no MFU."""
    if not any(store.info.devices.get(r, "").startswith(("GPU", "cuda")) for r in achieved):
        return "; CPU: no peak"
    given = event.get("gpus")
    names: list[Any] = given if isinstance(given, list) else []
    precision = event.get("precision")
    if precision not in PRECISIONS:
        return f"; peak unknown for precision {precision!r}"
    peaks: dict[int, Peak] = {}
    for r in achieved:
        name = names[r] if r < len(names) and isinstance(names[r], str) else None
        if name is None:
            return f"; peak unknown for {store.info.devices.get(r) or f'rank {r}'} (no GPU name)"
        peak = peak_flops(name, str(precision))
        if peak is None:
            return f"; peak unknown for {name}" + (
                f" in {precision}" if gpu_model(name) is not None else "")
        peaks[r] = peak
    mfu = {r: 100 * achieved[r] / peaks[r].flops_per_s for r in achieved}
    against = (peaks[slow].words if len({p.model for p in peaks.values()}) == 1
               else "each rank's GPU's peak")
    if len(mfu) == 1:
        return f", MFU {_pct(mfu[slow])} of {against}"
    return (f", MFU {_pct(statistics.median(mfu.values()))} (median; slowest "
            f"{_pct(mfu[slow])}) of {against}")


def _pct(value: float) -> str:
    """A percentage that stays readable when small: 41%, 3.2%, 0.042%."""
    return f"{value:.0f}%" if value >= 10 else f"{value:.2g}%"
