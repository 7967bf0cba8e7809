"""A rank's ties to its launcher (standard library only, imported before torch).

Two real-time signals, which no framework, SLURM (``--signal=USR1@N``), docker or a terminal
sends, so a script's own SIGUSR1/SIGTERM handlers never meet them:

- :data:`PARENT_DEATH_SIGNAL`: Linux sends it to a rank when the process that started it
  (torchrun's agent, inside the launcher) dies, even by SIGKILL. Until the worker installs its
  handler (after the slow imports) its default action ends the process; afterwards it asks
  for the agreed stop and, if the rank cannot get there in time (hung in a step), ends it.
- :data:`STOP_REQUEST_SIGNAL`: the launcher's "stop at the next agreed step", sent to each of
  its node's ranks (their pids only, never their process groups: DataLoader workers and the
  script's own handlers see nothing) when the launcher itself gets SIGTERM, SIGINT or SIGHUP.
"""

from __future__ import annotations

import ctypes
import os
import signal

_RT = int(getattr(signal, "SIGRTMIN", 0))
PARENT_DEATH_SIGNAL: int = _RT + 4 if _RT else int(signal.SIGUSR1)
STOP_REQUEST_SIGNAL: int = _RT + 5 if _RT else int(signal.SIGUSR2)
"""Both above SIGRTMIN+2 (glibc's own) and apart from the stack-dump signal (SIGRTMIN+6)."""
ASKED_BY_SIGNAL = "a stop signal to"
"""How a rank's stop reason for :data:`STOP_REQUEST_SIGNAL` starts (:func:`asked_by_signal`);
the launcher that got the signal puts its name in its place."""


def asked_by_signal(node: int | None) -> str:
    """A rank's stop reason when its launcher asked (``node``: its node in a multi-node run)."""
    return f"{ASKED_BY_SIGNAL} {'the' if node is None else f'node {node}' + chr(39) + 's'} " \
           "launcher"


def named_signal(reason: str, name: str | None) -> str:
    """A stop reason with the launcher's own signal named (``SIGTERM to the launcher``), where
    ``name`` is the signal that launcher got."""
    return reason.replace(ASKED_BY_SIGNAL, f"{name} to") if name else reason


def signal_name(signum: int) -> str:
    """``SIGTERM``, or ``SIGRTMIN+5`` for a real-time signal (not a :class:`signal.Signals`)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - _RT}" if _RT and signum >= _RT else f"signal {signum}"


def arm_parent_death(sig: int = PARENT_DEATH_SIGNAL, parent_pid: int | None = None) -> None:
    """Ask the kernel for ``sig`` when the parent dies; no-op off Linux.

    Args:
        sig: the signal to get; the scaling sweep arms SIGTERM for its launchers (an agreed
            stop), the default is the ranks' own.
        parent_pid: the parent expected to be alive (it may be pid 1 in a container); default:
            any parent but init.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    parent = os.getppid()
    gone = parent == 1 if parent_pid is None else parent != parent_pid
    if gone:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)
