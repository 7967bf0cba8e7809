"""Per-rank heartbeats: where each rank is (step and phase), and which one a stall is about.

A rank blocked in a collective cannot say so itself, but a thread of its own can. Each rank
writes ``ranks/heartbeat-N.json`` every ``interval_s``: the step it is in, the phase of the
training loop it last entered (``data``, ``forward``, ``backward``, ``optimizer``,
``stop_check`` (the agreement round, which carries the reports), ``checkpoint``, ``eval``; runs
before issue 16 also wrote ``report``) and since when. When a run stalls, the rank that is
in a phase that does not end in a collective while the others wait in one is the hung rank.

Standard library only: the app reads heartbeats to word its hang hint.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

COLLECTIVE_PHASES = ("backward", "report", "stop_check", "checkpoint", "eval")
"""Phases in which a rank waits for the others (gradient all-reduce, gathers, barriers)."""
STALE_S = 10.0
"""A heartbeat older than this: the rank's process is frozen (SIGSTOP, swapped out) or gone."""


class ReportClock:
    """When the run last reported, and how often it usually does: says when it has stalled.

    The app's store and the terminal launcher keep one each, fed with the "time" of every
    metrics message.
    """

    def __init__(self, keep: int = 20) -> None:
        self.last: float | None = None
        self.intervals: list[float] = []
        self.keep = keep

    def tick(self, when: float) -> None:
        if self.last is not None:
            self.intervals = (self.intervals + [when - self.last])[-self.keep:]
        self.last = when

    def typical_s(self) -> float | None:
        return statistics.median(self.intervals) if self.intervals else None

    def stall_s(self, now: float, factor: float = 5.0, minimum_s: float = 10.0) -> float | None:
        """Seconds since the last report when that is over ``factor`` typical intervals (and
        ``minimum_s``): the run looks hung. None while it is progressing."""
        if self.last is None:
            return None
        since = now - self.last
        typical = self.typical_s() or minimum_s
        return since if since > max(minimum_s, factor * typical) else None


def heartbeat_file(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / "ranks" / f"heartbeat-{rank}.json"


class Heartbeat:
    """The loop calls :meth:`enter` (two attribute writes); a daemon thread writes the file."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int,
                 interval_s: float = 1.0) -> None:
        self.path = heartbeat_file(run_dir, rank)
        self.rank = rank
        self.interval_s = interval_s
        self.step = 0
        self.phase = "start"
        self.since = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rankscope-heartbeat",
                                        daemon=True)

    def enter(self, phase: str, step: int) -> None:
        """The loop is now in ``phase`` of the step after ``step`` completed steps."""
        if phase != self.phase:
            self.since = time.time()
            self.phase = phase
        self.step = step

    def start(self) -> None:
        self.write()
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.interval_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.write()

    def write(self) -> None:
        """Replace the file (no fsync: a heartbeat need not survive a power cut)."""
        data = {"rank": self.rank, "pid": os.getpid(), "step": self.step, "phase": self.phase,
                "phase_since": self.since, "time": time.time()}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(data), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass  # a full disk must not take training down with it


def read_heartbeats(run_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Every rank's last heartbeat that parses, by rank."""
    out: dict[int, dict[str, Any]] = {}
    for p in (Path(run_dir) / "ranks").glob("heartbeat-*.json"):
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("rank"), int):
            out[data["rank"]] = data
    return out


def hang_hint(beats: dict[int, dict[str, Any]], now: float) -> str | None:
    """Which rank a stalled run is waiting for, in words, or None if the heartbeats do not
    single one out."""
    if len(beats) < 2:
        return None
    stale = sorted(r for r, b in beats.items() if now - float(b.get("time", 0)) > STALE_S)
    if stale:
        ages = ", ".join(f"rank {r} {now - float(beats[r]['time']):.0f} s ago" for r in stale)
        return (f"no heartbeat from {ages}: that process is frozen or gone while the others "
                "wait")
    waiting = {r: b for r, b in beats.items() if b.get("phase") in COLLECTIVE_PHASES}
    outside = {r: b for r, b in beats.items() if r not in waiting}
    if waiting and outside:
        lead = "; ".join(f"rank {r} has been in {b['phase']} of step {int(b['step']) + 1} for "
                         f"{now - float(b['phase_since']):.0f} s"
                         for r, b in sorted(outside.items()))
        phases = "/".join(sorted({str(b["phase"]) for b in waiting.values()}))
        who = ", ".join(str(r) for r in sorted(waiting))
        many = len(waiting) > 1
        return (f"{lead}, while rank{'s' if many else ''} {who} wait{'' if many else 's'} in "
                f"{phases} (a collective): look at rank {min(outside)}'s log")
    steps = {r: int(b.get("step", 0)) for r, b in beats.items()}
    low = min(steps.values())
    behind = sorted(r for r, s in steps.items() if s == low)
    if len(behind) < len(steps):
        return (f"rank{'s' if len(behind) > 1 else ''} {', '.join(map(str, behind))} "
                f"{'are' if len(behind) > 1 else 'is'} behind, at step {low + 1}")
    return None


def fmt_seconds(seconds: float) -> str:
    """A short span for people: "850 ms" under a second, "1.2 s" from one on."""
    return f"{seconds:.1f} s" if seconds >= 1 else f"{1000 * seconds:.0f} ms"


def stall_text(stall_s: float, typical_s: float | None, step: int, hint: str | None) -> str:
    """The stall alert, in the same words in the app and in the terminal."""
    typical = "unknown" if typical_s is None else fmt_seconds(typical_s)
    return (f"no progress for {stall_s:.0f} s (typical report interval {typical}); every rank "
            f"last reported step {step}: "
            + (hint or "a rank may be hung in a step or a collective (see its log)"))
