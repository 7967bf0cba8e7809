"""The launcher child: signalled as a group only when the group is the run's alone."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time

import psutil

from app.launcher_process import LauncherProcess
from ddp_engine.common.runs import process_if_alive

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)", "ddp_engine"]


def test_a_terminal_launcher_is_signalled_alone_not_with_its_pipeline() -> None:
    # `python -m ddp_engine launch ... | tee log` in an interactive shell: the launcher leads
    # the job's process group, which tee shares; the session is the shell's.
    launcher = subprocess.Popen(SLEEP, process_group=0)
    peer = subprocess.Popen(SLEEP[:3], process_group=launcher.pid)
    try:
        adopted = LauncherProcess.adopt(process_if_alive(launcher.pid))
        adopted.signal_group(signal.SIGTERM)
        assert launcher.wait(10) == -signal.SIGTERM
        assert peer.poll() is None  # tee lives on
        assert adopted.ended()
    finally:
        for p in (launcher, peer):
            p.kill()
            p.wait()


def test_a_launcher_in_its_own_session_is_signalled_with_its_group() -> None:
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            "time.sleep(600)")
    launcher = subprocess.Popen([sys.executable, "-c", code, "ddp_engine"],
                                start_new_session=True)  # as the app starts it
    children: list[psutil.Process] = []
    try:
        proc = psutil.Process(launcher.pid)
        deadline = time.monotonic() + 30
        while not proc.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        children = proc.children()
        (child,) = children  # in the launcher's group, as torchrun's agent would be
        LauncherProcess.adopt(proc).signal_group(signal.SIGTERM)
        assert launcher.wait(10) == -signal.SIGTERM
        _, alive = psutil.wait_procs([child], timeout=10)
        assert not alive  # the group's signal reached it (it would sleep 600 s otherwise)
    finally:
        launcher.kill()
        launcher.wait()
        for p in children:
            with contextlib.suppress(psutil.Error):
                p.kill()
