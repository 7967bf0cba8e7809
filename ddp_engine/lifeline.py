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


def arm_parent_death() -> None:
    """Ask the kernel for PARENT_DEATH_SIGNAL when the parent dies; no-op off Linux."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(PARENT_DEATH_SIGNAL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), PARENT_DEATH_SIGNAL)
