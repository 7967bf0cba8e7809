"""Each rank's stack on request: Python's faulthandler, registered on a signal (stdlib only).

A rank calls :func:`arm_stack_dumps` once its run folder is known, before it says it is
running in its rank file: from then on STACK_SIGNAL makes it append the stack of every one of
its threads to ``ranks/stack-<rank>.txt``. faulthandler does that in its C signal handler,
without the GIL and without running Python code, so it answers while the main thread is busy
in Python and while it is blocked in C (a gloo or NCCL collective), and the rank trains on: no
Python-level handler is installed (none could run while a collective blocks, and one could
break a blocking call with EINTR), and the handler is registered with SA_RESTART (``chain``
False), so an interrupted system call is restarted rather than failed.

The file is opened in append mode; a reader notes its size, sends the signal and reads what
is appended after that offset (:mod:`ddp_engine.common.stacks`).
"""

from __future__ import annotations

import faulthandler
import os
import signal
from pathlib import Path
from typing import IO

STACK_SIGNAL: int = int(getattr(signal, "SIGRTMIN", signal.SIGUSR2)) + (
    6 if hasattr(signal, "SIGRTMIN") else 0)
"""The signal that asks a rank for its stacks: a real-time signal, used by nothing else here
(+4 is the ranks' parent-death signal, +5 the launcher's stop request; SLURM sends
SIGUSR1/SIGUSR2).
Its default action ends a process, so a reader signals only a process that catches it
(:func:`catches_signal`)."""

_armed: dict[str, IO[str]] = {}  # the open stack file, kept for the process's lifetime


def stack_file(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` appends its stacks."""
    return Path(run_dir) / "ranks" / f"stack-{rank}.txt"


def arm_stack_dumps(run_dir: str | os.PathLike[str], rank: int) -> Path | None:
    """Make STACK_SIGNAL append every thread's stack to this rank's stack file. Best effort:
    a rank that cannot open the file trains on without it (None), and readers then never
    signal it (it does not catch the signal)."""
    path = stack_file(run_dir, rank)
    try:
        f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's lifetime)
    except OSError:
        return None
    old = _armed.pop("file", None)
    faulthandler.register(STACK_SIGNAL, file=f, all_threads=True, chain=False)
    _armed["file"] = f
    if old is not None:
        old.close()
    return path


def catches_signal(pid: int, sig: int = STACK_SIGNAL) -> bool | None:
    """Whether process ``pid`` has a handler for ``sig`` (Linux: /proc/PID/status SigCgt),
    None when that cannot be read (not Linux, or no such process)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        return None
    return None
