"""The launcher as a child process: its own session, a fresh environment, stop escalation.

No torch here. The launcher (``python -m ddp_engine launch``) runs in a new session and process
group, so a signal to the app or its terminal does not reach the run, and the run survives the
window. Its ranks are in sessions of their own (torchrun starts them so); the escalation below
therefore signals the launcher's group *and* every process of the run that was seen.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import psutil

from ddp_engine.common import processes
from ddp_engine.common.child_env import build_env

__all__ = ["LauncherProcess", "build_env"]


class LauncherProcess:
    """One ``python -m ddp_engine launch`` child and every process it was seen to start.

    :meth:`adopt` takes over a launcher this app did not start (an earlier app instance's, or
    one started in a terminal): it is watched and signalled the same way, but its exit code is
    unknown (status.json says how the run ended).
    """

    def __init__(self, config_path: Path, log_path: Path, env: dict[str, str],
                 argv: list[str] | None = None) -> None:
        self.argv = argv or [sys.executable, "-m", "ddp_engine", "launch", "--config",
                             str(config_path)]
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.adopted: psutil.Process | None = None
        self.seen: dict[int, psutil.Process] = {}

    @classmethod
    def adopt(cls, process: psutil.Process) -> LauncherProcess:
        """Watch a running launcher that is not this app's child."""
        self = cls(Path(), Path(), {}, argv=["<adopted>"])
        self.adopted = process
        self._remember([process.pid])
        return self

    def start(self) -> int:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         start_new_session=True)
        self._remember([self.proc.pid])
        return self.proc.pid

    @property
    def pid(self) -> int | None:
        if self.proc is not None:
            return self.proc.pid
        return self.adopted.pid if self.adopted is not None else None

    def poll(self) -> int | None:
        """The launcher's exit code once it has ended, else None (an adopted launcher's code
        is unknown: see :meth:`ended`)."""
        return self.proc.poll() if self.proc is not None else None

    def ended(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is not None
        if self.adopted is None:
            return True
        try:  # is_running() also notices a pid reused by another process
            return not self.adopted.is_running() or \
                self.adopted.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def remember_tree(self, extra_pids: Iterable[int] = ()) -> None:
        """Note the launcher's descendants and ``extra_pids`` (rank pids from status.json)."""
        pids = list(extra_pids)
        if self.pid is not None:
            pids += [p.pid for p in processes.tree(self.pid)[1:]]
        self._remember(pids)

    def _remember(self, pids: Iterable[int]) -> None:
        for pid in pids:
            if pid not in self.seen:
                with contextlib.suppress(psutil.Error):
                    self.seen[pid] = psutil.Process(pid)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the launcher's process group (tolerates it being gone).

        Only a launcher that leads a session of its own (as this app and the scaling sweep
        start it) has a group that is the run's alone; one started in a terminal shares its
        job's group (``launch ... | tee log``), so it gets the signal by itself.
        """
        pid = self.pid
        if pid is not None and not self.ended():
            processes.signal_group(pid, sig, self.adopted)

    def kill_all(self, wait_s: float = 5.0) -> None:
        """SIGKILL the launcher's group and every process of the run still alive, then wait up
        to ``wait_s`` for them to be gone (a SIGKILLed process takes a moment to exit)."""
        self.signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.poll()  # reap the launcher if it ended: its exit code is kept
        others = [p for p in self.seen.values() if self.proc is None or p.pid != self.proc.pid]
        processes.kill(others, wait_s=wait_s)
        if self.proc is not None and wait_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait_s)

    def alive(self) -> list[psutil.Process]:
        """Processes of the run that are still running (zombies excepted)."""
        if self.proc is not None:
            self.proc.poll()  # reap the launcher if it ended
        return processes.alive(self.seen.values())
