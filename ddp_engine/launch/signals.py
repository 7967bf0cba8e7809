"""The launcher's own SIGINT / SIGTERM / SIGHUP: the agreed stop first, torchrun's after a
grace, a forced one on a second signal."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import psutil

from ddp_engine.common.lifeline import STOP_REQUEST_SIGNAL
from ddp_engine.common.processes import terminate_then_kill
from ddp_engine.launch.monitor import RunMonitor
from ddp_engine.launch.shutdown import ShutdownClock

SWEEP_GRACE_S = 5.0
ESCALATE_SIGNAL = signal.SIGUSR2
"""What the monitor thread sends the launcher's main thread when the agreed stop has not ended
within the grace: only the main thread can raise into torchrun's agent."""


class LauncherSignals:
    """The launcher's own SIGINT / SIGTERM / SIGHUP handling.

    torchrun is told to handle only SIGQUIT (``PET_SIGNALS_TO_HANDLE``), so these stay ours,
    and no rank, DataLoader worker or framework handler sees them (torchrun starts every rank
    in a session of its own, outside the terminal's foreground group):

    - before the agent runs ("startup"), a signal is remembered and nothing is started;
    - while the agent runs, the first signal becomes the agreed stop: each of this node's ranks
      gets :data:`~ddp_engine.common.lifeline.STOP_REQUEST_SIGNAL` (its pid alone; a rank still
      starting gets it once its rank file says "running"), every rank stops after the same
      step, rank 0 saves, and the agent ends normally (on every node of a multi-node run);
    - if the ranks have not ended ``grace_s`` later (a save does not count), the stop
      escalates as torchrun would stop it: the agent forwards the signal to every rank's
      process group, waits the shutdown timeout, then SIGKILLs;
    - a second signal forces: SIGTERM to every process of the run at once, SIGKILL
      ``SWEEP_GRACE_S`` later;
    - afterwards ("done"), a signal is only remembered: the final sweep runs anyway.
    """

    def __init__(self, monitor: RunMonitor | None = None, grace_s: float = 30.0) -> None:
        self.monitor = monitor  # set once the run folder exists
        self.seen: list[str] = []
        self.phase = "startup"
        self.agent_signals = 0
        """Signals the agent itself got (the escalation): the shutdown timeout runs from then."""
        self.exception_type: type[BaseException] | None = None
        self.asked: signal.Signals | None = None
        """The signal that asked for the agreed stop."""
        self.told: set[int] = set()
        """Pids of ranks that got the stop request."""
        self.grace = ShutdownClock(grace_s, self._say, act=self._escalate, watch_exits=False,
                                   doing="stopping them as torchrun would (the signal to "
                                         "each rank's process group)")
        self._escalating = False
        self.forced = False
        """A second signal forced the run down (its ranks' deaths are not failures)."""

    def install(self) -> None:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, self._handle)
        signal.signal(ESCALATE_SIGNAL, self._escalated)

    def _say(self, text: str) -> None:
        if self.monitor is not None:
            self.monitor.say(text)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        self.seen.append(sig.name)
        if self.phase != "agent":
            return
        if self.asked is None:
            self.asked = sig
            self._say(f"{sig.name}: asking every rank to stop at the next agreed step "
                      f"(again to force)")
            self.grace.start(f"{sig.name} to the launcher")
            if self.monitor is not None:
                self.monitor.poll_once(scan_processes=True)  # the request goes out from there
            return
        self.force()

    def poll_once(self, ranks: dict[int, dict[str, Any]], procs: dict[int, psutil.Process],
                  beats: Callable[[], dict[int, dict[str, Any]]]) -> None:
        """From the monitor's poll (``ranks``: this node's rank files): the stop request to
        every running rank that has not had it, and the grace clock."""
        if self.asked is None:
            return
        for data in ranks.values():
            pid = data.get("pid")  # only this run's: a reused folder keeps older rank files
            if pid in procs and pid not in self.told and data.get("state") == "running":
                with contextlib.suppress(OSError):
                    os.kill(pid, STOP_REQUEST_SIGNAL)
                    self.told.add(pid)
        self.grace.poll_once(ranks, procs, beats)

    def _escalate(self, _running: dict[int, psutil.Process]) -> None:
        """The agreed stop did not end in time: the main thread raises into the agent."""
        self._escalating = True
        signal.pthread_kill(threading.main_thread().ident or 0, ESCALATE_SIGNAL)

    def _escalated(self, _signum: int, _frame: FrameType | None) -> None:
        if not self._escalating or self.phase != "agent" or self.agent_signals:
            return  # not ours (or too late): nothing to do
        self.agent_signals += 1
        sig = self.asked or signal.SIGTERM
        if self.exception_type is not None:
            raise self.exception_type(f"launcher got {sig.name}", sig)  # type: ignore[call-arg]
        self.force()

    def force(self) -> None:
        """SIGTERM every process of the run now and SIGKILL what is left a little later."""
        self.forced = True
        if self.monitor is None:
            return
        self.monitor.poll_once(scan_processes=True)
        procs = list(self.monitor.procs.values())
        threading.Thread(target=terminate_then_kill, args=(procs, SWEEP_GRACE_S),
                         name="rankscope-force-stop",
                         daemon=True).start()
