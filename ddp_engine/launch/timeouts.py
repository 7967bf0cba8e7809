"""A rank that died of a collective timeout, in words.

On NCCL a collective that waits longer than the process-group timeout (``dist_timeout_s``) is
caught by ProcessGroupNCCL's watchdog thread, which logs "Watchdog caught collective operation
timeout: WorkNCCL(SeqNum=.., OpType=ALLREDUCE, ..) ran for 120005 milliseconds before timing
out" and tears the process down with SIGABRT (signal 6). torchrun then reports only "killed by
SIGABRT", which says nothing of a hang. Every rank that waited in the collective dies that way;
the hung rank, which never joined it, is the one to look at, and the heartbeats say which.
"""

from __future__ import annotations

import os
from pathlib import Path

from ddp_engine.common.run_dir import tail_lines

WATCHDOG_MARKS = ("Watchdog caught collective operation timeout",
                  "ProcessGroupNCCL's watchdog")
"""What NCCL's watchdog logs when a collective timed out, or when it got stuck itself."""
LOG_LINES = 400
"""How much of the end of a rank's log is searched for the watchdog's words."""


def watchdog_line(log: str | os.PathLike[str] | None) -> str | None:
    """The first line near the end of a rank's log where NCCL's watchdog says a collective
    timed out (or it got stuck), shortened; None when there is none."""
    if log is None:
        return None
    for line in tail_lines(Path(log), LOG_LINES):
        for mark in WATCHDOG_MARKS:
            at = line.find(mark)
            if at >= 0:
                text = line[at:].strip()
                return text if len(text) <= 200 else text[:199] + "…"
    return None


def timeout_part(ranks: list[int], signalled: bool, line: str | None, timeout_s: float) -> str:
    """The failure reason's words for ``ranks``, ended by a collective timeout: SIGABRT
    (``signalled``) and/or the watchdog's ``line`` in a log."""
    many = len(ranks) > 1
    who = f"rank{'s' if many else ''} {', '.join(map(str, ranks))}"
    limit = (f"a collective waited longer than the process-group timeout ({timeout_s:g} s, "
             "dist_timeout_s)")
    if line is None:  # SIGABRT alone: NCCL's watchdog is the usual sender, not the only one
        return (f"{who} {'were' if many else 'was'} aborted (SIGABRT), most likely by a "
                f"collective timeout: NCCL's watchdog aborts a rank when {limit}")
    how = "aborted by NCCL's watchdog (SIGABRT)" if signalled else "ended by NCCL's watchdog"
    return f"{who} hit a collective timeout, {how}: {limit}; the log says \"{line}\""
