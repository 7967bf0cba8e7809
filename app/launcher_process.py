"""The launcher as a child process: its own session, a fresh environment, stop escalation.

No torch here. The launcher (``python -m ddp_engine launch``) runs in a new session and process
group, so a signal to the app or its terminal does not reach the run, and the run survives the
window. Its ranks are in sessions of their own (torchrun starts them so); the escalation below
therefore signals the launcher's group *and* every process of the run that was seen.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import psutil


def build_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """A fresh environment for one launch (the app's own os.environ is never changed)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONUNBUFFERED"] = "1"
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("QT_QPA_PLATFORM", None)  # the run has no window
    return env


class LauncherProcess:
    """One ``python -m ddp_engine launch`` child and every process it was seen to start."""

    def __init__(self, config_path: Path, log_path: Path, env: dict[str, str]) -> None:
        self.argv = [sys.executable, "-m", "ddp_engine", "launch", "--config", str(config_path)]
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.seen: dict[int, psutil.Process] = {}

    def start(self) -> int:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         start_new_session=True)
        self._remember([self.proc.pid])
        return self.proc.pid

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def poll(self) -> int | None:
        """The launcher's exit code once it has ended, else None."""
        return self.proc.poll() if self.proc is not None else None

    def remember_tree(self, extra_pids: Iterable[int] = ()) -> None:
        """Note the launcher's descendants and ``extra_pids`` (rank pids from status.json)."""
        pids = list(extra_pids)
        if self.proc is not None:
            with contextlib.suppress(psutil.Error):
                pids += [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        self._remember(pids)

    def _remember(self, pids: Iterable[int]) -> None:
        for pid in pids:
            if pid not in self.seen:
                with contextlib.suppress(psutil.Error):
                    self.seen[pid] = psutil.Process(pid)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the launcher's process group (tolerates it being gone)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def kill_all(self) -> None:
        """SIGKILL the launcher's group and every process of the run still alive."""
        self.signal_group(signal.SIGKILL)
        for p in self.alive():
            with contextlib.suppress(psutil.Error):
                p.kill()

    def alive(self) -> list[psutil.Process]:
        """Processes of the run that are still running (zombies excepted)."""
        if self.proc is not None:
            self.proc.poll()  # reap the launcher if it ended
        out = []
        for p in self.seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                continue
        return out
