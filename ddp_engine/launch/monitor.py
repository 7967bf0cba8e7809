"""Watching a run from the launcher: RUN_DIR/status.json kept current, the ranks' heartbeats and
processes noted, rank 0's metrics read back for the progress lines and the stall hints."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import psutil

from ddp_engine.common.heartbeat import (
    ReportClock,
    fmt_seconds,
    hang_hint,
    read_heartbeats,
    stall_text,
)
from ddp_engine.common.lifeline import named_signal
from ddp_engine.common.reasons import one_line
from ddp_engine.common.run_dir import (
    FINAL_STATES,
    STATUS_FILE,
    MetricsTail,
    atomic_write_json,
    read_rank_files,
)
from ddp_engine.common.runs import fmt_duration, fmt_number
from ddp_engine.common.straggler import StragglerWatch
from ddp_engine.launch.shutdown import ShutdownClock

PROGRESS_WRITE_S = 1.0
"""How often status.json is rewritten for progress alone (the step, the latest metrics)."""


class StatusFile:
    """status.json, rewritten atomically; the launcher is its only writer."""

    def __init__(self, folder: Path, **initial: Any) -> None:
        self.path = folder / STATUS_FILE
        # Re-entrant: the launcher's signal handlers poll the monitor on the main thread (a
        # second Ctrl+C forces the run down from there), which may be inside an update already
        # (the first Ctrl+C's poll): a plain lock deadlocked the launcher there.
        self._lock = threading.RLock()
        self.error: OSError | None = None
        self._dirty = False  # progress changed since the last write
        self._written = 0.0  # time.monotonic() of the last write
        self.data: dict[str, Any] = {"state": "starting", "step": 0, "epoch": 0,
                                     "launcher_pid": os.getpid(), "pids": {},
                                     "hostname": socket.gethostname(),
                                     "started": time.time(), **initial}
        self._write()

    def update(self, **fields: Any) -> None:
        """Change fields and write the file now, fsynced (a state, a checkpoint, the end)."""
        with self._lock:
            if self.data.get("state") in FINAL_STATES and "state" not in fields:
                return
            changed = any(self.data.get(k) != v for k, v in fields.items())
            self.data.update(fields)
            if changed or self._dirty:
                self._write()

    def progress(self, **fields: Any) -> None:
        """Change progress fields (step, epoch, the latest metrics): written at most every
        :data:`PROGRESS_WRITE_S`, not fsynced, the rest at :meth:`flush` or the next write.
        A report every quarter second made the launcher fsync four times a second: 0.35 ms of
        CPU and a journal commit each, on a machine whose every core trains."""
        with self._lock:
            if self.data.get("state") in FINAL_STATES:
                return
            self._dirty |= any(self.data.get(k) != v for k, v in fields.items())
            self.data.update(fields)
        self.flush()

    def flush(self) -> None:
        """Write progress not yet written once :data:`PROGRESS_WRITE_S` has passed since the
        last write (called on every poll, so a stalled run's last step is still written)."""
        with self._lock:
            if self._dirty and time.monotonic() - self._written >= PROGRESS_WRITE_S:
                self._write(sync=False)

    def _write(self, sync: bool = True) -> None:
        self._dirty, self._written = False, time.monotonic()
        try:
            atomic_write_json(self.path, {**self.data, "updated": time.time()}, sync=sync)
        except OSError as e:  # a full disk: the terminal still gets every line
            if self.error is None:
                print(f"[rankscope] warning: {self.path} cannot be written ({e.strerror}); "
                      "it may show an older state", file=sys.stderr, flush=True)
            self.error = e


UNAVAILABLE_WORDS = {"sync": "gradient sync timing", "samples": "samples/s and forward time",
                     "loss": "loss"}
"""What the keys of a script run's ``unavailable`` event are, in words."""


class RunMonitor(threading.Thread):
    """Follows metrics.jsonl and the rank files: updates status.json, prints progress, and
    remembers every process of the run for the final sweep."""

    def __init__(self, run_dir: Path, status: StatusFile, out: TextIO, world_size: int = 1,
                 interval_s: float = 0.25, process_scan_s: float = 2.0, node_rank: int = 0,
                 beat_print_s: float = 10.0) -> None:
        super().__init__(name="rankscope-run-monitor", daemon=True)
        self.run_dir = run_dir
        self.status = status
        self.out = out
        self.interval_s = interval_s
        self.world_size = world_size
        self.tail = MetricsTail(run_dir, from_end=True)  # not what an earlier run left
        self.procs: dict[int, psutil.Process] = {}
        self.process_scan_s = process_scan_s  # a recursive scan reads all of /proc: ~2 ms
        self._next_scan = 0.0
        self.total_steps: int | None = None
        self.last_step = 0
        self.stop_reason: str | None = None
        self._stop_event = threading.Event()
        self._rate: list[tuple[float, int]] = []
        self.clock = ReportClock()
        self.stragglers = StragglerWatch()  # fed every report, printed with the latest
        self.hang_hint: str | None = None
        """While the run is stalled: which rank it waits for, from the heartbeats, as first
        diagnosed (later looks see the consequences: a rank that timed out and exited)."""
        self._stall_printed = 0.0
        self.node_rank = node_rank
        """Above 0: global rank 0, with metrics.jsonl, is on another node; this node's
        progress comes from its ranks' heartbeats, printed every ``beat_print_s``."""
        self.beat_print_s = beat_print_s
        self._beat_printed = 0.0
        self._first_beat: float | None = None
        self.shutdown: ShutdownClock | None = None
        """The run's shutdown timeout, kept here (see :mod:`ddp_engine.launch.shutdown`)."""
        self.stop_signalled: Callable[[], bool] = lambda: False
        """Whether the agent was told to stop the ranks: the shutdown timeout runs from then."""
        self.stop_requests: Callable[[dict[int, dict[str, Any]], dict[int, psutil.Process],
                                      Callable[[], dict[int, dict[str, Any]]]], None] | None
        self.stop_requests = None
        """Called each poll with this node's rank files, the run's processes and a heartbeat
        reader: the launcher's stop request goes to ranks as they start (see
        :class:`~ddp_engine.launch.signals.LauncherSignals`)."""
        self.asked_signal: Callable[[], str | None] = lambda: None
        """The signal this node's launcher got and turned into a stop request, if one did."""
        self.each_poll: list[Callable[[], None]] = []
        """Called at the end of every poll (the node watch's check of a lost node 0)."""

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.poll_once()

    def request_stop(self) -> None:
        self._stop_event.set()

    def poll_once(self, scan_processes: bool = False) -> bool:
        """One look at the run folder (and every ``process_scan_s`` at the process tree).
        Returns True if anything was new."""
        self._remember_processes(force=scan_processes)
        new = self.tail.poll()
        # Of consecutive metrics, only the latest is printed and written to status.json: a
        # poll's worth of reports costs one write (on a machine whose every core trains).
        latest = None
        for msg in new:
            if msg.get("type") == "metrics":
                self.clock.tick(float(msg.get("time") or time.time()))
                self.stragglers.add(msg)
                latest = msg
                continue
            if latest is not None:
                self._progress(latest)
                latest = None
            self._handle(msg)
        if latest is not None:
            self._progress(latest)
        if self.node_rank:
            self._beats()
        else:
            self._check_stall()
        first = self.node_rank * self.world_size  # this node's ranks only
        ranks = {r: d for r, d in read_rank_files(self.run_dir).items()
                 if first <= r < first + self.world_size}
        if self.stop_requests is not None:
            self.stop_requests(ranks, self.procs, lambda: read_heartbeats(self.run_dir))
        if self.shutdown is not None:
            if self.stop_signalled():
                self.shutdown.start("a stop signal")
            self.shutdown.poll_once(ranks, self.procs, lambda: read_heartbeats(self.run_dir))
        pids = {str(r): d.get("pid") for r, d in sorted(ranks.items())}
        if pids:
            self.status.update(pids=pids)
        if len(ranks) >= self.world_size and self.status.data.get("state") == "starting" and all(
                d.get("state") == "running" for d in ranks.values()):
            self.status.update(state="running")
        self.status.flush()  # progress held back by the write interval
        for check in list(self.each_poll):
            try:
                check()
            except Exception as e:  # noqa: BLE001 - a broken check turns itself off, said
                self.each_poll.remove(check)
                name = getattr(getattr(check, "func", check), "__name__", "a check")
                self.say(f"warning: {name} failed and is off for the rest of this run: "
                         + one_line(f"{type(e).__name__}: {e}"))
        return bool(new)

    def _beats(self) -> None:
        """Progress of a node other than 0: its ranks' steps, from their heartbeats."""
        beats = read_heartbeats(self.run_dir)
        steps = [b["step"] for b in beats.values() if isinstance(b.get("step"), int)]
        if not steps:
            return
        self.last_step = min(steps)
        self.status.progress(step=self.last_step)
        now = time.monotonic()
        if self._first_beat is None:
            self._first_beat = now
        # The first line waits until every rank of this node beat (or a print interval has
        # passed), so that it names them all.
        everyone = len(beats) >= self.world_size or now - self._first_beat >= self.beat_print_s
        if everyone and now - self._beat_printed >= self.beat_print_s:
            self._beat_printed = now
            self._print(f"node {self.node_rank}: ranks {', '.join(map(str, sorted(beats)))} at "
                        f"step {self.last_step} (node 0 has the metrics, checkpoints and "
                        "telemetry)")

    def _check_stall(self, print_every_s: float = 30.0) -> None:
        """The app's hang hint, for a terminal user: printed when reports stop coming (5
        typical intervals, at least 10 s) and every ``print_every_s`` while they stay away."""
        now = time.time()
        stall = self.clock.stall_s(now)
        if stall is None or self.status.data.get("state") not in ("running", "stopping"):
            if self.hang_hint is not None:
                self.hang_hint = None
                self.status.update(stall=None)
            return
        hint = hang_hint(read_heartbeats(self.run_dir), now)
        self.hang_hint = self.hang_hint or hint
        text = stall_text(stall, self.clock.typical_s(), self.last_step, hint)
        if now - self._stall_printed >= print_every_s:
            self._stall_printed = now
            self._print(text)
            self.status.update(stall=text)

    def _remember_processes(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_scan:
            return
        self._next_scan = now + self.process_scan_s
        try:
            for child in psutil.Process().children(recursive=True):
                self.procs.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def _handle(self, msg: dict[str, Any]) -> None:
        kind = msg.get("kind") if msg.get("type") == "event" else msg.get("type")
        if kind == "run_start":
            self.total_steps = msg.get("total_steps")
            self.status.update(state="running", total_steps=self.total_steps,
                               world_size=msg.get("world_size"))
            if msg.get("source") == "script":
                self._print(f"training: {msg.get('world_size')} ranks ({msg.get('backend')}), "
                            f"script {msg.get('script')}"
                            + (f", stopped after {self.total_steps} steps"
                               if self.total_steps else ""))
            else:
                self._print(f"training: {msg.get('world_size')} ranks ({msg.get('backend')}), "
                            f"{self.total_steps} steps, {msg.get('steps_per_epoch')} per "
                            f"epoch, from step {msg.get('start_step')}")
        elif kind == "unavailable":
            items = msg.get("items") or {}
            self.status.update(unavailable=items)
            for what, why in items.items():
                self._print(f"not measured: {UNAVAILABLE_WORDS.get(what, what)}: {why}")
        elif kind == "epoch_start":
            self.status.update(epoch=msg.get("epoch"))
        elif kind == "eval":
            extra = (f", accuracy {fmt_number(msg['val_accuracy'])}" if "val_accuracy" in msg
                     else "")
            took = (f" (took {fmt_seconds(msg['eval_s'])})"
                    if isinstance(msg.get("eval_s"), int | float) else "")
            self._print(f"eval at step {msg.get('step')}: val loss "
                        f"{fmt_number(msg.get('val_loss'))}{extra}{took}")
            self.status.update(last_eval={k: msg.get(k) for k in
                                          ("step", "val_loss", "val_accuracy", "eval_s")
                                          if k in msg})
        elif kind == "checkpoint_saved":
            paths = msg.get("paths") or []
            self.status.update(checkpoint=paths[0] if paths else None,
                               checkpoint_step=msg.get("step"))
            self._print(f"checkpoint saved at step {msg.get('step')}: {', '.join(paths)}")
        elif kind == "warning":  # a loss spike, a non-finite loss, a dropped viewer
            self._print(f"warning: {msg.get('message')}")
        elif kind == "stopping":
            reason = msg.get("reason")
            self.stop_reason = named_signal(reason, self.asked_signal()) if reason else reason
            self.status.update(state="stopping", step=msg.get("step"))
            self._print(f"stopping at step {msg.get('step')} ({self.stop_reason}); all ranks "
                        "agreed")

    def _progress(self, msg: dict[str, Any]) -> None:
        step = int(msg.get("step", 0))
        self._stall_printed = 0.0
        self.last_step = step
        self.status.progress(step=step, epoch=msg.get("epoch"), last_metrics=msg)
        ranks = msg.get("ranks") or []
        losses = " ".join(f"r{r['rank']}={fmt_number(r.get('loss'))}" for r in ranks)
        rate = sum(r.get("samples_per_s") or 0.0 for r in ranks)
        now = time.time()
        self._rate.append((now, step))
        self._rate = self._rate[-20:]
        eta = "?"
        total = self.total_steps or msg.get("total_steps")
        if total and len(self._rate) >= 2 and self._rate[-1][1] > self._rate[0][1]:
            steps_per_s = (self._rate[-1][1] - self._rate[0][1]) / (
                self._rate[-1][0] - self._rate[0][0] + 1e-9)
            eta = fmt_duration((total - step) / steps_per_s)
        straggler = self.stragglers.verdict  # once sustained: see common/straggler.py
        self._print(f"step {step}/{total or '?'} epoch {msg.get('epoch')} | loss {losses} | "
                    f"{rate:,.0f} samples/s | ETA {eta}"
                    + (f" | straggler: {straggler.text}" if straggler else ""))

    def _print(self, line: str) -> None:
        print(f"[rankscope] {line}", file=self.out, flush=True)

    def say(self, line: str) -> None:
        """A line for the terminal, as the monitor's own (``[rankscope] ...``)."""
        self._print(line)


def fmt_mib(n: int | None) -> str:
    return "memory unknown" if n is None else f"{n / 2**20:,.0f} MiB"
