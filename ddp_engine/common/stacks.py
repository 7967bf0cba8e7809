"""Every live rank's stack, grouped by where the ranks stand (``python -m ddp_engine stacks``
and the app's Stacks action; torch-free).

The ranks are found in their rank files (``ranks/rank-N.json``: pid, host, state), in the run
folder and in the ``node-K`` sub-folders other nodes keep there. Each rank on this host is
asked for its stacks: by ``py-spy dump --native`` when py-spy is on PATH and may trace the
process (native frames too), else by its faulthandler (:mod:`ddp_engine.common.stack_dumps`;
Python frames only, no privileges needed). Neither stops nor slows the rank for more than the
dump itself. The grouped text is saved as ``ranks/stacks-<YYYYmmdd-HHMMSS>.txt``, with every
thread of every rank, so a run that then fails keeps it. In a script run the grouped text
names the user's own frames first and folds Rankscope's (:mod:`ddp_engine.common.stack_text`);
the saved dumps keep every frame.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ddp_engine.common.run_dir import (
    CONFIG_FILE,
    FINAL_STATES,
    STATUS_FILE,
    atomic_write_text,
    read_json,
    read_rank_files,
)
from ddp_engine.common.stack_dumps import STACK_SIGNAL, catches_signal, stack_file
from ddp_engine.common.stack_text import (
    Place,
    ThreadStack,
    frames_text,
    group,
    main_thread,
    parse_faulthandler,
    parse_py_spy,
    place_of,
    ranks_text,
    summary_line,
    verdict,
)

SETTLE_S = 0.15
"""A dump is whole once its file has grown and then kept its size this long: faulthandler
writes it at once, from the signal handler."""
MAX_STACK_FILE_BYTES = 4 * 1024 * 1024
"""A rank's stack file longer than this is emptied before the next request (it appends)."""
PY_SPY_ENV = "RANKSCOPE_PY_SPY"
"""Set to 0 to use faulthandler even where py-spy is on PATH."""


class NotARunFolder(ValueError):
    """The folder given is not a run folder."""


@dataclass
class RankStack:
    rank: int
    pid: int
    folder: Path
    main_ident: int | None = None
    mechanism: str = ""
    raw: str = ""
    threads: list[ThreadStack] = field(default_factory=list)
    place: Place | None = None


@dataclass
class StackReport:
    run_dir: Path
    taken: float
    ranks: dict[int, RankStack]
    """The ranks whose stacks came, by rank."""
    notes: list[str]
    """Ranks that could not be asked or did not answer, and why."""
    groups: list[tuple[list[int], Place]]
    text: str = ""
    """The grouped text: the summary, then each group's main-thread stack."""
    path: Path | None = None
    """The saved file (the grouped text and every thread of every rank)."""
    script: bool = False
    """A user's own script runs (config.json's ``script``): Rankscope's frames are folded."""

    @property
    def mechanism(self) -> str:
        """Which mechanism took the stacks: "faulthandler", "py-spy" or both."""
        return ", ".join(sorted({r.mechanism for r in self.ranks.values()})) or "none"

    @property
    def summary(self) -> str:
        return summary_line(self.groups)


def rank_folders(run_dir: Path) -> list[Path]:
    """The run folder and the node sub-folders (node-K) that other nodes keep in it."""
    return [run_dir, *sorted(p for p in run_dir.glob("node-*") if (p / "ranks").is_dir())]


def check_run_folder(run_dir: str | os.PathLike[str]) -> Path:
    """``run_dir`` as a Path; :class:`NotARunFolder` when it is not a run folder."""
    folder = Path(run_dir)
    if not folder.is_dir():
        raise NotARunFolder(f"run_dir: {str(run_dir)!r} is not a folder")
    if not any((folder / name).exists() for name in (CONFIG_FILE, STATUS_FILE, "ranks")):
        raise NotARunFolder(f"run_dir: {str(run_dir)!r} is not a run folder (no config.json, "
                            "status.json or ranks/ in it)")
    return folder


def live_ranks(run_dir: Path) -> tuple[list[RankStack], list[str]]:
    """The ranks that can be asked for their stacks, and notes on those that cannot."""
    here = socket.gethostname()
    found: dict[int, RankStack] = {}
    notes = []
    for folder in rank_folders(run_dir):
        for rank, data in sorted(read_rank_files(folder).items()):
            if rank in found or data.get("state") in FINAL_STATES:
                continue
            pid = data.get("pid")
            host = data.get("host")
            if not isinstance(pid, int):
                continue
            if host and host != here:
                notes.append(f"rank {rank}: on host {host}, not this one ({here}); a process "
                             "can only be signalled on its own host: run this command there")
                continue
            why = _not_the_rank(pid, data)
            if why:
                if why != "gone":
                    notes.append(f"rank {rank}: {why}")
                continue
            ident = data.get("main_thread")
            found[rank] = RankStack(rank, pid, folder, ident if isinstance(ident, int) else None)
    return [found[r] for r in sorted(found)], notes


def _not_the_rank(pid: int, data: dict[str, Any]) -> str:
    """Why ``pid`` is not a live rank that answers stack requests ("" if it is; "gone" if no
    such process runs). STACK_SIGNAL would end any other process: never guess."""
    try:
        proc = psutil.Process(pid)
        started = proc.create_time()
        if proc.status() == psutil.STATUS_ZOMBIE:
            return "gone"
    except psutil.Error:
        return "gone"
    written = data.get("time")
    if isinstance(written, int | float) and started > written + 1:
        return "gone"  # the pid was reused after the rank wrote its file
    caught = catches_signal(pid)
    if caught is None:
        return f"pid {pid}: cannot tell whether it answers stack requests (no /proc here)"
    if not caught:
        return (f"pid {pid} does not answer stack requests (started by an older Rankscope, or "
                "not at its training yet)")
    return ""


def take_stacks(run_dir: str | os.PathLike[str], timeout_s: float = 10.0,
                save: bool = True) -> StackReport:
    """Take the stacks of every live rank that this host can reach, group them and (``save``)
    write them to ``ranks/stacks-<time>.txt``.

    Raises:
        NotARunFolder: ``run_dir`` is not a run folder.
    """
    folder = check_run_folder(run_dir)
    taken = time.time()
    ranks, notes = live_ranks(folder)
    answered = {}
    py_spy = shutil.which("py-spy") if os.environ.get(PY_SPY_ENV) != "0" else None
    rest = []
    for r in ranks:
        if py_spy and _by_py_spy(py_spy, r, timeout_s, notes):
            answered[r.rank] = r
        else:
            rest.append(r)
    for r in _by_faulthandler(rest, timeout_s, notes):
        answered[r.rank] = r
    for r in answered.values():
        thread = main_thread(r.threads, r.main_ident)
        r.place = place_of(thread.frames if thread else [])
    groups = group({r: s.place for r, s in answered.items() if s.place is not None})
    config = read_json(folder / CONFIG_FILE)
    report = StackReport(folder, taken, answered, notes, groups,
                         script=isinstance(config, dict) and bool(config.get("script")))
    report.text = render(report)
    if save and answered:
        report.path = _save(report)
    return report


def _by_py_spy(py_spy: str, r: RankStack, timeout_s: float, notes: list[str]) -> bool:
    """``py-spy dump --native`` of one rank; False (and why, in ``notes``) if it did not work
    (it needs ptrace permission: same user, and ptrace_scope or CAP_SYS_PTRACE allowing it)."""
    try:
        done = subprocess.run([py_spy, "dump", "--native", "--full-filenames", "--pid",
                               str(r.pid)],
                              capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        notes.append(f"rank {r.rank}: py-spy did not answer ({e}); faulthandler instead")
        return False
    threads = parse_py_spy(done.stdout) if done.returncode == 0 else []
    if not threads:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        notes.append(f"rank {r.rank}: py-spy failed ({why}); faulthandler instead")
        return False
    r.mechanism, r.raw, r.threads = "py-spy", done.stdout, threads
    return True


def _by_faulthandler(ranks: list[RankStack], timeout_s: float,
                     notes: list[str]) -> list[RankStack]:
    """Signal each rank, then read what each appended to its stack file."""
    offsets: dict[int, int] = {}
    for r in ranks:
        path = stack_file(r.folder, r.rank)
        try:
            size = path.stat().st_size
            if size > MAX_STACK_FILE_BYTES:
                os.truncate(path, 0)  # the rank appends (O_APPEND): it writes at the new end
                size = 0
            os.kill(r.pid, STACK_SIGNAL)
        except OSError as e:
            notes.append(f"rank {r.rank}: could not ask pid {r.pid} for its stacks: "
                         f"{e.strerror or e}")
            continue
        offsets[r.rank] = size
    waiting = {r.rank: r for r in ranks if r.rank in offsets}
    seen: dict[int, tuple[int, float]] = {}  # rank -> (size, since)
    deadline = time.monotonic() + timeout_s
    done = []
    while waiting and time.monotonic() < deadline:
        time.sleep(0.02)
        now = time.monotonic()
        for rank, r in list(waiting.items()):
            try:
                size = stack_file(r.folder, rank).stat().st_size
            except OSError:
                continue
            if size <= offsets[rank]:
                continue
            if seen.get(rank, (None, 0.0))[0] != size:
                seen[rank] = (size, now)
            elif now - seen[rank][1] >= SETTLE_S:
                r.raw = _read_from(stack_file(r.folder, rank), offsets[rank])
                r.mechanism, r.threads = "faulthandler", parse_faulthandler(r.raw)
                done.append(waiting.pop(rank))
    for rank in waiting:
        notes.append(f"rank {rank}: wrote no stacks within {timeout_s:g} s (frozen, or "
                     "ending)")
    return done


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", errors="replace")


def render(report: StackReport) -> str:
    """The grouped text: one summary line, the notes, then each group's main-thread stack."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.taken))
    lines = [f"Stacks of {len(report.ranks)} rank{'s' if len(report.ranks) != 1 else ''} of "
             f"{report.run_dir}, taken {stamp} by {report.mechanism}"]
    if report.groups:
        lines.append(report.summary)
        said = verdict(report.groups)
        lines += [said] if said else []
    lines += [f"note: {n}" for n in report.notes]
    for ranks, place in report.groups:
        first = report.ranks[ranks[0]]
        thread = main_thread(first.threads, first.main_ident)
        lines += ["", f"== {ranks_text(ranks)}: {place.text()}",
                  f"main thread of rank {first.rank} (pid {first.pid}), most recent call first:",
                  frames_text(thread.frames if thread else [], fold=report.script)]
    return "\n".join(lines) + "\n"


def _save(report: StackReport) -> Path:
    """Write the grouped text and every rank's whole dump to ranks/stacks-<time>.txt."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(report.taken))
    folder = report.run_dir / "ranks"
    path = folder / f"stacks-{stamp}.txt"
    for i in range(1, 100):
        if not path.exists():
            break
        path = folder / f"stacks-{stamp}-{i}.txt"
    parts = [report.text]
    for rank, r in sorted(report.ranks.items()):
        parts.append(f"\n---- rank {rank} (pid {r.pid}), every thread, by {r.mechanism}:\n"
                     f"{r.raw.rstrip()}\n")
    atomic_write_text(path, "".join(parts))
    return path
