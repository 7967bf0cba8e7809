"""A rank's tie to its launcher (standard library only, imported before torch).

Linux sends PARENT_DEATH_SIGNAL to a rank when the process that started it (torchrun's agent,
inside the launcher) dies, even by SIGKILL. Until the worker installs its handler (after the
slow imports) that signal's default action ends the process; afterwards it asks for the agreed
stop and, if the rank cannot get there in time (hung in a step), ends it anyway.
"""

from __future__ import annotations

import ctypes
import os
import signal

PARENT_DEATH_SIGNAL = signal.SIGUSR1


def arm_parent_death(sig: signal.Signals = PARENT_DEATH_SIGNAL,
                     parent_pid: int | None = None) -> None:
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
