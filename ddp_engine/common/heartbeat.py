"""Per-rank heartbeats: where each rank is (step and phase), and which one a stall is about.

A rank blocked in a collective cannot say so itself, but a thread of its own can. Each rank
writes ``ranks/heartbeat-N.json`` every ``interval_s``: the step it is in, the phase of the
training loop it last entered (``data``, ``forward``, ``backward``, ``optimizer``, ``report``
(reading the loss on a reporting step), ``sync`` (another host-device sync: a GradScaler's
step), ``stop_check`` (the agreement round, which carries the reports), ``checkpoint`` (every
rank, around a save), ``save`` (rank 0 writing it), ``eval``) and since when. When a run
stalls, the rank that is in a phase that does not end in a collective while the others wait in
one is the hung rank.

On CUDA the host does not wait where the code calls a collective: ``backward()`` returns once
the gradient all-reduce is *queued*, and the host runs on into the next step's data, forward
and optimizer until it reaches a host-device sync (the loss read on a reporting step, a
GradScaler's step, a checkpoint) or the GPU's launch queue fills. A rank whose peer hangs thus
shows ``forward`` or ``data`` of a later step while its GPU waits in the all-reduce. So:

- the loop enters ``report`` / ``sync`` right before such a sync point, where its host really
  waits, and calls :meth:`Heartbeat.synced` after it: ``synced_step`` is the last step whose
  device work (its collectives included) the host saw finish (on the CPU, always ``step``);
- the diagnosis counts a CUDA rank that is *ahead* (more steps done than the slowest rank) and
  not synced since (``synced_step < step``) as waiting on its GPU, whatever its host phase:
  such a rank has queued a collective that the slowest rank has not joined. The rank behind,
  or one outside a collective at the same step, is the one named.

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

COLLECTIVE_PHASES = ("backward", "report", "sync", "stop_check", "checkpoint", "eval")
"""Phases in which a rank waits for the others (gradient all-reduce, gathers, barriers; on
CUDA, a host-device sync waits for the collectives queued before it)."""
SAVING_PHASES = ("save", "checkpoint")
"""Phases of a checkpoint save (rank 0 writes, the others wait for it): the launcher gives
ranks in them more than the shutdown timeout, as long as their heartbeats stay fresh."""
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
        self.device = "cpu"
        """"cuda" once the loop knows it trains on a GPU: its host may run ahead of it."""
        self.synced_step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rankscope-heartbeat",
                                        daemon=True)

    def enter(self, phase: str, step: int) -> None:
        """The loop is now in ``phase`` of the step after ``step`` completed steps. A save's
        phases are written at once (a file write next to a checkpoint's is nothing): the
        launcher's shutdown clock must not wait a beat to see a save begin."""
        if phase != self.phase:
            self.since = time.time()
            self.phase = phase
            self.step = step
            if phase in SAVING_PHASES:
                self.write()
        self.step = step

    def synced(self, step: int) -> None:
        """The host just saw the device finish the work of ``step`` steps (a host-device sync
        point: a loss read, a GradScaler step, a checkpoint), collectives included."""
        self.synced_step = step

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
        cuda = self.device == "cuda"
        data = {"rank": self.rank, "pid": os.getpid(), "step": self.step, "phase": self.phase,
                "phase_since": self.since, "time": time.time(), "device": self.device,
                "synced_step": self.synced_step if cuda else self.step}
        # One temp file per thread: the loop writes a save's phases itself, beside the thread.
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
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


def on_gpu_behind_host(beat: dict[str, Any], low: int) -> bool:
    """Whether a rank, whatever its host phase, may be waiting on its GPU in a collective: it
    trains on CUDA, is ahead of the slowest rank (``low`` steps done) and its host has not seen
    its device finish since (the module docstring says why)."""
    step = int(beat.get("step", 0))
    return (beat.get("device") == "cuda" and step > low
            and int(beat.get("synced_step", step)) < step)


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
    steps = {r: int(b.get("step", 0)) for r, b in beats.items()}
    low = min(steps.values())
    waiting = {r: b for r, b in beats.items() if b.get("phase") in COLLECTIVE_PHASES}
    on_gpu = {r: b for r, b in beats.items()
              if r not in waiting and on_gpu_behind_host(b, low)}
    outside = {r: b for r, b in beats.items() if r not in waiting and r not in on_gpu}
    if (waiting or on_gpu) and outside:
        lead = "; ".join(f"rank {r} has been in {b['phase']} of step {int(b['step']) + 1} for "
                         f"{now - float(b['phase_since']):.0f} s"
                         for r, b in sorted(outside.items()))
        return f"{lead}, while {_waiters(waiting, on_gpu)}: look at rank {min(outside)}'s log"
    behind = sorted(r for r, s in steps.items() if s == low)
    if len(behind) < len(steps):
        return (f"rank{'s' if len(behind) > 1 else ''} {', '.join(map(str, behind))} "
                f"{'are' if len(behind) > 1 else 'is'} behind, at step {low + 1}")
    return None


def _waiters(waiting: dict[int, dict[str, Any]], on_gpu: dict[int, dict[str, Any]]) -> str:
    """The ranks that wait, in words: in which collective phase, or on their GPU."""
    parts = []
    if waiting:
        many = len(waiting) > 1
        phases = "/".join(sorted({str(b["phase"]) for b in waiting.values()}))
        parts.append(f"rank{'s' if many else ''} {', '.join(map(str, sorted(waiting)))} "
                     f"wait{'' if many else 's'} in {phases} (a collective)")
    if on_gpu:
        many = len(on_gpu) > 1
        ahead = max(int(b["step"]) for b in on_gpu.values()) + 1
        parts.append(f"rank{'s' if many else ''} {', '.join(map(str, sorted(on_gpu)))} "
                     f"wait{'' if many else 's'} on {'their GPUs' if many else 'its GPU'} in "
                     f"a collective (the host queued work up to step {ahead})")
    return " and ".join(parts)


def failure_hint(beats: dict[int, dict[str, Any]]) -> str | None:
    """The hang hint as the heartbeats stood when the first rank went silent (a run that just
    failed: its ranks are gone or being ended, so "now" is the moment of the first loss)."""
    times = [float(b["time"]) for b in beats.values() if isinstance(b.get("time"), int | float)]
    return hang_hint(beats, min(times)) if len(times) == len(beats) else None


def fmt_seconds(seconds: float) -> str:
    """A short span for people: "850 ms" under a second, "1.2 s" from one on."""
    return f"{seconds:.1f} s" if seconds >= 1 else f"{1000 * seconds:.0f} ms"


def stall_text(stall_s: float, typical_s: float | None, step: int, hint: str | None) -> str:
    """The stall alert, in the same words in the app and in the terminal."""
    typical = "unknown" if typical_s is None else fmt_seconds(typical_s)
    return (f"no progress for {stall_s:.0f} s (typical report interval {typical}); every rank "
            f"last reported step {step}: "
            + (hint or "a rank may be hung in a step or a collective (see its log)"))
