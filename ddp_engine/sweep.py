"""Scaling sweep: one config trained on 1, 2, ... N devices in turn, throughput per count.

No torch here: the app imports this module to read sweep folders. A sweep is a *run group*::

    <runs_dir>/<name>-sweep-<YYYYmmdd-HHMMSS>/   (or exactly --run-dir)
        group.json        the sweep: state, counts, steps, results per count
        nproc-1/          an ordinary run folder (docs/RUN_FOLDER.md) trained on 1 device
        nproc-2/          ... on 2 devices, and so on

Every count is an ordinary launch, ``python -m ddp_engine launch --config nproc-N/launch.toml``,
started as a child process in a session of its own (a Ctrl+C in the terminal reaches only the
sweep, which forwards one SIGTERM: the launcher's agreed stop) with the kernel's parent-death
signal armed (a sweep that is killed takes its launcher along). Counts run one after the other,
never at once. The per-process batch size is kept (weak scaling, as DDP itself scales), so ideal
scaling is a throughput ``n`` times that of one device.

group.json is rewritten atomically after every change; its only writer is the sweep process.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import psutil

from ddp_engine import devices
from ddp_engine.child_env import build_env
from ddp_engine.config import ConfigError, RunConfig, check_environment, resolved_device
from ddp_engine.lifeline import arm_parent_death
from ddp_engine.run_dir import (
    FINAL_STATES,
    atomic_write_json,
    atomic_write_text,
    iter_metrics,
    new_run_dir,
    read_json,
    read_status,
)

GROUP_FILE = "group.json"
GROUP_KIND = "scaling_sweep"
GROUP_VERSION = 1
LAUNCH_FILE = "launch.toml"
LAUNCHER_LOG = "launcher.log"
DEFAULT_STEPS = 50
MAX_DEFAULT_CPU_COUNT = 8
"""Default counts on CPU go up to the number of cores, at most this many."""

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


def subrun_name(nproc: int) -> str:
    """The folder of one count inside the group: ``nproc-N``."""
    return f"nproc-{nproc}"


# ------------------------------------------------------------------------- throughput math
def line_throughput(msg: Mapping[str, Any]) -> float | None:
    """Samples/s of one ``metrics`` line: the sum over its ranks (missing values skipped).

    Returns:
        The total, or None when no rank reported a number.
    """
    values = [r.get("samples_per_s") for r in msg.get("ranks") or []]
    numbers = [float(v) for v in values if isinstance(v, int | float)]
    return sum(numbers) if numbers else None


def line_step_time(msg: Mapping[str, Any]) -> float | None:
    """Seconds per step of one ``metrics`` line: the slowest rank's (the all-reduce makes the
    others wait for it), or None when no rank reported one."""
    values = [r.get("step_time_s") for r in msg.get("ranks") or []]
    numbers = [float(v) for v in values if isinstance(v, int | float)]
    return max(numbers) if numbers else None


def steady_median(values: Sequence[float | None]) -> float | None:
    """The median of per-report values, without the first report (warm-up) when there are 3 or
    more reports. None values are reports without a number: they count as reports for the
    warm-up rule and are then skipped.

    Args:
        values: one value per metrics line, in order.

    Returns:
        The median, or None when nothing is left.
    """
    kept = list(values[1:] if len(values) >= 3 else values)
    numbers = [v for v in kept if v is not None]
    return statistics.median(numbers) if numbers else None


def run_throughput(metrics: Iterable[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """Throughput of one run from its metrics.jsonl lines (other message types are skipped).

    Args:
        metrics: parsed metrics.jsonl lines, e.g. ``run_dir.iter_metrics(folder)``.

    Returns:
        ``(samples_per_s, step_time_s)``: medians over the metrics lines (see
        :func:`steady_median`), each None when there is no number.
    """
    lines = [m for m in metrics if m.get("type") == "metrics"]
    return (steady_median([line_throughput(m) for m in lines]),
            steady_median([line_step_time(m) for m in lines]))


def efficiencies(throughputs: Mapping[int, float | None]) -> dict[int, float | None]:
    """Scaling efficiency per process count: ``thr(n) / (thr(base) * n / base)``.

    ``base`` is the smallest count that has a throughput; counts without one get None.

    Args:
        throughputs: samples/s by process count (None: no measurement).

    Returns:
        Efficiency by process count (1.0 for the base; 1.0 everywhere is perfect scaling).
    """
    measured = {n: t for n, t in throughputs.items() if t is not None and t > 0}
    if not measured:
        return {n: None for n in throughputs}
    base = min(measured)
    per_device = measured[base] / base
    return {n: (measured[n] / (per_device * n) if n in measured else None) for n in throughputs}


def result_rows(runs: Sequence[tuple[int, str | None, float | None, float | None]]
                ) -> list[dict[str, Any]]:
    """group.json's ``results``: one row per finished count.

    Args:
        runs: ``(nproc, state, samples_per_s, step_time_s)`` per finished count.
    """
    eff = efficiencies({n: thr for n, _, thr, _ in runs})
    return [{"nproc": n, "run": subrun_name(n), "state": state, "samples_per_s": thr,
             "samples_per_s_per_device": thr / n if thr is not None else None,
             "efficiency": eff[n], "step_time_s": step_time}
            for n, state, thr, step_time in runs]


# ---------------------------------------------------------------------------------- planning
def parse_counts(text: str) -> list[int]:
    """``--counts 1,2,4`` as a list (an argparse ``type``; ranges are checked by plan_sweep)."""
    try:
        counts = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"counts must be comma-separated process counts such as 1,2,4; got {text!r}") from None
    if not counts:
        raise argparse.ArgumentTypeError(f"counts must list at least one process count such as "
                                         f"1,2,4; got {text!r}")
    return counts


@dataclasses.dataclass
class SweepPlan:
    """A checked sweep: the base config, the counts in order, and where they run."""

    cfg: RunConfig
    """The config as given (its max_steps, epochs, nproc and gpus are replaced per count)."""
    counts: list[int]
    """Process counts, ascending, each at most once."""
    steps: int
    """Optimizer steps per count."""
    device: str
    """``cuda`` or ``cpu``."""
    gpus: list[int] | None
    """The chosen GPUs on CUDA (count n uses the first n), None on CPU."""

    def group_dir(self) -> Path:
        """The group folder: ``--run-dir`` exactly, else a new ``<name>-sweep-<stamp>`` folder
        under ``runs_dir`` (created by this call)."""
        if self.cfg.run_dir:
            path = Path(self.cfg.run_dir).resolve()
            path.mkdir(parents=True, exist_ok=True)
            return path
        return new_run_dir(self.cfg.runs_dir, self.cfg.default_name() + "-sweep").resolve()

    def subrun_config(self, nproc: int, group_dir: Path) -> RunConfig:
        """The launch config of one count: the base with nproc, devices, steps and folder set."""
        suffix = "-" + subrun_name(nproc)
        return dataclasses.replace(
            self.cfg, nproc=nproc, device=self.device,
            gpus=self.gpus[:nproc] if self.gpus is not None else None, max_steps=self.steps,
            epochs=None, run_dir=str(group_dir / subrun_name(nproc)), dry_run=False,
            name=self.cfg.default_name()[:64 - len(suffix)] + suffix)


def plan_sweep(cfg: RunConfig, counts: list[int] | None = None, steps: int = DEFAULT_STEPS, *,
               gpu_count: int | None = None, cpu_count: int | None = None) -> SweepPlan:
    """Check a sweep against this machine before anything is written or started.

    Args:
        cfg: the base config (every launch flag).
        counts: process counts; default 1..nproc when the config sets nproc, else 1..(chosen
            GPUs) on CUDA, 1..min(CPU cores, 8) on CPU.
        steps: optimizer steps per count.
        gpu_count: GPUs visible (default: ask NVML).
        cpu_count: usable CPU cores (default: this process's affinity).

    Raises:
        ConfigError: naming the flag, the value and what is allowed.
    """
    gpus_seen = devices.gpu_count() if gpu_count is None else gpu_count
    cpus = devices.cpu_count() if cpu_count is None else cpu_count
    if steps < 1:
        raise ConfigError(f"steps must be >= 1, got {steps}")
    if cfg.resume is not None:
        raise ConfigError(f"resume: a sweep trains every count from scratch; drop --resume "
                          f"{cfg.resume!r}")
    device = resolved_device(cfg, gpus_seen)
    if cfg.device == "cuda" and gpus_seen == 0:
        raise ConfigError("device: 'cuda' asked for but no GPU is visible on this machine; "
                          "use --device cpu")
    if device == "cuda":
        gpus: list[int] | None = cfg.gpus if cfg.gpus is not None else list(range(gpus_seen))
        limit = len(gpus or [])
        what = f"the {limit} GPUs chosen"
    else:
        gpus = None
        limit = cpus
        what = f"the {cpus} CPU cores of this machine"
    flag = "counts"
    if counts is None:
        if cfg.nproc is not None:
            flag = "nproc"  # the largest count
        top = cfg.nproc or (limit if device == "cuda" else min(cpus, MAX_DEFAULT_CPU_COUNT))
        counts = list(range(1, top + 1))
    for n in counts:
        if n < 1:
            raise ConfigError(f"counts: {n} is not allowed; each count must be >= 1")
    if max(counts) > limit:
        raise ConfigError(f"{flag}: {max(counts)} is more than {what}; allowed: 1..{limit}")
    plan = SweepPlan(cfg, sorted(set(counts)), steps, device, gpus)
    run_dir = Path(cfg.run_dir) if cfg.run_dir else None
    if run_dir is not None and ((run_dir / GROUP_FILE).exists() or any(
            (run_dir / subrun_name(n)).exists() for n in plan.counts)):
        raise ConfigError(f"run_dir: {cfg.run_dir!r} already holds a sweep; choose a new folder")
    # The largest count is the strictest check of devices, plugins and paths.
    widest = plan.subrun_config(plan.counts[-1], run_dir or Path(cfg.runs_dir))
    check_environment(dataclasses.replace(widest, run_dir=cfg.run_dir), gpu_count=gpus_seen,
                      cpu_count=cpus)
    return plan


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
        self.finished: list[tuple[int, str | None, float | None, float | None]] = []
        self.signals: list[str] = []
        self.child: subprocess.Popen[bytes] | None = None
        self.child_nproc: int | None = None
        self._forwarded = 0
        self._force_at: float | None = None
        self._kill_at: float | None = None
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
                kill_tree(self.child.pid)
            if self.state == "running":
                self._finish("failed", f"sweep: {type(e).__name__}: {e}")
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
        self._force_at = self._kill_at = None
        self._write(current=sub.name)
        self._print(f"nproc {nproc}: training {self.plan.steps} steps (log: "
                    f"{sub / LAUNCHER_LOG})")

    def _forward_signals(self) -> None:
        assert self.child is not None
        while self._forwarded < len(self.signals):
            self._forwarded += 1
            self._terminate()
            if self._forwarded == 1:
                self._force_at = (time.monotonic() + self.plan.cfg.shutdown_timeout_s
                                  + FORCE_AFTER_S)
            elif self._kill_at is None:  # a second signal: the launcher forces its ranks
                self._force_at = None
                self._kill_at = time.monotonic() + KILL_AFTER_S

    def _terminate(self) -> None:
        assert self.child is not None
        try:
            self.child.terminate()
        except ProcessLookupError:
            pass

    def _escalate(self) -> None:
        """A launcher that outlives its stop: SIGTERM again (it forces), then SIGKILL all."""
        now = time.monotonic()
        if self._force_at is not None and now >= self._force_at:
            self._print(f"the launcher of {subrun_name(self.child_nproc or 0)} did not stop in "
                        "time: forcing")
            self._terminate()
            self._force_at = None
            self._kill_at = now + KILL_AFTER_S
        elif self._kill_at is not None and now >= self._kill_at:
            assert self.child is not None
            self._print(f"killing the launcher of {subrun_name(self.child_nproc or 0)} and its "
                        "processes")
            kill_tree(self.child.pid)
            self._kill_at = None
            self.forced = True

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
        thr, step_time = run_throughput(iter_metrics(sub))
        self.finished.append((nproc, state, thr, step_time))
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


def kill_tree(pid: int, timeout_s: float = 5.0) -> None:
    """SIGKILL a child process and every descendant; tolerates processes already gone.

    Waits for the descendants; ``pid`` itself is left for its parent (the caller's Popen) to
    reap, so that its exit status is not lost.
    """
    try:
        root = psutil.Process(pid)
        descendants = root.children(recursive=True)
    except psutil.Error:
        return
    for p in [root, *descendants]:
        try:
            p.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(descendants, timeout=timeout_s)


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


# ----------------------------------------------------------------------------------- reading
def is_group(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a run group folder (it holds group.json)."""
    return (Path(path) / GROUP_FILE).is_file()


def read_group(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """group.json of a run group folder, or None when missing, unreadable or not a sweep."""
    data = read_json(Path(path) / GROUP_FILE)
    if isinstance(data, dict) and data.get("kind") == GROUP_KIND:
        return data
    return None
