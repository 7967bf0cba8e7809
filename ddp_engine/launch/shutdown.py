"""The shutdown timeout, kept by the launcher instead of torchrun: a checkpoint save stops it.

torchrun's agent, once it stops the workers (a stop signal forwarded to them, or a worker that
failed), waits ``--shutdown-timeout`` and then SIGKILLs whatever still runs, even rank 0 in the
middle of writing a big checkpoint (the agreed stop's final save). The launcher gives the agent
a timeout it never reaches (:data:`AGENT_SHUTDOWN_S`) and keeps the run's own
``shutdown_timeout_s`` here: ranks still running that long after the shutdown began are
SIGKILLed, as torchrun would, but the time does not count while a rank is in a checkpoint save
(heartbeat phase ``save`` or ``checkpoint``) and its heartbeat is fresh: the timeout restarts
when the save ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psutil

from ddp_engine.common.heartbeat import SAVING_PHASES, STALE_S
from ddp_engine.common.processes import alive, kill

AGENT_SHUTDOWN_S = 7 * 24 * 3600
"""The agent's own shutdown timeout: a backstop only (the launcher's clock ends ranks first)."""


class ShutdownClock:
    """The run's shutdown timeout, advanced by the run monitor's ``poll_once``.

    Started by :meth:`start` (the agent forwards a stop) or by :meth:`poll_once` itself when a
    rank process of this node is gone without having completed or stopped (the agent then
    stops the others). Each poll while a rank saves a checkpoint moves the deadline to a whole
    ``timeout_s`` later.
    """

    def __init__(self, timeout_s: float, say: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, *,
                 act: Callable[[dict[int, psutil.Process]], None] | None = None,
                 doing: str = "killing them (the shutdown timeout)",
                 watch_exits: bool = True) -> None:
        """``act`` replaces the SIGKILL at the deadline (once; ``doing`` says what it does);
        ``watch_exits=False``: a rank that ended does not start the clock."""
        self.timeout_s = timeout_s
        self.say = say
        self.clock = clock
        self.act = act
        self.doing = doing
        self.watch_exits = watch_exits
        self.fired = False
        self.deadline: float | None = None
        self.why = ""
        self.killed: list[int] = []
        """Ranks this clock SIGKILLed (their pids were still running at the deadline)."""
        self._saving_said = False

    def start(self, why: str) -> None:
        """The ranks are being stopped (``why``): the timeout runs from now (once)."""
        if self.deadline is None:
            self.deadline = self.clock() + self.timeout_s
            self.why = why

    def poll_once(self, ranks: dict[int, dict[str, Any]], procs: dict[int, psutil.Process],
                  beats: Callable[[], dict[int, dict[str, Any]]]) -> list[int]:
        """One look: ``ranks`` (this node's rank files), ``procs`` (the run's processes by pid,
        as the monitor found them), ``beats`` (reads the heartbeats by rank). Returns the ranks
        killed now."""
        running = {r: procs[d["pid"]] for r, d in ranks.items()
                   if d.get("pid") in procs and alive([procs[d["pid"]]])}
        for r, d in sorted(ranks.items()):
            if (self.watch_exits and d.get("pid") in procs and r not in running
                    and d.get("state") not in ("completed", "stopped")):
                self.start(f"rank {r} ended while {d.get('state', 'running')}")
        if self.deadline is None or not running or self.fired:
            return []
        now = self.clock()
        saving = sorted(r for r, b in beats().items() if r in running
                        and b.get("phase") in SAVING_PHASES
                        and time.time() - float(b.get("time", 0)) <= STALE_S)
        if saving:
            self.deadline = max(self.deadline, now + self.timeout_s)
            if not self._saving_said:
                self._saving_said = True
                self.say(f"rank{'s' if len(saving) > 1 else ''} "
                         f"{', '.join(map(str, saving))} "
                         f"{'are' if len(saving) > 1 else 'is'} in a checkpoint save: the "
                         f"shutdown timeout ({self.timeout_s:g} s) counts from its end")
            return []
        if now < self.deadline:
            return []
        self.say(f"rank{'s' if len(running) > 1 else ''} {', '.join(map(str, sorted(running)))} "
                 f"still running {self.timeout_s:g} s after the shutdown began ({self.why}): "
                 f"{self.doing}")
        if self.act is not None:
            self.fired = True
            self.act(running)
            return []
        for proc in running.values():
            kill(_with_children(proc))
        self.killed += sorted(running)
        return sorted(running)


def _with_children(proc: psutil.Process) -> list[psutil.Process]:
    """A rank and its own children (data-loading workers): what torchrun's kill would end."""
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return [proc]
