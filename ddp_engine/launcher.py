"""The launcher: validate, write the run folder, run torchrun in-process, report, clean up.

The launcher process *is* torchrun's elastic agent: it builds a torchrun command line, parses it
with torchrun's own parser and runs it through ``torch.distributed.run.run``. The agent starts
one worker per device (each in its own session), forwards SIGINT/SIGTERM/SIGHUP to them, waits
``--shutdown-timeout`` and then SIGKILLs. Around that the launcher:

- validates the config against this machine before anything starts (exit 2 on bad input);
- keeps RUN_DIR/status.json current from a monitor thread and prints progress lines;
- turns the agent's outcome into a final state (completed, stopped, failed) with a reason;
- sweeps every process of the run (SIGTERM, then SIGKILL) so none outlives it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import psutil

from ddp_engine import devices
from ddp_engine.config import ConfigError, RunConfig, check_environment, resolved_device
from ddp_engine.run_dir import (
    CONFIG_FILE,
    FINAL_STATES,
    STATUS_FILE,
    MetricsTail,
    atomic_write_json,
    new_run_dir,
    prepare_run_dir,
    rank_log_files,
    read_rank_files,
    tail_lines,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_FORCED = 130
SWEEP_GRACE_S = 5.0


@dataclasses.dataclass
class Plan:
    """Everything a launch needs, resolved: the config, the devices and the command."""

    cfg: RunConfig
    device: str
    env: dict[str, str]
    """Variables set for the workers (on top of the launcher's own environment)."""
    torchrun_args: list[str]
    """torchrun's arguments (without the leading ``torchrun``)."""

    def command(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} torchrun {shlex.join(self.torchrun_args)}"


def plan_launch(cfg: RunConfig, *, create_run_dir: bool = True) -> Plan:
    """Resolve devices, process count and run folder; check everything a user could get wrong.

    Raises:
        ConfigError: bad input, naming the field, the value and what is allowed.
    """
    inventory = devices.list_gpus()
    cpus = devices.cpu_count()
    check_environment(cfg, gpu_count=len(inventory), cpu_count=cpus)
    if cfg.resume:
        from ddp_engine import checkpoint  # imports torch: only when there is a file to check

        checkpoint.load(cfg.resume)
    device = resolved_device(cfg, len(inventory))
    changes: dict[str, Any] = {"device": device}
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    if device == "cuda":
        gpus = cfg.gpus if cfg.gpus is not None else list(range(cfg.nproc or len(inventory)))
        changes.update(gpus=gpus, nproc=len(gpus))
        env["CUDA_VISIBLE_DEVICES"] = devices.visible_devices_for(gpus, inventory)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", str(max(1, cpus // len(gpus))))
    else:
        nproc = cfg.nproc or min(2, cpus)
        changes.update(nproc=nproc, gpus=None)
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks must not grab a GPU
        env["OMP_NUM_THREADS"] = str(max(1, cpus // nproc))
    if cfg.run_dir:
        run_dir = Path(cfg.run_dir).resolve()
        if create_run_dir:
            prepare_run_dir(run_dir)
    elif create_run_dir:
        run_dir = prepare_run_dir(new_run_dir(cfg.runs_dir, cfg.default_name()).resolve())
    else:
        run_dir = Path(cfg.runs_dir).resolve() / f"{cfg.default_name()}-<timestamp>"
    changes["run_dir"] = str(run_dir)
    changes["resume"] = str(Path(cfg.resume).resolve()) if cfg.resume else None
    resolved = dataclasses.replace(cfg, **changes)
    args = ["--standalone", "--nnodes", "1", "--nproc-per-node", str(resolved.nproc),
            "--log-dir", str(run_dir / "logs"), "--redirects", "3",
            "--monitor-interval", "0.2", "--shutdown-timeout", str(cfg.shutdown_timeout_s),
            "-m", "ddp_engine.worker", "--config", str(run_dir / CONFIG_FILE)]
    return Plan(resolved, device, env, args)


class StatusFile:
    """status.json, rewritten atomically; the launcher is its only writer."""

    def __init__(self, folder: Path, **initial: Any) -> None:
        self.path = folder / STATUS_FILE
        self._lock = threading.Lock()
        self.data: dict[str, Any] = {"state": "starting", "step": 0, "epoch": 0,
                                     "launcher_pid": os.getpid(), "pids": {},
                                     "started": time.time(), **initial}
        self._write()

    def update(self, **fields: Any) -> None:
        with self._lock:
            if self.data.get("state") in FINAL_STATES and "state" not in fields:
                return
            changed = any(self.data.get(k) != v for k, v in fields.items())
            self.data.update(fields)
            if changed:
                self._write()

    def _write(self) -> None:
        atomic_write_json(self.path, {**self.data, "updated": time.time()})


class RunMonitor(threading.Thread):
    """Follows metrics.jsonl and the rank files: updates status.json, prints progress, and
    remembers every process of the run for the final sweep."""

    def __init__(self, run_dir: Path, status: StatusFile, out: TextIO,
                 interval_s: float = 0.25) -> None:
        super().__init__(name="rankscope-run-monitor", daemon=True)
        self.run_dir = run_dir
        self.status = status
        self.out = out
        self.interval_s = interval_s
        self.tail = MetricsTail(run_dir)
        self.procs: dict[int, psutil.Process] = {}
        self.total_steps: int | None = None
        self.last_step = 0
        self.stop_reason: str | None = None
        self._stop_event = threading.Event()
        self._rate: list[tuple[float, int]] = []

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.poll_once()

    def request_stop(self) -> None:
        self._stop_event.set()

    def poll_once(self) -> bool:
        """One look at the run folder and the process tree. Returns True if anything was new."""
        self._remember_processes()
        new = self.tail.poll()
        for msg in new:
            self._handle(msg)
        ranks = read_rank_files(self.run_dir)
        pids = {str(r): d.get("pid") for r, d in sorted(ranks.items())}
        if pids:
            self.status.update(pids=pids)
        if ranks and self.status.data.get("state") == "starting" and all(
                d.get("state") == "running" for d in ranks.values()):
            self.status.update(state="running")
        return bool(new)

    def _remember_processes(self) -> None:
        try:
            for child in psutil.Process().children(recursive=True):
                self.procs.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def _handle(self, msg: dict[str, Any]) -> None:
        kind = msg.get("kind") if msg.get("type") == "event" else msg.get("type")
        if kind == "run_start":
            self.total_steps = msg.get("total_steps")
            self.status.update(state="running", total_steps=self.total_steps,
                               world_size=msg.get("world_size"))
            self._print(f"training: {msg.get('world_size')} ranks ({msg.get('backend')}), "
                        f"{self.total_steps} steps, {msg.get('steps_per_epoch')} per epoch, "
                        f"from step {msg.get('start_step')}")
        elif kind == "metrics":
            self._progress(msg)
        elif kind == "epoch_start":
            self.status.update(epoch=msg.get("epoch"))
        elif kind == "eval":
            extra = (f", accuracy {msg['val_accuracy']:.3f}" if "val_accuracy" in msg else "")
            self._print(f"eval at step {msg.get('step')}: val loss {msg.get('val_loss'):.4f}"
                        f"{extra}")
            self.status.update(last_eval={k: msg.get(k) for k in
                                          ("step", "val_loss", "val_accuracy") if k in msg})
        elif kind == "checkpoint_saved":
            paths = msg.get("paths") or []
            self.status.update(checkpoint=paths[0] if paths else None)
            self._print(f"checkpoint saved at step {msg.get('step')}: {', '.join(paths)}")
        elif kind == "stopping":
            self.stop_reason = msg.get("reason")
            self.status.update(state="stopping", step=msg.get("step"))
            self._print(f"stopping at step {msg.get('step')} ({msg.get('reason')}); all ranks "
                        "agreed")

    def _progress(self, msg: dict[str, Any]) -> None:
        step = int(msg.get("step", 0))
        self.last_step = step
        self.status.update(step=step, epoch=msg.get("epoch"), last_metrics=msg)
        ranks = msg.get("ranks") or []
        losses = " ".join(f"r{r['rank']}={_fmt(r.get('loss'))}" for r in ranks)
        rate = sum(r.get("samples_per_s") or 0.0 for r in ranks)
        now = time.time()
        self._rate.append((now, step))
        self._rate = self._rate[-20:]
        eta = "?"
        total = self.total_steps or msg.get("total_steps")
        if total and len(self._rate) >= 2 and self._rate[-1][1] > self._rate[0][1]:
            steps_per_s = (self._rate[-1][1] - self._rate[0][1]) / (
                self._rate[-1][0] - self._rate[0][0] + 1e-9)
            eta = _fmt_duration((total - step) / steps_per_s)
        self._print(f"step {step}/{total or '?'} epoch {msg.get('epoch')} | loss {losses} | "
                    f"{rate:,.0f} samples/s | ETA {eta}")

    def _print(self, line: str) -> None:
        print(f"[rankscope] {line}", file=self.out, flush=True)


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    m, s = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@contextlib.contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    """Set the workers' variables in this (launcher) process for the duration of the run."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def sweep(procs: list[psutil.Process], grace_s: float = SWEEP_GRACE_S) -> list[int]:
    """SIGTERM the processes still alive, wait ``grace_s``, SIGKILL the rest.

    Tolerates processes that are already gone. Returns the pids that had to be signalled.
    """
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            continue
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, still = psutil.wait_procs(alive, timeout=grace_s)
    for p in still:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(still, timeout=grace_s)
    return [p.pid for p in alive]


def _failure_reason(failures: dict[int, Any]) -> tuple[str, dict[str, Any]]:
    """A one-line reason naming each failed rank, and per-rank exit details."""
    parts = []
    details: dict[str, Any] = {}
    for rank, f in sorted(failures.items()):
        exitcode = int(f.exitcode)
        entry: dict[str, Any] = {"exit_code": exitcode, "pid": f.pid}
        if exitcode < 0:
            entry["signal"] = f.signal_name()
            parts.append(f"rank {rank} was killed by signal {f.signal_name()}")
        else:
            message = str(f.message or "").strip().splitlines()
            text = message[0] if message else f"exit code {exitcode}"
            entry["error"] = text
            parts.append(f"rank {rank} failed: {text}")
        details[str(rank)] = entry
    return "; ".join(parts), details


def _rank_error(run_dir: Path) -> str | None:
    """The first exception a rank recorded in its rank file, if any."""
    for rank, data in sorted(read_rank_files(run_dir).items()):
        if data.get("state") == "failed" and data.get("error"):
            return f"rank {rank} raised {data['error']}"
    return None


def launch(cfg: RunConfig, *, out: TextIO = sys.stdout) -> int:
    """Run a whole launch. Returns the process exit code (0 completed or stopped)."""
    try:
        plan = plan_launch(cfg, create_run_dir=not cfg.dry_run)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if cfg.dry_run:
        print(plan.command(), file=out)
        print(plan.cfg.to_json(), file=out)
        return EXIT_OK

    run_dir = Path(plan.cfg.run_dir or ".")
    for old in (run_dir / "ranks").glob("rank-*.json"):
        old.unlink()
    atomic_write_json(run_dir / CONFIG_FILE, plan.cfg.to_dict())
    status = StatusFile(run_dir, run_dir=str(run_dir), nproc=plan.cfg.nproc, device=plan.device,
                        command=plan.command())
    print(f"[rankscope] run folder {run_dir}", file=out, flush=True)
    print(f"[rankscope] {plan.command()}", file=out, flush=True)
    monitor = RunMonitor(run_dir, status, out)
    monitor.start()

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args
    from torch.distributed.run import run as torchrun

    final: dict[str, Any] = {}
    code = EXIT_FAILED
    signals_seen: list[str] = []
    try:
        with _environment(plan.env):
            torchrun(parse_args(plan.torchrun_args))
        final = {"state": "completed"}
        code = EXIT_OK
    except ChildFailedError as e:
        reason, details = _failure_reason(e.failures)
        final = {"state": "failed", "reason": reason, "ranks": details}
    except (SignalException, KeyboardInterrupt) as e:
        sig = e.sigval.name if isinstance(e, SignalException) else "SIGINT"
        signals_seen.append(sig)
        final = {"state": "stopped", "stop_signal": sig}
        code = EXIT_OK
    except Exception as e:  # rendezvous or agent failure
        final = {"state": "failed", "reason": f"launcher: {type(e).__name__}: {e}"}
    finally:
        # torchrun's handlers are still installed; replace them so that a signal now cannot
        # raise inside the clean-up. The sweep SIGTERMs and then SIGKILLs whatever is left.
        def force(signum: int, _frame: FrameType | None) -> None:
            signals_seen.append(signal.Signals(signum).name)  # the sweep below kills anyway

        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, force)
        monitor.request_stop()
        monitor.join()
        monitor.poll_once()
        leftover = sweep(list(monitor.procs.values()))

    ranks = read_rank_files(run_dir)
    world = plan.cfg.nproc or len(ranks)
    states = {r: d.get("state") for r, d in ranks.items()}
    step = max([d["step"] for d in ranks.values() if isinstance(d.get("step"), int)]
               + [monitor.last_step])
    all_ranks = len(states) == world
    if final.get("state") in ("completed", "stopped"):
        signalled = final.get("state") == "stopped"
        if all_ranks and all(s == "stopped" for s in states.values()):
            why = monitor.stop_reason or f"signal {final.get('stop_signal')}"
            final = {"state": "stopped", "reason": f"stop requested ({why}); all ranks stopped "
                     f"at step {step}", **({"stop_signal": final["stop_signal"]}
                                           if signalled else {})}
            code = EXIT_OK
        elif all_ranks and all(s == "completed" for s in states.values()):
            final = {"state": "completed"}
            code = EXIT_OK
        elif _rank_error(run_dir):
            final = {"state": "failed", "reason": _rank_error(run_dir)}
            code = EXIT_FAILED
        elif signalled:
            unclean = sorted(set(range(world)) - {r for r, s in states.items() if s == "stopped"})
            final.update(forced=True, reason=f"forced stop ({', '.join(signals_seen)}): ranks "
                         f"{unclean} were killed before they stopped cleanly")
            code = EXIT_FORCED
        else:
            final = {"state": "failed", "reason": "torchrun ended but the ranks reported "
                     f"{states or 'nothing'}"}
            code = EXIT_FAILED
    elif final.get("state") == "failed" and "rank" not in final.get("reason", "rank"):
        final["reason"] = _rank_error(run_dir) or final["reason"]
    if leftover:
        final["swept_pids"] = leftover
    exit_codes = {str(r): (0 if s in ("completed", "stopped") else None) for r, s in states.items()}
    for r, d in (final.get("ranks") or {}).items():
        exit_codes[r] = d.get("exit_code")
    status.update(step=step, exit_codes=exit_codes, ended=time.time(), **final)
    _report_end(run_dir, status.data, out)
    return code


def _report_end(run_dir: Path, data: dict[str, Any], out: TextIO) -> None:
    state = data.get("state")
    line = f"[rankscope] {state} at step {data.get('step')}"
    if data.get("reason"):
        line += f": {data['reason']}"
    print(line, file=out, flush=True)
    if data.get("checkpoint"):
        print(f"[rankscope] checkpoint: {data['checkpoint']}", file=out, flush=True)
    if state == "failed":
        logs = rank_log_files(run_dir)
        failed = [int(r) for r in (data.get("ranks") or {})] or list(logs)
        for rank in failed[:1]:
            if rank in logs:
                print(f"[rankscope] last lines of rank {rank}'s log ({logs[rank]}):", file=out)
                for text in tail_lines(logs[rank], 15):
                    print(f"    {text}", file=out)
        out.flush()
