"""The launcher: validate, write the run folder, run torchrun in-process, report, clean up.

The launcher process *is* torchrun's elastic agent: it builds a torchrun command line, parses it
with torchrun's own parser and runs it through ``torch.distributed.run.run``. The agent starts
one worker per device (each in its own session); on a stop signal it forwards it to them, waits
``--shutdown-timeout`` and then SIGKILLs. The launcher keeps SIGINT/SIGTERM/SIGHUP for itself
(torchrun handles only SIGQUIT here, see LauncherSignals) so that a second signal can force.
Around that the launcher:

- validates the config against this machine before anything starts (exit 2 on bad input);
- keeps RUN_DIR/status.json current from a monitor thread and prints progress lines;
- turns the agent's outcome into a final state (completed, stopped, failed) with a reason;
- sweeps every process of the run (SIGTERM, then SIGKILL) so none outlives it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import psutil

from ddp_engine import devices
from ddp_engine.cluster import rendezvous_args
from ddp_engine.config import (
    NODE_RANK_ENV,
    ConfigError,
    RunConfig,
    check_environment,
    resolved_device,
)
from ddp_engine.heartbeat import (
    ReportClock,
    fmt_seconds,
    hang_hint,
    read_heartbeats,
    stall_text,
)
from ddp_engine.protocol import MONITOR_FILE
from ddp_engine.run_dir import (
    CONFIG_FILE,
    FINAL_STATES,
    STATUS_FILE,
    MetricsTail,
    atomic_write_json,
    failed_rank_log,
    new_run_dir,
    prepare_run_dir,
    read_rank_files,
    remove_partial_writes,
)
from ddp_engine.runs import fmt_duration

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
    # A node other than 0 keeps its own ranks' logs and files apart from node 0's run folder
    # (the same folder, on a shared file system): in a node-K sub-folder, or a run folder
    # named for the node.
    node = f"node-{cfg.node_rank}" if cfg.node_rank else ""
    if create_run_dir:
        field, where = ("run_dir", cfg.run_dir) if cfg.run_dir else ("runs_dir", cfg.runs_dir)
        try:
            run_dir = prepare_run_dir(
                Path(cfg.run_dir, node).resolve() if cfg.run_dir else new_run_dir(
                    cfg.runs_dir, cfg.default_name() + (f"-{node}" if node else "")).resolve())
            probe = run_dir / ".rankscope-write-test"
            probe.write_bytes(b"")  # a read-only or full file system fails here, not in a rank
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"{field}: cannot write the run folder under {where!r}: "
                              f"{e.strerror or e}") from None
    elif cfg.run_dir:
        run_dir = Path(cfg.run_dir, node).resolve()
    else:
        run_dir = Path(cfg.runs_dir).resolve() / (
            f"{cfg.default_name()}-{node + '-' if node else ''}<timestamp>")
    changes["run_dir"] = str(run_dir)
    changes["resume"] = str(Path(cfg.resume).resolve()) if cfg.resume else None
    resolved = dataclasses.replace(cfg, **changes)
    # Several nodes: ranks numbered by node rank, which needs torchrun's shared store. (One
    # node: torchrun's numbers; launch() drops a RANKSCOPE_NODE_RANK left in the shell.)
    if cfg.multi_node:
        env[NODE_RANK_ENV] = str(cfg.node_rank)
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "0"
    nodes = rendezvous_args(cfg)
    args = [*nodes, "--nproc-per-node", str(resolved.nproc),
            "--log-dir", str(run_dir / "logs"), "--redirects", "3",
            "--monitor-interval", "0.2", "--shutdown-timeout", str(cfg.shutdown_timeout_s),
            "-m", "ddp_engine.worker", "--config", str(run_dir / CONFIG_FILE)]
    return Plan(resolved, device, env, args)


class StatusFile:
    """status.json, rewritten atomically; the launcher is its only writer."""

    def __init__(self, folder: Path, **initial: Any) -> None:
        self.path = folder / STATUS_FILE
        self._lock = threading.Lock()
        self.error: OSError | None = None
        self.data: dict[str, Any] = {"state": "starting", "step": 0, "epoch": 0,
                                     "launcher_pid": os.getpid(), "pids": {},
                                     "hostname": socket.gethostname(),
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
        try:
            atomic_write_json(self.path, {**self.data, "updated": time.time()})
        except OSError as e:  # a full disk: the terminal still gets every line
            if self.error is None:
                print(f"[rankscope] warning: {self.path} cannot be written ({e.strerror}); "
                      "it may show an older state", file=sys.stderr, flush=True)
            self.error = e


class RunMonitor(threading.Thread):
    """Follows metrics.jsonl and the rank files: updates status.json, prints progress, and
    remembers every process of the run for the final sweep."""

    def __init__(self, run_dir: Path, status: StatusFile, out: TextIO, world_size: int = 1,
                 interval_s: float = 0.25, process_scan_s: float = 2.0, node_rank: int = 0,
                 beat_print_s: float = 10.0) -> None:
        super().__init__(name="rankscope-run-monitor", daemon=True)
        self.run_dir = run_dir
        self.status = status
        self.out = out
        self.interval_s = interval_s
        self.world_size = world_size
        self.tail = MetricsTail(run_dir, from_end=True)  # not what an earlier run left
        self.procs: dict[int, psutil.Process] = {}
        self.process_scan_s = process_scan_s  # a recursive scan reads all of /proc: ~2 ms
        self._next_scan = 0.0
        self.total_steps: int | None = None
        self.last_step = 0
        self.stop_reason: str | None = None
        self._stop_event = threading.Event()
        self._rate: list[tuple[float, int]] = []
        self.clock = ReportClock()
        self.hang_hint: str | None = None
        """While the run is stalled: which rank it waits for, from the heartbeats, as first
        diagnosed (later looks see the consequences: a rank that timed out and exited)."""
        self._stall_printed = 0.0
        self.node_rank = node_rank
        """Above 0: global rank 0, with metrics.jsonl, is on another node; this node's
        progress comes from its ranks' heartbeats, printed every ``beat_print_s``."""
        self.beat_print_s = beat_print_s
        self._beat_printed = 0.0

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.poll_once()

    def request_stop(self) -> None:
        self._stop_event.set()

    def poll_once(self, scan_processes: bool = False) -> bool:
        """One look at the run folder (and every ``process_scan_s`` at the process tree).
        Returns True if anything was new."""
        self._remember_processes(force=scan_processes)
        new = self.tail.poll()
        # Of consecutive metrics, only the latest is printed and written to status.json: a
        # poll's worth of reports costs one write (on a machine whose every core trains).
        latest = None
        for msg in new:
            if msg.get("type") == "metrics":
                self.clock.tick(float(msg.get("time") or time.time()))
                latest = msg
                continue
            if latest is not None:
                self._progress(latest)
                latest = None
            self._handle(msg)
        if latest is not None:
            self._progress(latest)
        if self.node_rank:
            self._beats()
        else:
            self._check_stall()
        first = self.node_rank * self.world_size  # this node's ranks only
        ranks = {r: d for r, d in read_rank_files(self.run_dir).items()
                 if first <= r < first + self.world_size}
        pids = {str(r): d.get("pid") for r, d in sorted(ranks.items())}
        if pids:
            self.status.update(pids=pids)
        if len(ranks) >= self.world_size and self.status.data.get("state") == "starting" and all(
                d.get("state") == "running" for d in ranks.values()):
            self.status.update(state="running")
        return bool(new)

    def _beats(self) -> None:
        """Progress of a node other than 0: its ranks' steps, from their heartbeats."""
        beats = read_heartbeats(self.run_dir)
        steps = [b["step"] for b in beats.values() if isinstance(b.get("step"), int)]
        if not steps:
            return
        self.last_step = min(steps)
        self.status.update(step=self.last_step)
        now = time.monotonic()
        if now - self._beat_printed >= self.beat_print_s:
            self._beat_printed = now
            self._print(f"node {self.node_rank}: ranks {', '.join(map(str, sorted(beats)))} at "
                        f"step {self.last_step} (node 0 has the metrics, checkpoints and "
                        "telemetry)")

    def _check_stall(self, print_every_s: float = 30.0) -> None:
        """The app's hang hint, for a terminal user: printed when reports stop coming (5
        typical intervals, at least 10 s) and every ``print_every_s`` while they stay away."""
        now = time.time()
        stall = self.clock.stall_s(now)
        if stall is None or self.status.data.get("state") not in ("running", "stopping"):
            if self.hang_hint is not None:
                self.hang_hint = None
                self.status.update(stall=None)
            return
        hint = hang_hint(read_heartbeats(self.run_dir), now)
        self.hang_hint = self.hang_hint or hint
        text = stall_text(stall, self.clock.typical_s(), self.last_step, hint)
        if now - self._stall_printed >= print_every_s:
            self._stall_printed = now
            self._print(text)
            self.status.update(stall=text)

    def _remember_processes(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_scan:
            return
        self._next_scan = now + self.process_scan_s
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
        elif kind == "epoch_start":
            self.status.update(epoch=msg.get("epoch"))
        elif kind == "eval":
            extra = (f", accuracy {_fmt(msg['val_accuracy'])}" if "val_accuracy" in msg else "")
            took = (f" (took {fmt_seconds(msg['eval_s'])})"
                    if isinstance(msg.get("eval_s"), int | float) else "")
            self._print(f"eval at step {msg.get('step')}: val loss {_fmt(msg.get('val_loss'))}"
                        f"{extra}{took}")
            self.status.update(last_eval={k: msg.get(k) for k in
                                          ("step", "val_loss", "val_accuracy", "eval_s")
                                          if k in msg})
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
        self._stall_printed = 0.0
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
            eta = fmt_duration((total - step) / steps_per_s)
        self._print(f"step {step}/{total or '?'} epoch {msg.get('epoch')} | loss {losses} | "
                    f"{rate:,.0f} samples/s | ETA {eta}")

    def _print(self, line: str) -> None:
        print(f"[rankscope] {line}", file=self.out, flush=True)


def _mib(n: int | None) -> str:
    return "memory unknown" if n is None else f"{n / 2**20:,.0f} MiB"


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4f}"


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


def _failure_reason(failures: dict[int, Any], root: int) -> tuple[str, dict[str, Any]]:
    """A one-line reason naming each failed rank (the root cause first), and per-rank exit
    details. Ranks as the run numbers them (see :func:`_our_rank`)."""
    parts = []
    details: dict[str, Any] = {}
    texts = set()
    for rank, f in sorted(failures.items(), key=lambda kv: (kv[0] != root, kv[0])):
        exitcode = int(f.exitcode)
        entry: dict[str, Any] = {"exit_code": exitcode, "pid": f.pid}
        if exitcode < 0:
            entry["signal"] = f.signal_name()
            parts.append(f"rank {rank} was killed by signal {f.signal_name()}")
        else:
            raw = f.message
            if isinstance(raw, dict):  # torch's error file: {"message": ..., "extraInfo": ...}
                raw = raw.get("message")
            message = str(raw or "").strip().splitlines()
            text = message[0] if message else f"exit code {exitcode}"
            entry["error"] = text
            texts.add(text)
            parts.append(f"rank {rank} failed: {text}")
        details[str(rank)] = entry
    if len(failures) > 1 and len(texts) == 1 and len(parts) == len(failures) and all(
            "error" in d for d in details.values()):  # every rank says the same: once
        return f"ranks {', '.join(sorted(details, key=int))} failed: {texts.pop()}", details
    return "; ".join(parts), details


def _our_rank(torchrun_rank: int, cfg: RunConfig) -> int:
    """A rank of this node as the run numbers it (node_rank * nproc + local rank) from
    torchrun's number for it (the rendezvous's node order, which may differ)."""
    nproc = cfg.nproc or 1
    return cfg.node_rank * nproc + torchrun_rank % nproc if cfg.multi_node else torchrun_rank


def _rank_error(run_dir: Path) -> str | None:
    """The first exception a rank recorded in its rank file, if any."""
    for rank, data in sorted(read_rank_files(run_dir).items()):
        if data.get("state") == "failed" and data.get("error"):
            return f"rank {rank} raised {data['error']}"
    return None


class LauncherSignals:
    """The launcher's own SIGINT / SIGTERM / SIGHUP handling.

    torchrun is told to handle only SIGQUIT (``PET_SIGNALS_TO_HANDLE``), so these stay ours:

    - before the agent runs ("startup"), a signal is remembered and nothing is started;
    - in a multi-node run (``forward_to_ranks``), the first signal goes to this node's ranks
      (they ask for the agreed stop) and the agent runs on, so that every node's agent ends
      normally; before any rank started, it is handled as below;
    - while the agent runs, the first signal raises torchrun's ``SignalException``: the agent
      forwards it to every rank (the agreed stop), waits up to the shutdown timeout, then
      SIGKILLs; any further signal forces: SIGTERM to every process of the run at once, SIGKILL
      ``SWEEP_GRACE_S`` later;
    - afterwards ("done"), a signal is only remembered: the final sweep runs anyway.
    """

    def __init__(self, monitor: RunMonitor | None = None, forward_to_ranks: bool = False) -> None:
        self.monitor = monitor  # set once the run folder exists
        self.forward_to_ranks = forward_to_ranks
        self.seen: list[str] = []
        self.phase = "startup"
        self.agent_signals = 0
        self.exception_type: type[BaseException] | None = None

    def install(self) -> None:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        self.seen.append(sig.name)
        if self.phase != "agent":
            return
        self.agent_signals += 1
        if self.agent_signals == 1 and self.forward_to_ranks and self._forward(sig):
            return
        if self.agent_signals == 1 and self.exception_type is not None:
            raise self.exception_type(f"launcher got {sig.name}", sig)  # type: ignore[call-arg]
        self.force()

    def _forward(self, sig: signal.Signals) -> bool:
        """Send ``sig`` to this node's ranks (an agreed stop on every node) and let the agent
        go on: its ranks end cleanly and it meets the other nodes' agents at torchrun's exit
        barrier, where one that left on a signal would keep them waiting 300 s. False when no
        rank has started yet."""
        if self.monitor is None:
            return False
        self.monitor.poll_once(scan_processes=True)
        sent = False
        for data in read_rank_files(self.monitor.run_dir).values():
            pid = data.get("pid")  # only this run's: a reused folder keeps older rank files
            if pid in self.monitor.procs and data.get("state") == "running":
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
                    sent = True
        return sent

    def force(self) -> None:
        """SIGTERM every process of the run now and SIGKILL what is left a little later."""
        if self.monitor is None:
            return
        self.monitor.poll_once(scan_processes=True)
        procs = list(self.monitor.procs.values())
        threading.Thread(target=sweep, args=(procs,), name="rankscope-force-stop",
                         daemon=True).start()


def launch(cfg: RunConfig, *, out: TextIO = sys.stdout) -> int:
    """Run a whole launch. Returns the process exit code (0 completed or stopped)."""
    # Handlers first, before status.json exists: whoever sees status.json may signal us, and a
    # stop that early must end the run as "stopped during start-up", not kill the launcher.
    signals = LauncherSignals()
    signals.install()
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
    for old in [*(run_dir / "ranks").glob("rank-*.json"), run_dir / MONITOR_FILE]:
        old.unlink(missing_ok=True)  # left by an earlier run in this folder
    atomic_write_json(run_dir / CONFIG_FILE, plan.cfg.to_dict())
    status = StatusFile(run_dir, run_dir=str(run_dir), nproc=plan.cfg.nproc, device=plan.device,
                        command=plan.command())
    print(f"[rankscope] run folder {run_dir}", file=out, flush=True)
    print(f"[rankscope] {plan.command()}", file=out, flush=True)
    if plan.cfg.multi_node:
        print(f"[rankscope] node {plan.cfg.node_rank} of {plan.cfg.nnodes}: meeting the other "
              f"nodes at {plan.cfg.rdzv_endpoint} (rendezvous {plan.cfg.rendezvous_id()})",
              file=out, flush=True)
    monitor = RunMonitor(run_dir, status, out, world_size=plan.cfg.nproc or 1,
                         node_rank=plan.cfg.node_rank)
    signals.monitor = monitor
    signals.forward_to_ranks = plan.cfg.multi_node
    monitor.start()

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args
    from torch.distributed.run import run as torchrun

    signals.exception_type = SignalException
    final: dict[str, Any] = {}
    code = EXIT_FAILED
    try:
        if signals.seen:
            raise SignalException("stop requested during start-up",
                                  signal.Signals[signals.seen[0]])
        signals.phase = "agent"
        if not plan.cfg.multi_node:
            os.environ.pop(NODE_RANK_ENV, None)  # this launcher's own environment
        with _environment({**plan.env, "PET_SIGNALS_TO_HANDLE": "SIGQUIT"}):
            torchrun(parse_args(plan.torchrun_args))
        final = {"state": "completed"}
        code = EXIT_OK
    except ChildFailedError as e:
        root, _ = e.get_first_failure()  # the earliest failure: the likely root cause
        root = _our_rank(root, plan.cfg)
        reason, details = _failure_reason(
            {_our_rank(r, plan.cfg): f for r, f in e.failures.items()}, root)
        final = {"state": "failed", "reason": reason, "ranks": details, "root_rank": root}
    except SignalException as e:
        final = {"state": "stopped", "stop_signal": e.sigval.name}
        code = EXIT_OK
    except Exception as e:  # rendezvous or agent failure
        final = {"state": "failed", "reason": f"launcher: {type(e).__name__}: {e}"}
    finally:
        signals.phase = "done"
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)  # torchrun's handler for it would raise
        monitor.request_stop()
        monitor.join()
        monitor.poll_once(scan_processes=True)
        leftover = sweep(list(monitor.procs.values()))
    signals_seen = signals.seen

    world = plan.cfg.nproc or 1  # this node's ranks
    mine = range(plan.cfg.node_rank * world, (plan.cfg.node_rank + 1) * world)
    # Only this node's: a node started without a folder of its own (a plain torchrun script)
    # writes its ranks' files into rank 0's.
    ranks = {r: d for r, d in read_rank_files(run_dir).items() if r in mine}
    states = {r: d.get("state") for r, d in ranks.items()}
    step = max([d["step"] for d in ranks.values() if isinstance(d.get("step"), int)]
               + [monitor.last_step])
    all_ranks = len(states) == world
    if final.get("state") in ("completed", "stopped"):
        signalled = final.get("state") == "stopped"
        if all_ranks and all(s == "stopped" for s in states.values()):
            why = (monitor.stop_reason or next((d["reason"] for d in ranks.values()
                                                if d.get("reason")), None)
                   or f"signal {final.get('stop_signal')}")
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
        elif signalled and not states:
            final = {"state": "stopped", "stop_signal": final["stop_signal"],
                     "reason": f"stopped during start-up ({final['stop_signal']}), before any "
                               "rank started training"}
            code = EXIT_OK
        elif signalled:
            unclean = sorted(set(mine) - {r for r, s in states.items() if s == "stopped"})
            final.update(forced=True, reason=f"forced stop ({', '.join(signals_seen)}): ranks "
                         f"{unclean} were killed before they stopped cleanly")
            code = EXIT_FORCED
        else:
            final = {"state": "failed", "reason": "torchrun ended but the ranks reported "
                     f"{states or 'nothing'}"}
            code = EXIT_FAILED
    elif final.get("state") == "failed" and "rank" not in final.get("reason", "rank"):
        final["reason"] = _rank_error(run_dir) or final["reason"]
    errors = {str(d.get("error")) for d in ranks.values()}
    if final.get("state") == "failed" and len(errors) == 1 and all(
            d.get("state") == "failed" for d in ranks.values()):
        (error,) = errors
        if error.startswith("RunFailed: "):
            # Every rank stopped cleanly and says why the run failed (a node's launcher
            # died): that, not how torchrun saw its ranks exit.
            final["reason"] = error.removeprefix("RunFailed: ")
    if final.get("state") == "failed" and monitor.hang_hint:
        final["reason"] += f"; before it failed, the run was stalled: {monitor.hang_hint}"
    if leftover:
        final["swept_pids"] = leftover
    if plan.device == "cuda":  # processes gone by psutil; the GPUs must agree
        pids = set(monitor.procs) | {d["pid"] for d in ranks.values()
                                     if isinstance(d.get("pid"), int)}
        held = devices.gpu_leftovers(pids)
        if held:
            final["gpu_leftovers"] = [dataclasses.asdict(h) for h in held]
            print("[rankscope] warning: NVML still lists processes of this run on a GPU: "
                  + ", ".join(f"pid {h.pid} on GPU {h.gpu} ({_mib(h.used_bytes)})"
                              for h in held), file=out, flush=True)
    # Every process of the run is gone: a temp file in checkpoints/ is from a save that was
    # killed (last.pt itself is the previous checkpoint, intact).
    partial = remove_partial_writes(run_dir / "checkpoints")
    if partial:
        final["removed_partial_checkpoints"] = sorted(p.name for p in partial)
    exit_codes = {str(r): (0 if s in ("completed", "stopped") else None) for r, s in states.items()}
    for r, d in (final.get("ranks") or {}).items():
        exit_codes[r] = d.get("exit_code")
    status.update(step=step, exit_codes=exit_codes, ended=time.time(), stall=None, **final)
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
        rank, path, lines = failed_rank_log(run_dir, data, 15)
        if path is not None:
            print(f"[rankscope] last lines of rank {rank}'s log ({path}):", file=out)
            for text in lines:
                print(f"    {text}", file=out)
        out.flush()
