"""The dashboard's gradient-sync panel: all-reduce time per rank and its exposed part, their
share of the step, the step-time breakdown (with how much of the all-reduce overlapped
backward's compute), the achieved FLOP/s and MFU, and the run's sync bandwidth against what
``doctor`` measured on this machine (app/charts/breakdown.py words the measures)."""

from __future__ import annotations

import numpy as np

from app.charts.base import Chart, color
from app.charts.breakdown import (
    FlopsEvents,
    flops_text,
    median_overlap,
    rank_overlap,
    sync_words,
)
from app.charts.panels import PairPanel
from app.metric_store import MetricStore
from ddp_engine.common.doctor_result import DoctorResult, busbw_factor

SYNC_SOURCES = {
    "reducer": ("sync: DDP's own timers (CPU ranks: the interval's mean; GPUs: the latest "
                "sampled iteration, 1 in 10)"),
    "hook": "sync: Rankscope's comm hook, every step (--sync-timing hook)",
}
"""The caption's last line: where the run's sync times come from (run_start's sync_timing)."""


class SyncPanel(PairPanel):
    """Gradient all-reduce time and its exposed part per rank, their share of the step, and the
    step-time breakdown of the last interval (the caption, which goes with the sync chart)."""

    BREAKDOWN = (("data_wait_s", "data"), ("forward_s", "fwd"), ("backward_s", "bwd"),
                 ("optimizer_s", "opt"), ("eval_s", "eval"))
    """The parts a step's time is said in, which add up to it with ``other`` (the rest: the
    loop's own time, a report). The exposed sync is inside ``bwd`` (``backward()`` returns once
    every bucket is reduced) and is said in brackets after it, not as a part of the sum."""
    OTHER_MIN_S = 0.05e-3
    """``other`` is said from 0.05 ms (it prints as 0.1 from there)."""

    def __init__(self) -> None:
        self.sync = Chart("Gradient sync per step", "ms")
        self.share = Chart("Sync share of step time", "%")
        self.reference: DoctorResult | None = None
        """What ``doctor`` measured on this machine (the runs folder's doctor.json)."""
        self.flops = FlopsEvents()
        super().__init__(self.sync, self.share, self._sync_caption)

    def redraw(self, store: MetricStore) -> None:
        self.redraw_sync(store)
        self.redraw_share(store)
        self.redraw_caption(store)

    def redraw_sync(self, store: MetricStore) -> None:
        if store.many_ranks:
            n = len(store.ranks())
            lo, mid, hi = store.spread("sync_time_s")
            self.sync.set_spread(f"{n} ranks", mid.x, lo.y * 1e3, mid.y * 1e3, hi.y * 1e3,
                                 color(0))
            exposed = store.spread("sync_exposed_s")[1]
            self.sync.set_data("exposed median", exposed.x, exposed.y * 1e3, color(0),
                               dashed=True)
            return
        for rank in store.ranks():
            sync = store.get(rank, "sync_time_s")
            exposed = store.get(rank, "sync_exposed_s")
            self.sync.set_data(f"rank {rank}", sync.x, sync.y * 1e3, color(rank))
            self.sync.set_data(f"rank {rank} exposed", exposed.x, exposed.y * 1e3, color(rank),
                               dashed=True)

    def _sync_caption(self, store: MetricStore) -> str:
        if store.many_ranks:
            text = self._spread_caption(store)
        else:
            lines = (self._rank_breakdown(store, rank, f"rank {rank}")
                     for rank in store.ranks())
            text = "\n".join(line for line in lines if line)
        extra = [flops_text(store, self.flops.find(store)), self.bandwidth_text(store),
                 SYNC_SOURCES.get(store.info.sync_timing or "")]
        return "\n".join(line for line in (text, *extra) if line)

    def bandwidth_text(self, store: MetricStore) -> str | None:
        """The run's gradient-sync bus bandwidth (median rank: bytes all-reduced per step over
        the all-reduce time per step, both the latest report's means over its steps, times
        nccl-tests' 2(n-1)/n) against what ``doctor`` measured here."""
        ranks = store.ranks()
        if len(ranks) < 2:
            return None
        rates = []
        for rank in ranks:
            size, took = store.get(rank, "sync_bytes").last(), store.get(rank, "sync_time_s").last()
            if size and took and np.isfinite(size) and np.isfinite(took) and took > 0:
                rates.append(size / took / 1e9 * busbw_factor(len(ranks)))
        if not rates:
            return None
        run = float(np.median(rates))
        ref = self.reference
        if ref is None or ref.best_busbw_gbs <= 0:
            return (f"sync bus bandwidth {run:.2f} GB/s (this machine's is not measured: "
                    "Check devices...)")
        return (f"sync bus bandwidth {run:.2f} GB/s = {100 * run / ref.best_busbw_gbs:.0f}% of "
                f"the {ref.best_busbw_gbs:.2f} GB/s doctor measured ({ref.backend}, "
                f"{ref.world_size} processes)")

    def redraw_share(self, store: MetricStore) -> None:
        if store.many_ranks:
            lo, mid, hi = store.spread("sync_share_pct")
            self.share.set_spread(f"{len(store.ranks())} ranks", mid.x, lo.y, mid.y, hi.y,
                                  color(0))
            return
        for rank in store.ranks():
            sync = store.get(rank, "sync_time_s")
            step = store.get(rank, "step_time_s")
            n = min(len(sync), len(step))
            with np.errstate(divide="ignore", invalid="ignore"):
                share = 100 * sync.y[:n] / step.y[:n]
            self.share.set_data(f"rank {rank}", sync.x[:n], share, color(rank))

    @classmethod
    def _breakdown(cls, who: str, total: float | None, last: dict[str, float | None],
                   overlap: float | None) -> str | None:
        """``who``'s step in ms as parts that add up to it ("step 10.0 ms = data 0.4 + fwd 2.0
        + bwd 5.0 (exposed sync 1.0 of 4.0, 75% overlapped) + opt 1.0 + other 1.6"): the
        exposed sync inside bwd, with the whole all-reduce time and the share of it that
        overlapped compute (``overlap``)."""
        known = [(key, label, v) for key, label in cls.BREAKDOWN
                 if (v := last[key]) is not None and np.isfinite(v)
                 and (v or key != "eval_s")]  # eval: only in the intervals that had one
        if not known or not total:
            return None
        rest = total - sum(v for _, _, v in known)
        if rest >= cls.OTHER_MIN_S:
            known.append(("", "other", rest))
        sync = sync_words(last["sync_exposed_s"], last["sync_time_s"], overlap)
        return f"{who} step {total * 1e3:.1f} ms = " + " + ".join(
            f"{label} {v * 1e3:.1f}" + (f" ({sync})" if key == "backward_s" and sync else "")
            for key, label, v in known)

    FIELDS = (*(key for key, _ in BREAKDOWN), "sync_exposed_s", "sync_time_s")

    def _rank_breakdown(self, store: MetricStore, rank: int, who: str) -> str | None:
        return self._breakdown(who, store.get(rank, "step_time_s").last(),
                               {key: store.get(rank, key).last() for key in self.FIELDS},
                               rank_overlap(store, rank))

    def _spread_caption(self, store: MetricStore) -> str:
        """The median's breakdown (its overlap the median rank's), and the slowest rank's."""
        lines = [self._breakdown("median", store.spread("step_time_s")[1].last(),
                                 {key: store.spread(key)[1].last() for key in self.FIELDS},
                                 median_overlap(store))]
        steps = {r: store.get(r, "step_time_s").last() for r in store.ranks()}
        known = {r: v for r, v in steps.items() if v is not None and np.isfinite(v)}
        if known:
            slow = max(known, key=lambda r: known[r])
            lines.append(self._rank_breakdown(store, slow, f"slowest, rank {slow}"))
        return "\n".join(line for line in lines if line)
