"""Which rank holds the others back, and why: the straggler verdict (torch-free).

DDP makes every rank's step equally long: the gradient all-reduce cannot finish before the
slowest rank hands its gradients over, so the others wait inside it. A rank's step time
therefore says nothing; its *wait* does. The straggler is the rank that waits least in the
all-reduce, and its own time per step (its "compute": step time less that wait and less any
evaluation) is longer than the other ranks' by what they wait for it.

The wait is ``sync_exposed_s``: how long the step waited for communication once backward's
compute was done (on CPU/gloo the whole all-reduce; on GPUs the part not hidden behind
backward). ``sync_time_s`` also counts communication that overlapped compute, which is no wait;
it is used only where a report has no exposed time.

One report is noise (a scheduler hiccup, a checkpoint): a rank is named only once it waited
least in ``sustain`` consecutive reports and its compute is at least ``min_excess`` longer than
the other ranks' median; it stays named while it waited least in over half of the last
``sustain`` reports. Beside it, the likely cause, from what the reports carry: its GPU's clock
event (throttle) reasons, SM clock, power and temperature against the other GPUs; its data wait
against the others' (input-bound); on CPU, the CPU time it got against the others'.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_engine.common.gpus import CLOCK_SLOWDOWNS
from ddp_engine.common.run_dir import METRICS_FILE

SUSTAIN_REPORTS = 20
"""Reports in a row a rank must wait least in before it is named."""
MIN_EXCESS = 0.10
"""Compute at least this much longer than the others' median (0.10: 10%) to be named: in a
balanced run some rank always waits least, by a margin that is noise."""
THROTTLE_NAMES = {bit: name for bit, (name, _advice) in CLOCK_SLOWDOWNS.items()}
"""The slowdown reasons, as the verdict (and ``doctor``) name them."""
SLOWER_CPU = 0.8
"""A CPU rank that got less than this share of the others' CPU time was starved of it."""
INPUT_SHARE = 0.5
"""Data wait explains the excess when its own excess is at least this share of it."""


def throttle_names(bits: int | None) -> list[str]:
    """The slowdown reasons set in an nvmlClocksEventReason* bitmask, in bit order."""
    if not bits:
        return []
    return [name for bit, name in THROTTLE_NAMES.items() if bits & bit]


def _num(value: Any) -> float | None:
    """A finite number from the wire, or None (null, text, NaN, a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class _Sample:
    """One rank in one report: what the verdict reads of its entry."""

    wait_s: float
    own_s: float
    device: str
    data_wait_s: float | None
    cpu_s: float | None
    cpu_pct: float | None
    clock_mhz: float | None
    throttle: int | None
    power_w: float | None
    temp_c: float | None

    @staticmethod
    def of(entry: Mapping[str, Any], step: float, wait: float) -> _Sample:
        """The entry of a rank that waited ``wait`` in steps of ``step`` (see _timings)."""
        own = step - (_num(entry.get("eval_s")) or 0.0) - wait
        throttle = _num(entry.get("gpu_throttle"))
        return _Sample(wait, max(own, 0.0), str(entry.get("device") or ""),
                       _num(entry.get("data_wait_s")), _num(entry.get("process_cpu_s")),
                       _num(entry.get("cpu_pct")), _num(entry.get("gpu_clock_mhz")),
                       None if throttle is None else int(throttle),
                       _num(entry.get("gpu_power_w")), _num(entry.get("gpu_temp_c")))


def _timings(entry: Any) -> tuple[int, float, float] | None:
    """An entry's rank, step time and all-reduce wait; None where it lacks one (a script
    whose sync cannot be timed, a report before the first step resolved, junk)."""
    if not isinstance(entry, Mapping) or not isinstance(rank := entry.get("rank"), int):
        return None
    step = _num(entry.get("step_time_s"))
    wait = _num(entry.get("sync_exposed_s"))
    if wait is None:
        wait = _num(entry.get("sync_time_s"))
    return None if step is None or wait is None else (rank, step, wait)


class _Report:
    """One report's ranks: their waits read at once (who waited least), the rest of their
    entries only when a verdict is asked for."""

    def __init__(self, time: float | None, timed: dict[int, tuple[Mapping[str, Any], float,
                                                                   float]]) -> None:
        self.time = time
        self._timed = timed
        self.least = min(timed, key=lambda r: (timed[r][2], r))  # the rank that waited least

    @functools.cached_property
    def samples(self) -> dict[int, _Sample]:
        return {r: _Sample.of(*t) for r, t in self._timed.items()}


@dataclass(frozen=True)
class Verdict:
    """The straggler, how much slower its compute is, and the likely cause."""

    rank: int
    device: str
    """``"GPU 1"``, ``"cuda:1"``, ``"cpu"``: as the reports name the rank's device."""
    excess: float
    """Its compute over the other ranks' median, less one (0.41: 41% longer)."""
    wait_s: float
    others_wait_s: float
    """Its wait in the all-reduce per step, and the other ranks' median."""
    causes: list[str] = field(default_factory=list)
    """The likely causes found: ``"thermal slowdown"``, ``"input-bound: ..."``."""
    context: list[str] = field(default_factory=list)
    """Its readings against the others', cause or not (clocks, power, CPU time)."""

    @property
    def text(self) -> str:
        """One line: ``rank 1: compute 41% longer than the median rank's (waits 0.2 ms in
        the all-reduce, the others 6.1 ms); likely cause: ...; CPU time ...``."""
        who = f"rank {self.rank}" + (f" ({self.device})" if self.device not in ("", "cpu")
                                     else "")
        parts = [f"{who}: compute {100 * self.excess:.0f}% longer than the median rank's "
                 f"(waits {fmt_ms(self.wait_s)} in the all-reduce, the others "
                 f"{fmt_ms(self.others_wait_s)})"]
        if self.causes:
            parts.append("likely cause: " + ", ".join(self.causes))
        parts.extend(self.context)
        return "; ".join(parts)


def fmt_ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


class StragglerWatch:
    """Follows metrics messages (their ``ranks`` entries) and names the straggler once it is
    sustained. Feed every metrics message in order with :meth:`add`; read :attr:`verdict`."""

    def __init__(self, sustain: int = SUSTAIN_REPORTS, min_excess: float = MIN_EXCESS) -> None:
        if not isinstance(sustain, int) or sustain < 1:
            raise ValueError(f"sustain must be an integer >= 1 (reports), got {sustain!r}")
        if not 0 <= min_excess:
            raise ValueError(f"min_excess must be >= 0 (0.1: 10% slower), got {min_excess!r}")
        self.sustain = sustain
        self.min_excess = min_excess
        self._window: deque[_Report] = deque(maxlen=sustain)
        self._named: int | None = None
        self._verdict: Verdict | None = None
        self._judged = True  # whether _verdict is of the window as it is

    @property
    def verdict(self) -> Verdict | None:
        """The straggler now, or None (none sustained, or the run is balanced). Worked out
        when asked, not on every report: a viewer takes hundreds of reports a second."""
        if not self._judged:
            self._judged = True
            named = self._named
            self._verdict = None if named is None else self._judge(named)
            if self._verdict is not None and self._verdict.excess < self.min_excess:
                self._verdict = None
        return self._verdict

    def add(self, message: Mapping[str, Any]) -> None:
        """Take one message (others than metrics are ignored)."""
        if message.get("type", "metrics") != "metrics":
            return
        timed = {}
        for entry in message.get("ranks") or ():
            if (got := _timings(entry)) is not None:
                timed[got[0]] = (entry, got[1], got[2])
        if len(timed) < 2:  # one rank waits for nobody; a report without timings: no news
            return
        self._window.append(_Report(_num(message.get("time")), timed))
        self._named = self._choose()
        self._judged = False

    def _choose(self) -> int | None:
        counts = Counter(r.least for r in self._window)
        if self._named is not None and 2 * counts[self._named] > len(self._window):
            return self._named  # still waiting least in most reports: it stays named
        if len(self._window) == self.sustain and len(counts) == 1:
            return self._window[-1].least
        return None

    def _judge(self, rank: int) -> Verdict | None:
        reports = [r for r in self._window if rank in r.samples]
        own = statistics.fmean(r.samples[rank].own_s for r in reports)
        others_own = statistics.fmean(_others(r, rank, "own_s") for r in reports)
        if others_own <= 0:
            return None
        last = reports[-1].samples[rank]
        wait = statistics.fmean(r.samples[rank].wait_s for r in reports)
        others_wait = statistics.fmean(_others(r, rank, "wait_s") for r in reports)
        verdict = Verdict(rank, last.device, own / others_own - 1, wait, others_wait)
        _input_bound(verdict, reports, own - others_own)
        if last.device not in ("", "cpu") or last.clock_mhz is not None:  # a GPU rank
            _gpu_causes(verdict, reports)
        else:
            _cpu_causes(verdict, reports)
        return verdict


def verdict_of(messages: Iterable[Mapping[str, Any]], sustain: int = SUSTAIN_REPORTS,
               min_excess: float = MIN_EXCESS) -> Verdict | None:
    """The straggler at the end of a run's messages (metrics.jsonl's, in order)."""
    watch = StragglerWatch(sustain, min_excess)
    for m in messages:
        watch.add(m)
    return watch.verdict


def run_verdict(run_dir: str | os.PathLike[str], sustain: int = SUSTAIN_REPORTS,
                min_excess: float = MIN_EXCESS, block_bytes: int = 1 << 20) -> Verdict | None:
    """The straggler at the end of a run folder's metrics.jsonl, from its last ``3 * sustain``
    reports only: read from the end, so that a long run's file is not read whole."""
    wanted = 3 * sustain
    try:
        with open(Path(run_dir) / METRICS_FILE, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            data, pos = b"", end
            while pos > 0 and data.count(b'"metrics"') <= wanted:  # about one a report
                step = min(block_bytes, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    except OSError:
        return None
    lines = data.split(b"\n")
    lines = lines[1 if pos > 0 else 0:-1]  # a cut first line; a partly written last one
    messages = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("type") == "metrics":
            messages.append(obj)
    return verdict_of(messages[-wanted:], sustain, min_excess)


def _others(report: _Report, rank: int, name: str) -> float:
    """The median of field ``name`` over the other ranks of ``report`` (NaN: none has it)."""
    values = [v for r, s in report.samples.items()
              if r != rank and (v := getattr(s, name)) is not None]
    return statistics.median(values) if values else math.nan


def _mean(reports: list[_Report], rank: int, name: str) -> tuple[float | None, float | None]:
    """Field ``name``'s mean over the reports for ``rank``, and for the others' median (None
    where no report has it)."""
    own = [v for r in reports if (v := getattr(r.samples[rank], name)) is not None]
    others = [v for r in reports if not math.isnan(v := _others(r, rank, name))]
    return (statistics.fmean(own) if own else None,
            statistics.fmean(others) if others else None)


def _input_bound(verdict: Verdict, reports: list[_Report], excess_s: float) -> None:
    """Input-bound: its data wait explains at least INPUT_SHARE of its compute excess."""
    mine, others = _mean(reports, verdict.rank, "data_wait_s")
    if mine is None or others is None or excess_s <= 0:
        return
    if mine - others >= INPUT_SHARE * excess_s:
        verdict.causes.append(f"input-bound (waits {fmt_ms(mine)} per step for data, the "
                              f"others {fmt_ms(others)})")


def _gpu_causes(verdict: Verdict, reports: list[_Report]) -> None:
    """Its GPU's throttle reasons (those the other GPUs do not all share), and its clock,
    power and temperature against the other GPUs'."""
    rank = verdict.rank
    mine = 0
    theirs: dict[int, int] = {}
    for r in reports:
        for k, s in r.samples.items():
            if s.throttle is not None:
                if k == rank:
                    mine |= s.throttle
                else:
                    theirs[k] = theirs.get(k, 0) | s.throttle
    shared = ~0
    for bits in theirs.values():
        shared &= bits
    if not theirs:
        shared = 0
    verdict.causes.extend(throttle_names(mine & ~shared))
    readings = []
    for name, unit in (("clock_mhz", "MHz SM clock"), ("power_w", "W"), ("temp_c", "°C")):
        own, others = _mean(reports, rank, name)
        if own is not None and others is not None:
            readings.append((f"{own:.0f} {unit}", f"{others:.0f} {unit}"))
    if readings:
        verdict.context.append(f"its GPU: {', '.join(m for m, _ in readings)} (the other "
                               f"GPUs: {', '.join(o for _, o in readings)})")


def _cpu_causes(verdict: Verdict, reports: list[_Report]) -> None:
    """The CPU time it got (cores' worth over the window) against the others'."""
    rank = verdict.rank
    cores = _cores(reports)
    if rank in cores and len(cores) > 1:
        own = cores[rank]
        others = statistics.median(v for k, v in cores.items() if k != rank)
    else:  # fewer than two reports with CPU time: psutil's CPU % instead
        own_pct, others_pct = _mean(reports, rank, "cpu_pct")
        if own_pct is None or others_pct is None:
            return
        own, others = own_pct / 100, others_pct / 100
    if others > 0 and own < SLOWER_CPU * others:
        verdict.causes.append("it got less CPU time than the others (other processes on its "
                              "cores?)")
    verdict.context.append(f"CPU time {own:.2f} cores (the others {others:.2f})")


def _cores(reports: list[_Report]) -> dict[int, float]:
    """Each rank's CPU seconds per second between the first and last report that carry them."""
    out = {}
    ranks = {k for r in reports for k in r.samples}
    for k in ranks:
        points: list[tuple[float, float]] = []
        for r in reports:
            sample = r.samples.get(k)
            if r.time is not None and sample is not None and sample.cpu_s is not None:
                points.append((r.time, sample.cpu_s))
        if len(points) >= 2 and points[-1][0] > points[0][0]:
            (t0, c0), (t1, c1) = points[0], points[-1]
            out[k] = (c1 - c0) / (t1 - t0)
    return out
