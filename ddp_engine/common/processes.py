"""Stopping a set of processes: the one helper the launcher, the scaling sweep and the app use.

A stop goes in escalating steps, each tolerant of processes that are already gone: the agreed
stop (the ranks stop together after one step), then SIGTERM, then SIGKILL of whatever is left
(torch elastic's ``PContext.close`` does the same: signal, wait, kill). :class:`Escalation` holds
the steps and their timing for a watcher's ``poll_once``; the functions below are the steps'
tools. Waiting is done with ``psutil.wait_procs``, which notices a pid reused by another
process. Standard library and psutil only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil


def alive(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """The processes of ``procs`` still running (zombies and reused pids count as gone)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every descendant of it, the root first; empty when it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def send(procs: Iterable[psutil.Process], sig: int) -> list[psutil.Process]:
    """Send ``sig`` to each process still running; returns those it reached."""
    reached = []
    for p in alive(procs):
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)  # psutil checks first that the pid was not reused
            reached.append(p)
    return reached


def signal_group(pid: int, sig: int, process: psutil.Process | None = None) -> None:
    """Send ``sig`` to the process group that ``pid`` leads, or to ``pid`` alone when it leads
    no session of its own (a launcher started in a terminal shares its job's group, so its
    group is not the run's alone). ``process``, where known, is signalled through psutil, which
    checks that the pid was not reused. Tolerates the process being gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
        if os.getsid(pid) == pid:
            os.killpg(pid, sig)
        elif process is not None:
            process.send_signal(sig)
        else:
            os.kill(pid, sig)


def wait_gone(procs: Iterable[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` for ``procs`` to end; returns those still running.

    A child of this process is reaped by the wait (its exit status is then lost to a
    ``subprocess.Popen`` holding it): leave such a child out and poll its Popen instead.
    """
    _, still = psutil.wait_procs(alive(procs), timeout=max(0.0, timeout_s))
    return alive(still)


def kill(procs: Iterable[psutil.Process], wait_s: float = 0.0) -> list[psutil.Process]:
    """SIGKILL every process still running, then wait up to ``wait_s`` for them to be gone.
    Returns those still running after the wait."""
    killed = []
    for p in alive(procs):
        with contextlib.suppress(psutil.Error):
            p.kill()
            killed.append(p)
    return wait_gone(killed, wait_s) if wait_s > 0 else alive(killed)


def terminate_then_kill(procs: Iterable[psutil.Process], grace_s: float) -> list[int]:
    """SIGTERM the processes still running, wait up to ``grace_s``, SIGKILL the rest and wait
    ``grace_s`` again for them. Returns the pids that had to be signalled."""
    reached = send(procs, signal.SIGTERM)
    kill(wait_gone(reached, grace_s), wait_s=grace_s)
    return [p.pid for p in reached]


@dataclass
class Step:
    """One step of an escalation."""

    after_s: float
    """Seconds after the previous step before this one is taken (the first: at once)."""
    action: Callable[[], None]
    """What the step does: send the agreed stop, SIGTERM a group, SIGKILL what is left."""
    notice: str = ""
    """What to tell the user when the step is taken because the one before did not suffice."""


@dataclass
class Escalation:
    """A stop in escalating steps, advanced by the watcher's ``poll_once`` while the processes
    live on. The watcher decides when the stop is over (the processes ended); until then each
    step is taken once the previous one has had its ``after_s``.
    """

    steps: list[Step]
    clock: Callable[[], float] = time.monotonic
    taken: int = 0
    """How many steps have been taken: 0 before :meth:`start`."""
    _since: float = field(default=0.0, repr=False)

    @property
    def started(self) -> bool:
        return self.taken > 0

    @property
    def finished(self) -> bool:
        """Whether every step has been taken."""
        return self.taken >= len(self.steps)

    def start(self) -> None:
        """Take the first step now (once; later calls do nothing)."""
        if not self.started:
            self.advance()

    def advance(self) -> None:
        """Take the next step now (the user asked again), whatever time is left on this one."""
        if self.finished:
            return
        step = self.steps[self.taken]
        self.taken += 1
        self._since = self.clock()
        step.action()

    def poll_once(self) -> str | None:
        """Take the next step if its time has come. Returns its notice when one was taken."""
        if not self.started or self.finished:
            return None
        step = self.steps[self.taken]
        if self.clock() - self._since < step.after_s:
            return None
        self.advance()
        return step.notice
