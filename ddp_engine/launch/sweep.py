"""The scaling sweep's runner, ``python -m ddp_engine sweep``: each count of a planned sweep
(:mod:`ddp_engine.common.sweep_plan`) trained in turn, group.json after every change.

Every count is an ordinary launch, ``python -m ddp_engine launch --config nproc-N/launch.toml``,
started as a child process in a session of its own (a Ctrl+C in the terminal reaches only the
sweep, which forwards one SIGTERM: the launcher's agreed stop) with the kernel's parent-death
signal armed (a sweep that is killed takes its launcher along). Counts run one after the other,
never at once. group.json is rewritten atomically after every change; its only writer is the
sweep process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from ddp_engine.common.child_env import build_env
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.lifeline import arm_parent_death
from ddp_engine.common.processes import Escalation, Step, kill, tree, wait_gone
from ddp_engine.common.reasons import one_line
from ddp_engine.common.run_dir import (
    FINAL_STATES,
    atomic_write_json,
    atomic_write_text,
    iter_metrics,
    read_status,
)
from ddp_engine.common.sweep_plan import (
    DEFAULT_STEPS,
    GROUP_FILE,
    GROUP_KIND,
    GROUP_VERSION,
    LAUNCH_FILE,
    LAUNCHER_LOG,
    SweepPlan,
    plan_sweep,
    result_rows,
    run_throughput,
    subrun_name,
)

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_FORCED = 130
EXIT_STOPPED = 0
"""A stop the launcher agreed with its ranks is a normal end, as for ``launch``."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FORCE_AFTER_S = 30.0
"""After a forwarded stop, seconds beyond the run's shutdown_timeout_s before a second SIGTERM
(the launcher then forces its ranks down)."""
KILL_AFTER_S = 20.0
"""Seconds after that second SIGTERM before the launcher and its processes are SIGKILLed."""


# ----------------------------------------------------------------------------------- running
class Sweep:
    """Runs a plan: one launcher child at a time, group.json after every change.

    Stop: SIGINT, SIGTERM or SIGHUP to this process is forwarded as one SIGTERM per signal to
    the current launcher (the first gives its agreed stop, a second forces); no further count
    starts. A launcher that does not end in time is sent a second SIGTERM and finally SIGKILLed
    with every process it started.
    """

    def __init__(self, plan: SweepPlan, out: TextIO = sys.stdout) -> None:
        self.plan = plan
        self.group_dir = Path()
        self.out = out
        self.env = build_env()
        self.pending = list(plan.counts)
        self.finished: list[tuple[int, str | None, float | None, float | None, int]] = []
        self.signals: list[str] = []
        self.child: subprocess.Popen[bytes] | None = None
        self.child_nproc: int | None = None
        self._forwarded = 0
        self.stopping = Escalation([])  # the stop of the current launcher, once asked for
        self.forced = False
        self.state = "running"
        self.reason: str | None = None
        self.data: dict[str, Any] = {}

    def open(self) -> Path:
        """Create the group folder and write the first group.json. Returns the folder."""
        self.group_dir = self.plan.group_dir()
        self.data = {
            "kind": GROUP_KIND, "version": GROUP_VERSION, "state": "running",
            "counts": self.plan.counts, "steps": self.plan.steps, "device": self.plan.device,
            "config": self.plan.cfg.to_dict(), "started": time.time(), "ended": None,
            "sweep_pid": os.getpid(), "hostname": socket.gethostname(), "current": None,
            "reason": None, "results": []}
        self._write()
        return self.group_dir

    def _write(self, **fields: Any) -> None:
        self.data.update(fields)
        atomic_write_json(self.group_dir / GROUP_FILE, self.data)

    def _print(self, line: str) -> None:
        print(f"[rankscope] {line}", file=self.out, flush=True)

    # ------------------------------------------------------------------------------ signals
    def install_signals(self) -> None:
        """Handle SIGINT / SIGTERM / SIGHUP: remember them; poll_once forwards them."""
        for s in STOP_SIGNALS:
            signal.signal(s, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals.append(signal.Signals(signum).name)

    # ------------------------------------------------------------------------------ the loop
    def run(self, interval_s: float = 0.1) -> int:
        """Run every count (or until stopped or failed) after :meth:`open`. Returns the exit
        code."""
        try:
            while self.poll_once():
                if self.child is not None:
                    try:
                        self.child.wait(timeout=interval_s)
                    except subprocess.TimeoutExpired:
                        pass
        except BaseException as e:  # a bug of ours: leave no launcher and no "running" group
            if self.child is not None:
                kill_tree(self.child)
            if self.state == "running":
                self._finish("failed", "sweep: " + one_line(f"{type(e).__name__}: {e}"))
            raise
        return self.exit_code()

    def exit_code(self) -> int:
        if self.state == "completed":
            return EXIT_COMPLETED
        if self.state == "stopped":
            return EXIT_FORCED if self.forced else EXIT_STOPPED
        return EXIT_FAILED

    def poll_once(self) -> bool:
        """One step: forward signals, escalate, collect an ended count, start the next one.

        Returns:
            True while the sweep goes on.
        """
        if self.child is not None:
            self._forward_signals()
            if self.child.poll() is None:
                self._escalate()
                return True
            self._collect()
        if self.state != "running":
            return False
        if not self.pending:
            return self._finish("completed", None)
        if self.signals:
            return self._finish("stopped", self._stop_reason(""))
        self._start(self.pending.pop(0))
        return True

    def _start(self, nproc: int) -> None:
        sub = self.group_dir / subrun_name(nproc)
        sub.mkdir(parents=True, exist_ok=True)
        config_path = sub / LAUNCH_FILE
        atomic_write_text(config_path, self.plan.subrun_config(nproc, self.group_dir).to_toml())
        argv = [sys.executable, "-m", "ddp_engine", "launch", "--config", str(config_path)]
        sweep_pid = os.getpid()
        with open(sub / LAUNCHER_LOG, "ab") as log:
            self.child = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True,
                preexec_fn=lambda: arm_parent_death(signal.SIGTERM, sweep_pid))
        self.child_nproc = nproc
        self._forwarded = 0
        self.stopping = Escalation([])  # none yet: made by the first signal
        self._write(current=sub.name)
        self._print(f"nproc {nproc}: training {self.plan.steps} steps (log: "
                    f"{sub / LAUNCHER_LOG})")

    def _escalation(self) -> Escalation:
        """The stop of the current launcher: the agreed stop (one SIGTERM, which it forwards to
        its ranks), a second SIGTERM if it outlives its shutdown timeout (it then forces its
        ranks down), and SIGKILL of it and every process it started."""
        name = subrun_name(self.child_nproc or 0)
        return Escalation([
            Step(0.0, self._terminate),
            Step(self.plan.cfg.shutdown_timeout_s + FORCE_AFTER_S, self._terminate,
                 f"the launcher of {name} did not stop in time: forcing"),
            Step(KILL_AFTER_S, self._kill, f"killing the launcher of {name} and its processes")])

    def _forward_signals(self) -> None:
        """One step of the stop per signal: the first starts it, the second forces at once,
        any further one is a SIGTERM more."""
        while self._forwarded < len(self.signals):
            self._forwarded += 1
            if self._forwarded == 1:
                self.stopping = self._escalation()
                self.stopping.start()
            elif self.stopping.taken < 2:
                self.stopping.advance()
            else:
                self._terminate()

    def _terminate(self) -> None:
        assert self.child is not None
        with contextlib.suppress(ProcessLookupError):
            self.child.terminate()

    def _kill(self) -> None:
        assert self.child is not None
        kill_tree(self.child)
        self.forced = True

    def _escalate(self) -> None:
        """A launcher that outlives its stop: SIGTERM again (it forces), then SIGKILL all."""
        notice = self.stopping.poll_once()
        if notice:
            self._print(notice)

    def _collect(self) -> None:
        """The current count has ended: read its outcome and decide how the sweep goes on."""
        assert self.child is not None and self.child_nproc is not None
        nproc, code = self.child_nproc, self.child.returncode
        self.child = self.child_nproc = None
        sub = self.group_dir / subrun_name(nproc)
        status = read_status(sub) or {}
        state = status.get("state")
        if state not in FINAL_STATES:
            state = "failed"
            why = (f"the launcher exited with code {code} without a final state "
                   f"(see {sub / LAUNCHER_LOG})")
        else:
            why = status.get("reason") or ""
        if code == EXIT_FORCED or status.get("forced"):
            self.forced = True
        lines = [m for m in iter_metrics(sub) if m.get("type") == "metrics"]
        thr, step_time = run_throughput(lines)
        self.finished.append((nproc, state, thr, step_time, len(lines)))
        rows = result_rows(self.finished)
        self._write(results=rows, current=None)
        row = rows[-1]
        if thr is None:
            line = f"nproc {nproc}: {state}, no throughput measured"
        else:
            eff = row["efficiency"]
            line = (f"nproc {nproc}: {thr:.0f} samples/s ({row['samples_per_s_per_device']:.0f} "
                    f"per device), efficiency {eff:.2f}")
            if state != "completed":
                line += f" ({state})"
        self._print(line)
        if row["warning"]:
            self._print(f"nproc {nproc}: warning: {row['warning']}")
        if self.signals:
            self._finish("stopped", self._stop_reason(f" during {sub.name}"))
        elif state == "failed":
            self._finish("failed", f"count {nproc} ({sub.name}) failed: {why}")
        elif state == "stopped":
            self._finish("stopped", f"{sub.name} was stopped: {why}")

    def _stop_reason(self, where: str) -> str:
        reason = f"stop requested ({', '.join(self.signals)}){where}"
        if self.forced:
            reason += " (forced: the run did not stop in time)"
        if self.pending:
            reason += f"; counts not run: {', '.join(map(str, self.pending))}"
        return reason

    def _finish(self, state: str, reason: str | None) -> bool:
        self.state, self.reason = state, reason
        self._write(state=state, reason=reason, ended=time.time(), current=None)
        self._print(f"sweep {state}" + (f": {reason}" if reason else "") + f"; {self.group_dir}")
        return False


def kill_tree(child: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
    """SIGKILL a child process and every descendant; tolerates processes already gone.

    Waits for the descendants; the child itself is left for its Popen to reap, so that its
    exit status is not lost.
    """
    procs = tree(child.pid)
    kill(procs)
    wait_gone(procs[1:], timeout_s)


def run_sweep(cfg: RunConfig, counts: list[int] | None = None, steps: int = DEFAULT_STEPS, *,
              out: TextIO = sys.stdout) -> int:
    """A whole sweep from the command line: check, (dry run: print), run, report.

    Returns:
        The exit code: 0 completed (or stopped by request), 1 a count failed, 2 bad input
        (nothing written), 130 a stop that had to be forced.
    """
    try:
        plan = plan_sweep(cfg, counts, steps)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if cfg.dry_run:
        where = (Path(cfg.run_dir) if cfg.run_dir
                 else Path(cfg.runs_dir) / f"{cfg.default_name()}-sweep-<timestamp>")
        print(f"sweep of {plan.steps} steps per count on {plan.device}: counts "
              f"{', '.join(map(str, plan.counts))} into {where}", file=out)
        for n in plan.counts:
            argv = plan.subrun_config(n, where.resolve()).to_argv()
            print(f"{subrun_name(n)}: python -m ddp_engine launch {' '.join(argv)}", file=out)
        return EXIT_COMPLETED
    sweep = Sweep(plan, out)
    sweep.install_signals()  # first: a stop from now on ends the sweep with a record
    group_dir = sweep.open()
    print(f"[rankscope] sweep folder {group_dir}: counts {', '.join(map(str, plan.counts))}, "
          f"{plan.steps} steps each on {plan.device}", file=out, flush=True)
    return sweep.run()
