"""Shared helpers: run the engine as a user would (a real subprocess), wait on conditions."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from ddp_engine.common.processes import terminate_then_kill

pytest_plugins = ["tests.simulated_nvml"]  # the simulated_nvml fixture

REPO = Path(__file__).resolve().parents[1]
FAULTY = REPO / "tests" / "ddp_engine" / "rank" / "plugins" / "faulty.py"
"""Plugins that fail, stall or slow down on purpose (losses and models for the fault tests)."""

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Nothing a test runs may touch the user's own settings (QSettings keeps them under
# $XDG_CONFIG_HOME, default ~/.config): the tests and every process they start get a config
# folder of their own.
TEST_CONFIG_HOME = Path(tempfile.mkdtemp(prefix="rankscope-test-config-"))
atexit.register(shutil.rmtree, TEST_CONFIG_HOME, ignore_errors=True)  # also at pytest's end:
# pytest_unconfigure below ends the process without the atexit handlers
os.environ["XDG_CONFIG_HOME"] = str(TEST_CONFIG_HOME)


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_engine(*args: str, timeout: float = 240, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m ddp_engine ARGS`` to the end; output captured. ``env`` adds variables."""
    return subprocess.run([sys.executable, "-m", "ddp_engine", *args], capture_output=True,
                          text=True, timeout=timeout, env={**engine_env(), **(env or {})},
                          cwd=cwd or REPO)


def start_engine(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """Start ``python -m ddp_engine ARGS`` in its own session (as the app does)."""
    f = open(log, "wb")
    return subprocess.Popen([sys.executable, "-m", "ddp_engine", *args], stdout=f,
                            stderr=subprocess.STDOUT, env=engine_env(), cwd=REPO,
                            start_new_session=True)


@contextlib.contextmanager
def endless_run(tmp_path: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A 2-rank CPU run that trains until stopped, started in its own session as the app starts
    it, with its output in tmp_path/out.log. The launcher is killed on the way out (its ranks
    then stop by themselves: parent-death signal)."""
    run_dir = tmp_path / "run"
    proc = start_engine("launch", "--nproc", "2", "--max-steps", "1000000", *extra, "--run-dir",
                        str(run_dir), log=tmp_path / "out.log")
    try:
        yield proc, run_dir
    finally:
        proc.kill()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def two_nodes(tmp_path: Path, *extra: str,
              steps: int = 1_000_000) -> Iterator[tuple[list[subprocess.Popen[bytes]], Path]]:
    """Two launchers on 127.0.0.1 as node 0 and node 1 of one run (2 CPU ranks each: world
    size 4), meeting at a free port by torchrun's c10d rendezvous, with their output in
    tmp_path/node-K.log. Node 0's run folder is tmp_path/run, node 1's its node-1 sub-folder.
    Both launchers are killed on the way out."""
    run_dir = tmp_path / "run"
    common = ("launch", "--nproc", "2", "--max-steps", str(steps), "--nnodes", "2",
              "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--run-dir", str(run_dir), *extra)
    procs = [start_engine(*common, "--node-rank", str(k), log=tmp_path / f"node-{k}.log")
             for k in (0, 1)]
    try:
        yield procs, run_dir
    finally:
        for p in procs:
            p.kill()


def wait_for(predicate: Callable[[], object], timeout: float, what: str,
             interval: float = 0.1) -> object:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def assert_default_report_steps(steps: list[int], first: int, last: int) -> None:
    """``steps`` are a run's reporting steps at the default pace (issue 29): ``first`` (the
    first multiple of 10 the run reaches), then multiples of 10 as far apart as 0.2 s asks
    (every one of them when steps are slow, fewer when they are short: not asserted, it depends
    on this machine's speed), and ``last``, the run's last step, always reported."""
    assert steps[0] == first and steps[-1] == last, steps
    assert steps == sorted(set(steps)) and all(s % 10 == 0 for s in steps[:-1]), steps


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line contains ``text`` (e.g. a unique run folder)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(text in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _gpu_count() -> int:
    """GPUs the installed torch can train on (NVML's, none with the CPU wheel)."""
    from ddp_engine.common.inventory import gpu_inventory

    return len(gpu_inventory().usable)


_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Safety net: a run that a failed test left behind (runs outlive their window by design)
    is ended, so it cannot slow the rest of CI. Tests assert no leftovers themselves."""
    _EXIT_STATUS.append(int(exitstatus))
    base = getattr(session.config, "_tmp_path_factory", None)
    if base is None:
        return
    terminate_then_kill(processes_mentioning(str(base.getbasetemp())), grace_s=10)


cuda = pytest.mark.skipif(_gpu_count() == 0,
                          reason="needs a CUDA device (none that NVML lists and torch can use)")


def make_run_folder(parent: Path, name: str, *, state: str = "completed", steps: int = 30,
                    world_size: int = 2, started: float = 1_790_000_000.0,
                    launcher_pid: int | None = None, resume: str | None = None,
                    losses: Callable[[int, int], float] = lambda step, rank: 2.0 / (1 + step),
                    checkpoint: bool = True, log_every: int = 10) -> Path:
    """A run folder as the engine leaves it (config.json, status.json, metrics.jsonl and an
    empty checkpoints/last.pt), written by hand: a fixture for listing and opening past runs."""
    import json

    run = parent / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "ranks").mkdir()
    cfg = {"model": "mlp", "dataset": "synthetic", "device": "cpu", "nproc": world_size,
           "gpus": None, "max_steps": steps, "run_dir": str(run), "runs_dir": str(parent),
           "resume": resume}
    (run / "config.json").write_text(json.dumps(cfg))
    final = state in ("completed", "stopped", "failed")
    status = {"state": state, "step": steps, "total_steps": steps, "world_size": world_size,
              "nproc": world_size, "device": "cpu", "started": started,
              "updated": started + steps, "ended": started + steps if final else None,
              "launcher_pid": launcher_pid, "last_eval": {"step": steps, "val_loss": 0.5},
              **({"checkpoint": str(run / "checkpoints" / "last.pt"), "checkpoint_step": steps}
                 if checkpoint else {})}
    (run / "status.json").write_text(json.dumps(status))
    lines = [{"type": "event", "time": started, "kind": "run_start", "total_steps": steps,
              "world_size": world_size, "start_step": 0}]
    for step in range(log_every, steps + 1, log_every):
        lines.append({"type": "metrics", "time": started + step, "step": step, "epoch": 0,
                      "total_steps": steps,
                      "ranks": [{"rank": r, "loss": losses(step, r),
                                 "samples_per_s": 100.0 * (r + 1), "step_time_s": 0.01,
                                 "device": "cpu"} for r in range(world_size)]})
    lines.append({"type": "event", "time": started + steps, "kind": "eval", "step": steps,
                  "val_loss": 0.5, "val_accuracy": 0.75})
    if final:
        lines.append({"type": "event", "time": started + steps, "kind": state, "step": steps})
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    if checkpoint:
        (run / "checkpoints" / "last.pt").write_bytes(b"")
    return run


@pytest.fixture
def fake_launcher() -> Iterator[psutil.Process]:
    """An idle process, in a session of its own, whose command line mentions ddp_engine: it
    stands for a live launcher in hand-written run folders (and is what a Stop would signal)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                             "ddp_engine"], start_new_session=True)
    try:
        process = psutil.Process(proc.pid)
        # Until it has exec'd, the child shows pytest's command line, not a launcher's (a
        # loaded machine in CI caught a liveness check in that moment).
        wait_for(lambda: "ddp_engine" in process.cmdline(), 30, "the stand-in launcher")
        yield process
    finally:
        proc.kill()
        proc.wait()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the test process as soon as pytest is done, with pytest's own exit status.

    PySide6 with pyqtgraph can crash in Qt's destructors while the interpreter shuts down
    after a run whose every test passed (pyqtgraph issue 2520; seen here once in nine full
    runs on 2026-12-04: "358 passed", then "Segmentation fault", exit 139). Every result is
    reported by now, so nothing is hidden by skipping that teardown; ``RANKSCOPE_TEST_TEARDOWN=1``
    keeps it, to look for the crash."""
    if _EXIT_STATUS and os.environ.get("RANKSCOPE_TEST_TEARDOWN") != "1":
        shutil.rmtree(TEST_CONFIG_HOME, ignore_errors=True)
        config.get_terminal_writer().flush()  # the summary line is still in its buffer
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
