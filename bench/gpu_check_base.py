"""What every part of ``make gpu-check`` (bench/gpu_check.py) shares: its context, how a part
says it passed, failed or was skipped, and how it runs a command with a time limit and leaves
no process behind.

Standard library and psutil only: the GPU machine may have nothing but torch, nvidia-ml-py,
psutil and pytest, and the driver never imports torch itself (children do), so that its own
process holds no CUDA context while NVML's process list is compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ddp_engine.common.processes import terminate_then_kill
from ddp_engine.common.run_dir import tail_lines

REPO = Path(__file__).resolve().parents[1]


class Skip(Exception):  # noqa: N818 (it is not an error: the part could not run here)
    """The part cannot run here; the message says why (``no CUDA device``, ...)."""


class Fail(Exception):  # noqa: N818 (a check that failed, as the report words it)
    """The part ran and what it saw is wrong; ``tail`` is the output that shows it."""

    def __init__(self, message: str, tail: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.tail = list(tail)


@dataclass
class Outcome:
    """A part that passed: what it saw, in words with numbers, and the numbers worth keeping."""

    details: str
    numbers: dict[str, Any] = field(default_factory=dict)


@dataclass
class Ctx:
    """Shared by the parts of one check: where they work, what device, what ran before."""

    python: str
    """The interpreter every child runs with (the one running this script)."""
    work: Path
    """A folder of this check's own (run folders, logs, the profiler's trace)."""
    device: str
    """``cuda``, or ``cpu`` for a rehearsal of this script's own logic where no GPU is."""
    facts: dict[str, Any] = field(default_factory=dict)
    """The environment part's findings (torch, CUDA, GPUs, Qt)."""
    runs: dict[str, Path] = field(default_factory=dict)
    """Completed run folders by part name (run-fp32, ...), for the parts that read them."""
    timeout_s: float = 60.0
    """The running part's time limit (its own, or what is left of the check's)."""

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def need_cuda(self) -> None:
        """Skip the running part unless there is a CUDA device (or this is a CPU rehearsal)."""
        if self.cuda and not self.facts.get("cuda_available"):
            raise Skip("no CUDA device")

    def env(self, **extra: str) -> dict[str, str]:
        """A fresh environment for a child: this one, with the repository importable."""
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes (not zombies) whose command line contains ``text``, other than this one
    and its ancestors (``make gpu-check GPU_CHECK_ARGS="--work DIR"`` names DIR too)."""
    me = psutil.Process()
    mine = {me.pid, *(p.pid for p in me.parents())}
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.pid not in mine and p.info["status"] != psutil.STATUS_ZOMBIE and any(
                    text in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.Error:
            continue
    return found


def end_leftovers(marker: str) -> list[int]:
    """End every process whose command line names ``marker`` (a run folder, a work folder):
    what a timed-out command left running, so that it cannot slow the parts after it."""
    return terminate_then_kill(processes_mentioning(marker), grace_s=5)


def run_command(ctx: Ctx, argv: Sequence[str], log: Path, *, marker: str | None = None,
                env: dict[str, str] | None = None, timeout_s: float | None = None,
                preexec: Any = None, stdout_only: bool = False) -> int:
    """Run ``argv`` in a session of its own (as the app starts a launcher), output to ``log``
    (with ``stdout_only``, its stderr to ``log`` with the suffix ``.err``); its exit code. Past
    the time limit the session and every process naming ``marker`` are ended and
    :class:`Fail` is raised with the log's tail."""
    limit = ctx.timeout_s if timeout_s is None else timeout_s
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out, open(log.with_suffix(".err"), "wb") as err:
        proc = subprocess.Popen(list(argv), stdout=out,
                                stderr=err if stdout_only else subprocess.STDOUT,
                                env=env or ctx.env(), cwd=REPO, start_new_session=True,
                                preexec_fn=preexec)
        try:
            return proc.wait(timeout=max(1.0, limit))
        except subprocess.TimeoutExpired:
            with_group = [proc.pid] + [c.pid for c in _children(proc.pid)]
            terminate_then_kill(_alive(with_group), grace_s=5)
            if marker:
                end_leftovers(marker)
            proc.wait(timeout=30)
            raise Fail(f"timed out after {limit:.0f} s", tail_lines(log, 15)) from None


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _alive(pids: Sequence[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return procs


def engine(ctx: Ctx, run_dir: Path, *args: str, timeout_s: float | None = None) -> int:
    """``python -m ddp_engine launch ARGS --run-dir RUN_DIR`` to its end; its exit code. The
    launcher's output goes to RUN_DIR.log (beside the folder, which the launcher creates)."""
    argv = [ctx.python, "-m", "ddp_engine", "launch", *args, "--run-dir", str(run_dir)]
    return run_command(ctx, argv, run_dir.with_suffix(".log"), marker=str(run_dir),
                       timeout_s=timeout_s)


def python_json(ctx: Ctx, code: str, *args: str, timeout_s: float = 120) -> Any:
    """Run ``code`` in a child Python (which may import torch) and parse the JSON object its
    last output line prints. :class:`Fail` with the output when it exits non-zero."""
    try:
        proc = subprocess.run([ctx.python, "-c", code, *args], capture_output=True, text=True,
                              env=ctx.env(), cwd=REPO, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise Fail(f"python -c timed out after {timeout_s:.0f} s") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise Fail(f"python -c exited with {proc.returncode}",
                   (proc.stdout + proc.stderr).splitlines()[-15:])
    return json.loads(lines[-1])


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.2) -> Any:
    """``predicate()``'s first truthy value within ``timeout_s``, else its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


def python_version() -> str:
    return sys.version.split()[0]
