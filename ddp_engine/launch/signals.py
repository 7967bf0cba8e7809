"""The launcher's own SIGINT / SIGTERM / SIGHUP: an agreed stop first, a forced one after."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType

from ddp_engine.common.processes import terminate_then_kill
from ddp_engine.common.run_dir import (
    read_rank_files,
)
from ddp_engine.launch.monitor import RunMonitor

SWEEP_GRACE_S = 5.0



class LauncherSignals:
    """The launcher's own SIGINT / SIGTERM / SIGHUP handling.

    torchrun is told to handle only SIGQUIT (``PET_SIGNALS_TO_HANDLE``), so these stay ours:

    - before the agent runs ("startup"), a signal is remembered and nothing is started;
    - in a multi-node run (``forward_to_ranks``), the first signal goes to this node's ranks
      (they ask for the agreed stop) and the agent runs on, so that every node's agent ends
      normally; before any rank started, it is handled as below;
    - while the agent runs, the first signal raises torchrun's ``SignalException``: the agent
      forwards it to every rank (the agreed stop), waits up to the shutdown timeout, then
      SIGKILLs; any further signal forces: SIGTERM to every process of the run at once, SIGKILL
      ``SWEEP_GRACE_S`` later;
    - afterwards ("done"), a signal is only remembered: the final sweep runs anyway.
    """

    def __init__(self, monitor: RunMonitor | None = None, forward_to_ranks: bool = False) -> None:
        self.monitor = monitor  # set once the run folder exists
        self.forward_to_ranks = forward_to_ranks
        self.seen: list[str] = []
        self.phase = "startup"
        self.agent_signals = 0
        self.exception_type: type[BaseException] | None = None

    def install(self) -> None:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        self.seen.append(sig.name)
        if self.phase != "agent":
            return
        self.agent_signals += 1
        if self.agent_signals == 1 and self.forward_to_ranks and self._forward(sig):
            return
        if self.agent_signals == 1 and self.exception_type is not None:
            raise self.exception_type(f"launcher got {sig.name}", sig)  # type: ignore[call-arg]
        self.force()

    def _forward(self, sig: signal.Signals) -> bool:
        """Send ``sig`` to this node's ranks (an agreed stop on every node) and let the agent
        go on: its ranks end cleanly and it meets the other nodes' agents at torchrun's exit
        barrier, where one that left on a signal would keep them waiting 300 s. False when no
        rank has started yet."""
        if self.monitor is None:
            return False
        self.monitor.poll_once(scan_processes=True)
        sent = False
        for data in read_rank_files(self.monitor.run_dir).values():
            pid = data.get("pid")  # only this run's: a reused folder keeps older rank files
            if pid in self.monitor.procs and data.get("state") == "running":
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
                    sent = True
        return sent

    def force(self) -> None:
        """SIGTERM every process of the run now and SIGKILL what is left a little later."""
        if self.monitor is None:
            return
        self.monitor.poll_once(scan_processes=True)
        procs = list(self.monitor.procs.values())
        threading.Thread(target=terminate_then_kill, args=(procs, SWEEP_GRACE_S),
                         name="rankscope-force-stop",
                         daemon=True).start()
