"""Every run under a runs folder, summarized for a list: the app's Runs panel and scripts.

Standard library and psutil only (the GUI imports this). A run is a folder holding any of
status.json, config.json or monitor.json; a scaling sweep is a folder holding group.json, whose
sub-folders are its runs. Whether a run is *live* is decided from processes, not from files: a
run whose launcher was SIGKILLed still says "running" in status.json, so the launcher's (or, for
a run started by plain torchrun, rank 0's) pid is checked, with its start time, so a reused pid
does not count.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ddp_engine.common.protocol import MONITOR_FILE
from ddp_engine.common.run_dir import (
    CONFIG_FILE,
    FINAL_STATES,
    METRICS_FILE,
    STATUS_FILE,
    MetricsTail,
    read_json,
    read_status,
    tail_lines,
)
from ddp_engine.common.sweep_plan import GROUP_FILE, is_group

RUN_MARKERS = (STATUS_FILE, CONFIG_FILE, MONITOR_FILE)
ENGINE_SCRIPT = "rankscope-engine"
"""The console script of ``python -m ddp_engine`` (pyproject.toml)."""
INTERRUPTED = "interrupted"
"""The state shown for a run whose status.json says it is active but whose processes are gone
(its launcher was killed, or the machine restarted)."""


def fmt_number(value: object, rate: bool = False) -> str:
    """A number for people (status, the launcher's lines): 4 significant digits, a rate as a
    whole number with thousands separators; "n/a" for none."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "n/a"
    if rate:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def fmt_duration(seconds: float | None) -> str:
    """``m:ss`` or ``h:mm:ss``; ``?`` for an unknown or impossible duration."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    m, s = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def process_if_alive(pid: Any, started: Any = None, hostname: Any = None,
                     mentions: str | None = "ddp_engine") -> psutil.Process | None:
    """The process ``pid`` if it is the one a run file names, else None.

    It must run here (``hostname``, when given, is this machine's: a run folder on a shared
    file system may belong to another machine), be running (a zombie has ended), not have been
    created after ``started`` (a pid reused by a later process is not the one meant) and, when
    ``mentions`` is set, run that module (every process of ours runs ``-m ddp_engine`` or
    ``-m ddp_engine.worker``, or the ``rankscope-engine`` script), so a reused pid is never
    signalled.
    """
    if not isinstance(pid, int) or pid <= 0:
        return None
    if isinstance(hostname, str) and hostname != socket.gethostname():
        return None
    try:
        proc = psutil.Process(pid)
        if isinstance(started, int | float) and proc.create_time() > float(started) + 1.0:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if mentions and not any(part == mentions or part.startswith(mentions + ".")
                                or os.path.basename(part) == ENGINE_SCRIPT
                                for part in proc.cmdline()):
            return None
        return proc
    except psutil.Error:
        return None


def owner_process(run_dir: str | os.PathLike[str],
                  status: dict[str, Any] | None = None) -> psutil.Process | None:
    """The live process that owns a run: its launcher (status.json's launcher_pid) or, for a run
    started by plain torchrun (no status.json), rank 0 (monitor.json's pid). None if neither is
    alive on this machine."""
    status = read_status(run_dir) if status is None else status
    if status:
        return process_if_alive(status.get("launcher_pid"), status.get("started"),
                                status.get("hostname"))
    path = Path(run_dir) / MONITOR_FILE
    monitor = read_json(path)
    if not isinstance(monitor, dict):
        return None
    started = monitor.get("started")
    if started is None:  # written before monitor.json carried it: the file's own time
        with contextlib.suppress(OSError):
            started = path.stat().st_mtime
    return process_if_alive(monitor.get("pid"), started, monitor.get("hostname"))


def sweep_process(group: dict[str, Any]) -> psutil.Process | None:
    """The live sweep process of a group.json, if it runs on this machine."""
    return process_if_alive(group.get("sweep_pid"), group.get("started"), group.get("hostname"))


def final_event(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The last ``completed`` / ``stopped`` / ``failed`` event of metrics.jsonl, if the run
    wrote one (how a run without a launcher, started by plain torchrun, says it ended)."""
    for line in reversed(tail_lines(Path(run_dir) / METRICS_FILE, 20)):
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if isinstance(m, dict) and m.get("type") == "event" and m.get("kind") in FINAL_STATES:
            return m
    return None


def natural_key(name: str) -> list[Any]:
    """Sort key that puts nproc-2 before nproc-10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / m).exists() for m in RUN_MARKERS)


def parent_run(config: dict[str, Any]) -> Path | None:
    """The run a resumed run continues: the folder whose checkpoints/ holds its resume file."""
    resume = config.get("resume")
    if not resume:
        return None
    ckpt = Path(str(resume))
    if ckpt.parent.name == "checkpoints":
        return ckpt.parent.parent
    return None


@dataclass
class RunSummary:
    """One line of the runs list."""

    path: Path
    kind: str = "run"  # "run" or "sweep"
    state: str = "unknown"
    live: bool = False
    model: str | None = None
    dataset: str | None = None
    device: str | None = None
    nproc: int | None = None
    gpus: list[int] | None = None
    step: int | None = None
    total_steps: int | None = None
    best_loss: float | None = None
    val_loss: float | None = None
    started: float | None = None
    ended: float | None = None
    updated: float | None = None
    hostname: str | None = None  # where it ran, when that is not this machine
    reason: str | None = None
    parent: Path | None = None
    has_checkpoint: bool = False
    children: list[RunSummary] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def duration_s(self) -> float | None:
        if self.started is None:
            return None
        end = self.ended
        if end is None:
            end = time.time() if self.live else self.updated
        return None if end is None else max(0.0, end - self.started)

    @property
    def devices(self) -> str:
        if self.gpus:
            return "GPU " + ",".join(str(g) for g in self.gpus)
        if self.nproc:
            return f"{self.device or 'cpu'} x{self.nproc}"
        return self.device or ""

    @property
    def resumable(self) -> bool:
        return (self.kind == "run" and not self.live and self.has_checkpoint
                and self.state in ("stopped", "failed", INTERRUPTED, "completed"))

    @property
    def deletable(self) -> bool:
        """Not live, and not possibly live on another machine (a shared runs folder)."""
        return not (self.live or (self.hostname and self.state not in FINAL_STATES)
                    or any(not c.deletable for c in self.children))


class _LossScan:
    """The lowest mean-over-ranks training loss of a metrics.jsonl, read incrementally."""

    CHUNK_BYTES = 1 << 20

    def __init__(self, run_dir: Path) -> None:
        self.tail = MetricsTail(run_dir)
        self.best: float | None = None
        self.caught_up = False  # read to the end at least once: ``best`` is the run's

    def update(self, deadline: float) -> None:
        """Read what was appended, a chunk at a time, until the end or ``deadline``."""
        while time.monotonic() < deadline:
            for m in self.tail.poll(self.CHUNK_BYTES):
                self._take(m)
            if self.tail.at_end:
                self.caught_up = True
                return

    def _take(self, m: dict[str, Any]) -> None:
        if m.get("type") != "metrics":
            return
        losses = [r.get("loss") for r in m.get("ranks", []) if isinstance(r, dict)]
        values = [float(v) for v in losses if isinstance(v, int | float) and math.isfinite(v)]
        if values:
            mean = sum(values) / len(values)
            if self.best is None or mean < self.best:
                self.best = mean


SCRIPT_DATASET = "(script)"
"""What the Runs list shows as a user's script's dataset (its data are its own)."""


def what_trains(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """A run's model and dataset as the Runs list shows them; a user's script is its file's
    name (its model and data are its own)."""
    script = config.get("script")
    if isinstance(script, str) and script:
        return Path(script).name, SCRIPT_DATASET
    return config.get("model"), config.get("dataset")


class RunIndex:
    """The runs under one folder. :meth:`refresh` rescans: two small JSON files per run, and
    each metrics.jsonl only where it grew since the last call, within a time budget per call
    (a folder of long runs lists at once; best losses fill in over the next calls)."""

    def __init__(self, runs_dir: str | os.PathLike[str], budget_s: float = 0.5) -> None:
        self.runs_dir = Path(runs_dir)
        self.budget_s = budget_s
        self.pending = False
        """Some metrics.jsonl is not read to its end yet: call :meth:`refresh` again soon."""
        self._scans: dict[Path, _LossScan] = {}
        self._deadline = 0.0

    def refresh(self) -> list[RunSummary]:
        """Every run and sweep group, newest first."""
        self._deadline = time.monotonic() + self.budget_s
        out: list[RunSummary] = []
        seen: set[Path] = set()
        try:
            entries = list(os.scandir(self.runs_dir))
        except OSError:
            entries = []
        for entry in entries:
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            path = Path(entry.path)
            if is_group(path):
                out.append(self._group(path, seen))
            elif is_run_dir(path):
                out.append(self.summarize(path))
                seen.add(path)
        for gone in set(self._scans) - seen:
            del self._scans[gone]
        self.pending = not all(scan.caught_up and scan.tail.at_end
                               for scan in self._scans.values())
        out.sort(key=lambda s: (s.started or 0.0, s.name), reverse=True)
        return out

    def summarize_any(self, path: Path) -> RunSummary:
        """The summary of one run folder or sweep group folder."""
        return self._group(path, set()) if is_group(path) else self.summarize(path)

    def summarize(self, path: Path) -> RunSummary:
        """One run folder's summary."""
        status = read_status(path)
        config = read_json(path / CONFIG_FILE)
        config = config if isinstance(config, dict) else {}
        s = RunSummary(path=path)
        s.model, s.dataset = what_trains(config)
        s.device = config.get("device")
        s.nproc = config.get("nproc")
        s.gpus = config.get("gpus")
        s.parent = parent_run(config)
        s.has_checkpoint = (path / "checkpoints" / "last.pt").is_file()
        here = socket.gethostname()
        if status:
            s.state = str(status.get("state") or "unknown")
            host = status.get("hostname")
            s.hostname = host if isinstance(host, str) and host != here else None
            s.step = status.get("step")
            s.total_steps = status.get("total_steps")
            s.started = status.get("started")
            s.ended = status.get("ended")
            s.updated = status.get("updated")
            s.reason = status.get("reason")
            s.nproc = status.get("nproc") or s.nproc
            s.device = status.get("device") or s.device
            val = (status.get("last_eval") or {}).get("val_loss")
            s.val_loss = float(val) if isinstance(val, int | float) else None
        if not status:  # plain torchrun: metrics.jsonl's last event says how it ended
            end = final_event(path)
            if end is not None:
                s.state, s.step = str(end["kind"]), end.get("step")
                s.ended = end.get("time")
        if s.state not in FINAL_STATES and s.hostname is None:
            s.live = owner_process(path, status) is not None
            if s.live and not status:
                s.state = "running"  # plain torchrun: only rank 0's server says so
            elif not s.live and status:
                s.state = INTERRUPTED
                s.reason = s.reason or ("its launcher is gone (killed, or the machine "
                                        "restarted) without recording how the run ended")
        if s.started is None:
            with contextlib.suppress(OSError):
                s.started = path.stat().st_mtime
        scan = self._scans.get(path)
        if scan is None:
            scan = self._scans[path] = _LossScan(path)
        scan.update(self._deadline)
        s.best_loss = scan.best if scan.caught_up else None
        return s

    def _group(self, path: Path, seen: set[Path]) -> RunSummary:
        data = read_json(path / GROUP_FILE)
        data = data if isinstance(data, dict) else {}
        s = RunSummary(path=path, kind=str(data.get("kind") or "group"))
        config: dict[str, Any] = data["config"] if isinstance(data.get("config"), dict) else {}
        s.model, s.dataset = what_trains(config)
        s.device = data.get("device") or config.get("device")
        counts = [c for c in data.get("counts") or [] if isinstance(c, int)]
        s.nproc = max(counts) if counts else None
        s.state = str(data.get("state") or "unknown")
        s.started = data.get("started")
        s.ended = data.get("ended")
        s.reason = data.get("reason")
        s.total_steps = data.get("steps")
        host = data.get("hostname")
        s.hostname = host if isinstance(host, str) and host != socket.gethostname() else None
        if s.state not in FINAL_STATES and s.hostname is None:
            s.live = sweep_process(data) is not None
            if not s.live:
                s.state = INTERRUPTED
        for child in sorted((p for p in path.iterdir() if is_run_dir(p)),
                            key=lambda p: natural_key(p.name)):
            s.children.append(self.summarize(child))
            seen.add(child)
        losses = [c.best_loss for c in s.children if c.best_loss is not None]
        s.best_loss = min(losses) if losses else None
        return s


def walk(summaries: list[RunSummary]) -> Iterator[RunSummary]:
    """Every summary and, after each, its children (a sweep's runs)."""
    for s in summaries:
        yield s
        yield from walk(s.children)


def find(summaries: list[RunSummary], path: Path) -> RunSummary | None:
    """The summary of ``path`` among ``summaries`` and their children."""
    return next((s for s in walk(summaries) if s.path == path), None)
