"""Stopped at any moment, many times: a soak of start/stop cycles of real runs (issue 28).

    .venv/bin/python bench/soak.py [--cycles 200] [--seed 0] [--work DIR] [--out FILE.md]

Each cycle starts one real 2-process gloo run and stops it, seeded at random, with one of

- ``cli-stop``: ``python -m ddp_engine stop RUN_DIR`` (over the telemetry socket);
- ``sigterm``: SIGTERM to the launcher (what scancel, ``docker stop`` and systemd send);
- ``sigint-group``: SIGINT to the launcher's process group (Ctrl+C in a terminal; the launcher
  is started with ``start_new_session=True`` so that group is its own);
- ``app-stop``: the app's Stop: app/run_controller.py's RunController (the class the Stop
  button calls) started and stopped in this process, headless, under a QCoreApplication;

over three kinds of run: ``builtin`` (``--model mlp --dataset synthetic --nproc 2``),
``builtin-workers`` (the same with ``--num-workers 2``) and ``script-workers``
(examples/ddp_train.py, unchanged but for ``num_workers=2`` in its DataLoader, copied into the
cycle's folder at run time), at one of these moments:

- ``startup``: 0-1.5 s after the launch, before the first step (a run takes several seconds to
  reach it on 2 cores). For the two signals the 0-1.5 s count from the moment status.json
  exists: the launcher writes it once its signal handlers are in place (docs/ARCHITECTURE.md,
  "Stopping a run"),
  and before that a SIGTERM meets the Python interpreter's default disposition, as for any
  program (the app's Stop waits for that file for the same reason). ``ddp_engine stop`` and
  the app's Stop are sent from the launch itself: the app defers its signal; ``stop``, which
  refuses a folder without status.json/monitor.json, is asked again every 0.2 s, as a user
  would, and the refusals are counted;
- ``ranks-starting``: 0-1.5 s after the launcher first has as many processes below it as ranks
  (a psutil scan every few ms: torchrun has spawned them; they import torch, join the process
  group, build the model and the data, and the script's DataLoader starts its workers),
  mostly before step 1 (the line says the state status.json had at the stop);
- ``running``: 0-3 s after status.json says ``running``;
- ``eval`` (built-in runs): a run that evaluates 32,768 validation samples every 20 steps
  (about half a second each, most of the run's time), stopped when rank 0's heartbeat (written
  every second) says ``eval``;
- ``checkpoint`` (built-in runs): a 3.2 M-parameter MLP (a 38 MB checkpoint with AdamW's state)
  saved every 5 steps, stopped when rank 0's heartbeat says ``checkpoint``/``save`` or a
  ``.last.pt.*.tmp`` file is in checkpoints/.

Every cycle is checked, and any miss is a failure of the cycle:

- the run ends ``stopped`` or ``completed`` (``"forced": true`` counts as a failure: the agreed
  stop did not end the run), and the launcher exits 0;
- no process is left: every descendant of the launcher seen by a psutil scan during the run
  (every 0.25 s), every pid of status.json, and every process whose command line names the
  cycle's folder must be gone 2 s after the launcher has exited (a process still there at the
  exit and gone within those 2 s is counted as "lingered", not a failure). For ``app-stop`` the
  controller's own ``leftover_pids`` (processes alive when the launcher ended, which it then
  kills) count as leftovers too, and a Stop that had to escalate past the agreed stop (its
  SIGTERM after ``grace_s``, 30 s) is a failure;
- every checkpoint present (checkpoints/*.pt, and the script's own checkpoint.pt) loads with
  ``torch.load(weights_only=True)`` (or ``weights_only=False``, which is recorded); no
  ``.*.tmp`` file is left in checkpoints/. A checkpoint is *required* when the run ended
  ``stopped`` or ``completed`` after at least one step (a rank's final step > 0): then
  checkpoints/last.pt must exist and its ``step`` must be the ranks' final step. A run stopped
  before its first step (every rank at step 0, or no rank file: no rank reached training) may
  have none;
- all ranks stopped at one step: the ``step`` of every ranks/rank-N.json is equal (none
  written at all is accepted only for a run that never reached step 1).

A cycle has a hard timeout (``--cycle-timeout``, 120 s): past it the cycle fails and every
process of it is SIGKILLed, so the soak never hangs. Folders of passed cycles are deleted
(``--keep`` keeps them); a failed cycle's folder is kept and named. One line per cycle, then a
summary table; the exit code is 0 only when no cycle failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ddp_engine.common.child_env import build_env  # noqa: E402

METHODS = ("cli-stop", "sigterm", "sigint-group", "app-stop")
KINDS = ("builtin", "builtin-workers", "script-workers")
MOMENTS = {"builtin": ("startup", "ranks-starting", "running", "eval", "checkpoint"),
           "builtin-workers": ("startup", "ranks-starting", "running", "eval", "checkpoint"),
           "script-workers": ("startup", "ranks-starting", "running")}
MOMENT_WEIGHTS = {"startup": 2, "ranks-starting": 2, "running": 4, "eval": 2, "checkpoint": 2}
FINAL = ("completed", "stopped", "failed")
EXAMPLE = REPO / "examples" / "ddp_train.py"
SCRIPT_CHECKPOINT = "checkpoint.pt"


@dataclass
class Cycle:
    index: int
    method: str
    kind: str
    moment: str
    delay_s: float  # the random part of the moment
    folder: Path
    run_dir: Path = field(init=False)
    config: dict[str, Any] = field(default_factory=dict)
    # what happened
    hit: str = ""
    stop_at_s: float | None = None
    state: str | None = None
    forced: bool = False
    reason: str | None = None
    launcher_rc: int | None = None
    rank_steps: dict[str, Any] = field(default_factory=dict)
    leftovers: list[str] = field(default_factory=list)
    lingered: int = 0
    checkpoints: list[str] = field(default_factory=list)
    stop_refusals: int = 0
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    seen_pids: int = 0

    def __post_init__(self) -> None:
        self.run_dir = self.folder / "run"


# --------------------------------------------------------------------------- the runs
def plan(index: int, rng: random.Random, work: Path, method: str, kind: str) -> Cycle:
    moments = MOMENTS[kind]
    moment = rng.choices(moments, weights=[MOMENT_WEIGHTS[m] for m in moments])[0]
    delay = {"startup": rng.uniform(0.0, 1.5), "ranks-starting": rng.uniform(0.0, 1.5),
             "running": rng.uniform(0.0, 3.0)}.get(moment, 0.0)
    cycle = Cycle(index, method, kind, moment, round(delay, 3), work / f"cycle-{index:03d}")
    cfg: dict[str, Any] = {"nproc": 2, "device": "cpu", "max_steps": 20000,
                           "run_dir": str(cycle.run_dir), "shutdown_timeout_s": 30}
    if kind == "script-workers":
        script = cycle.folder / "ddp_train_workers.py"
        cfg.update(script=str(script), script_args=["--epochs", "1000", "--samples", "8192"])
    else:
        cfg.update(model="mlp", dataset="synthetic", seed=index)
        if kind == "builtin-workers":
            cfg["num_workers"] = 2
        if moment == "eval":
            cfg.update(eval_every=20, dataset_args={"val_samples": 32768})
        elif moment == "checkpoint":
            cfg.update(checkpoint_every=5, model_args={"hidden": 1024, "depth": 4})
        elif rng.random() < 0.5:
            cfg["checkpoint_every"] = 50
    cycle.config = cfg
    return cycle


def write_script(cycle: Cycle) -> None:
    """examples/ddp_train.py as it is, but for DataLoader workers (num_workers=2)."""
    text = EXAMPLE.read_text(encoding="utf-8")
    old = "sampler=sampler, drop_last=True)"
    if old not in text:
        raise SystemExit(f"{EXAMPLE} changed: its DataLoader call no longer reads '{old}'")
    (cycle.folder / "ddp_train_workers.py").write_text(
        text.replace(old, "sampler=sampler, drop_last=True,\n                        "
                          "num_workers=2)"), encoding="utf-8")


def cli_flags(cfg: dict[str, Any]) -> list[str]:
    flags: list[str] = []
    script_args: list[str] = []
    for key, value in cfg.items():
        if key == "script_args":
            script_args = value
        elif key in ("model_args", "dataset_args"):
            flag = "--model-arg" if key == "model_args" else "--dataset-arg"
            for k, v in value.items():
                flags += [flag, f"{k}={json.dumps(v)}"]
        else:
            flags += ["--" + key.replace("_", "-"), str(value)]
    return flags + (["--", *script_args] if script_args else [])


class Run:
    """One launched run, however it was started: its launcher and every process seen."""

    def __init__(self, cycle: Cycle) -> None:
        self.cycle = cycle
        self.t0 = time.monotonic()
        self.proc: subprocess.Popen[bytes] | None = None
        self.controller: Any = None
        self.finished: list[dict[str, Any]] = []
        self.seen: dict[int, psutil.Process] = {}
        self._last_scan = 0.0
        self.pump: Callable[[], None] = lambda: None

    # -- start
    def start_cli(self) -> None:
        argv = [sys.executable, "-m", "ddp_engine", "launch", *cli_flags(self.cycle.config)]
        with open(self.cycle.folder / "launcher.log", "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=build_env(),
                                         cwd=self.cycle.folder, start_new_session=True)
        self.t0 = time.monotonic()
        self._remember(self.proc.pid)

    def start_app(self, qapp: Any) -> None:
        from app.run_controller import RunController
        from ddp_engine.common.config import RunConfig

        self.controller = RunController()
        self.controller.finished.connect(self.finished.append)
        self.pump = qapp.processEvents
        self.controller.start(RunConfig(**self.cycle.config))
        self.t0 = time.monotonic()
        self._remember(self.controller.launcher.pid)

    @property
    def launcher_pid(self) -> int | None:
        if self.proc is not None:
            return self.proc.pid
        return self.controller.launcher.pid if self.controller is not None else None

    def ended(self) -> bool:
        if self.controller is not None:
            return bool(self.finished)
        return self.proc is not None and self.proc.poll() is not None

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    # -- watching
    def _remember(self, pid: int) -> None:
        if pid not in self.seen:
            with contextlib.suppress(psutil.Error):
                self.seen[pid] = psutil.Process(pid)

    def scan(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_scan < 0.25:
            return
        self._last_scan = now
        pid = self.launcher_pid
        if pid is not None:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(pid).children(recursive=True):
                    self._remember(child.pid)
        for p in (read_json(self.cycle.run_dir / "status.json") or {}).get("pids", {}).values():
            if isinstance(p, int):
                self._remember(p)

    def tick(self) -> None:
        self.pump()
        self.scan()
        time.sleep(0.002)

    def wait_until(self, cond: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cond():
                return True
            if self.ended():
                return False
            self.tick()
        return False

    def sleep(self, seconds: float) -> None:
        self.wait_until(lambda: False, seconds)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def heartbeat_phase(run_dir: Path) -> str | None:
    hb = read_json(run_dir / "ranks" / "heartbeat-0.json")
    return hb.get("phase") if hb else None


def ranks_spawned(run: Run, nproc: int) -> bool:
    """torchrun has started the ranks: the launcher has nproc processes below it."""
    pid = run.launcher_pid
    if pid is None:
        return False
    try:
        return len(psutil.Process(pid).children(recursive=True)) >= nproc
    except psutil.Error:
        return False


def saving(run_dir: Path) -> bool:
    if heartbeat_phase(run_dir) in ("checkpoint", "save"):
        return True
    with contextlib.suppress(OSError):
        return any(p.name.endswith(".tmp") for p in (run_dir / "checkpoints").iterdir())
    return False


# --------------------------------------------------------------------------- one cycle
def reach_moment(run: Run) -> str:
    """Wait for the cycle's moment; returns what was hit, in words."""
    c = run.cycle
    if c.moment == "startup":
        if c.method in ("sigterm", "sigint-group"):  # from status.json: see the docstring
            if not run.wait_until(lambda: (c.run_dir / "status.json").exists(), 60.0):
                return "no status.json"
        run.sleep(c.delay_s)
        return f"startup +{run.elapsed():.2f}s"
    if c.moment == "ranks-starting":
        nproc = int(c.config.get("nproc", 2))
        spawned = run.wait_until(lambda: ranks_spawned(run, nproc), 90.0)
        if not spawned:
            return "ranks never started"
        run.sleep(c.delay_s)
        state = (read_json(c.run_dir / "status.json") or {}).get("state")
        return f"ranks spawned +{c.delay_s:.2f}s ({state})"
    running = run.wait_until(
        lambda: (read_json(c.run_dir / "status.json") or {}).get("state") == "running", 90.0)
    if not running:
        return "never running"
    if c.moment == "running":
        run.sleep(c.delay_s)
        return f"running +{c.delay_s:.2f}s"
    if c.moment == "eval":
        hit = run.wait_until(lambda: heartbeat_phase(c.run_dir) == "eval", 30.0)
        return "in eval (heartbeat)" if hit else "eval not seen in 30 s"
    hit = run.wait_until(lambda: saving(c.run_dir), 30.0)
    return "in checkpoint save" if hit else "save not seen in 30 s"


def issue_stop(run: Run, deadline: float) -> None:
    c = run.cycle
    pid = run.launcher_pid
    assert pid is not None
    if c.method == "sigterm":
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    elif c.method == "sigint-group":
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGINT)
    elif c.method == "app-stop":
        run.controller.stop()
    else:  # `ddp_engine stop`, asked again (as a user would) while it refuses a starting run
        while not run.ended() and time.monotonic() < deadline:
            out = c.folder / "stop.log"
            with open(out, "ab") as log:
                stop = subprocess.Popen(
                    [sys.executable, "-m", "ddp_engine", "stop", str(c.run_dir), "--timeout",
                     str(max(1, int(deadline - time.monotonic())))],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=build_env())
            asked = time.monotonic()
            while stop.poll() is None and time.monotonic() < deadline:
                run.tick()
            if stop.poll() is None:
                stop.kill()
                stop.wait()
                return
            if stop.returncode == 0 or time.monotonic() - asked > 5.0 or run.ended():
                return
            c.stop_refusals += 1
            run.sleep(0.2)


def run_cycle(cycle: Cycle, qapp: Any, timeout_s: float) -> None:
    started = time.monotonic()
    shutil.rmtree(cycle.folder, ignore_errors=True)  # a --work folder used before
    cycle.folder.mkdir(parents=True)
    if cycle.kind == "script-workers":
        write_script(cycle)
    run = Run(cycle)
    deadline = started + timeout_s
    try:
        if cycle.method == "app-stop":
            run.start_app(qapp)
        else:
            run.start_cli()
        cycle.hit = reach_moment(run)
        if run.ended():
            cycle.hit += " (the run had already ended)"
        else:
            cycle.stop_at_s = round(run.elapsed(), 2)
            issue_stop(run, deadline)
        while not run.ended() and time.monotonic() < deadline:
            run.tick()
        if not run.ended():
            cycle.failures.append(f"timeout: not ended {timeout_s:g} s after the launch")
    finally:
        run.scan(force=True)
        finish(run)
    cycle.wall_s = round(time.monotonic() - started, 2)


def finish(run: Run) -> None:
    c = run.cycle
    timed_out = not run.ended()
    if timed_out:
        kill_everything(run)
    if run.proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.launcher_rc = run.proc.wait(timeout=10)
    status = read_json(c.run_dir / "status.json") or {}
    if run.controller is not None:
        end = run.finished[0] if run.finished else {}
        c.launcher_rc = end.get("launcher_exit_code")
        c.leftovers += [f"{pid} (the app's controller found it alive and killed it)"
                        for pid in end.get("leftover_pids") or []]
        if run.controller.stopping.taken > 1:  # the socket stop did not end it in grace_s
            c.failures.append(f"the app's Stop escalated (step {run.controller.stopping.taken} "
                              "of agreed stop, SIGTERM, SIGKILL)")
        status = {**status, **{k: end[k] for k in ("state", "reason", "forced") if k in end}}
    for p in (status.get("pids") or {}).values():
        if isinstance(p, int):
            run._remember(p)
    c.seen_pids = len(run.seen)
    check_processes(run)
    if run.controller is not None:
        run.controller.deleteLater()
        run.pump()
    c.state = status.get("state")
    c.forced = bool(status.get("forced"))
    c.reason = status.get("reason")
    if not timed_out:
        if c.state not in ("stopped", "completed"):
            c.failures.append(f"ended {c.state!r}: {c.reason}")
        elif c.forced:
            c.failures.append(f"forced: {c.reason}")
        if c.state in ("stopped", "completed") and c.launcher_rc not in (0, None):
            c.failures.append(f"launcher exit code {c.launcher_rc} for a {c.state} run")
    steps = check_ranks(c)
    check_checkpoints(c, steps)


def own_processes(folder: Path) -> list[psutil.Process]:
    """Processes (other than this one) whose command line names the cycle's folder."""
    mine = os.getpid()
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.pid != mine and str(folder) in " ".join(p.info["cmdline"] or []):
                found.append(p)
    return found


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def check_processes(run: Run) -> None:
    c = run.cycle
    candidates = list(run.seen.values()) + own_processes(c.folder)
    at_exit = alive(candidates)
    deadline = time.monotonic() + 2.0
    left = at_exit
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = alive(left)
    c.lingered = len(at_exit) - len(left)
    for p in left:
        with contextlib.suppress(psutil.Error):
            c.leftovers.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
            p.kill()


def kill_everything(run: Run) -> None:
    pid = run.launcher_pid
    if pid is not None:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    for p in list(run.seen.values()) + own_processes(run.cycle.folder):
        with contextlib.suppress(psutil.Error):
            p.kill()
    if run.controller is not None:  # let it see the launcher gone and finish
        end = time.monotonic() + 10
        while not run.finished and time.monotonic() < end:
            run.pump()
            time.sleep(0.01)


def check_ranks(c: Cycle) -> list[int]:
    files = sorted((c.run_dir / "ranks").glob("rank-*.json"))
    for f in files:
        data = read_json(f) or {}
        c.rank_steps[f.stem.removeprefix("rank-")] = data.get("step")
    steps = [s for s in c.rank_steps.values() if isinstance(s, int)]
    nproc = int(c.config.get("nproc", 2))
    if not c.rank_steps:
        if c.state in ("stopped", "completed") and (read_json(c.run_dir / "status.json") or {}
                                                    ).get("step") not in (None, 0):
            c.failures.append("no ranks/rank-N.json although the run reached a step")
        return []
    if len(steps) != len(c.rank_steps) or len(c.rank_steps) != nproc:
        if any(s for s in steps):  # a partial set is only acceptable before step 1
            c.failures.append(f"rank files incomplete: {c.rank_steps}")
    elif len(set(steps)) != 1:
        c.failures.append(f"ranks stopped at different steps: {c.rank_steps}")
    return steps


def load(path: Path) -> tuple[Any, str]:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True), "weights_only=True"
    except Exception:  # noqa: BLE001 - then the full unpickler, which is recorded
        return torch.load(path, map_location="cpu", weights_only=False), "weights_only=False"


def check_checkpoints(c: Cycle, steps: list[int]) -> None:
    ckpt_dir = c.run_dir / "checkpoints"
    paths = sorted(ckpt_dir.glob("*.pt")) if ckpt_dir.is_dir() else []
    script_ckpt = c.folder / SCRIPT_CHECKPOINT
    if script_ckpt.exists():
        paths.append(script_ckpt)
    loaded: dict[Path, Any] = {}
    for path in paths:
        try:
            obj, how = load(path)
        except Exception as e:  # noqa: BLE001 - a checkpoint that does not load is the finding
            c.failures.append(f"{path.name} does not load: {type(e).__name__}: {e}"[:300])
            continue
        loaded[path] = obj
        c.checkpoints.append(f"{path.name} ({how})")
    if ckpt_dir.is_dir():
        tmps = [p.name for p in ckpt_dir.iterdir() if p.name.endswith(".tmp")]
        if tmps:
            c.failures.append(f"temporary checkpoint files left: {tmps}")
    reached = max(steps, default=0)
    if c.state in ("stopped", "completed") and reached > 0 and not c.forced:
        last = ckpt_dir / "last.pt"
        if not last.exists():
            c.failures.append(f"no checkpoints/last.pt although the ranks stopped at step "
                              f"{reached}")
        elif last in loaded:
            saved = loaded[last].get("step") if isinstance(loaded[last], dict) else None
            if isinstance(saved, int) and saved != reached:
                c.failures.append(f"last.pt is of step {saved}, the ranks stopped at {reached}")


# --------------------------------------------------------------------------- the soak
def line(c: Cycle) -> str:
    verdict = "ok" if not c.failures else "FAIL: " + " | ".join(c.failures)
    steps = sorted(set(c.rank_steps.values()), key=str) if c.rank_steps else "-"
    extra = f" refusals={c.stop_refusals}" if c.stop_refusals else ""
    extra += f" lingered={c.lingered}" if c.lingered else ""
    return (f"[{c.index + 1:3d}] {c.method:12s} {c.kind:15s} {c.moment:10s} "
            f"{c.hit:28s} stop@{c.stop_at_s if c.stop_at_s is not None else '-':>6}s "
            f"-> {c.state or '-':9s} steps={steps} ckpts={len(c.checkpoints)} "
            f"procs={c.seen_pids} left={len(c.leftovers)}{extra} {c.wall_s:.1f}s {verdict}")


def summary(cycles: list[Cycle], wall_s: float, argv: list[str]) -> str:
    out = [f"command: `{' '.join(argv)}`", "",
           f"{len(cycles)} cycles, {sum(1 for c in cycles if c.failures)} failed, "
           f"wall time {wall_s / 60:.1f} min ({wall_s / max(len(cycles), 1):.1f} s a cycle)", "",
           "| method \\ kind | " + " | ".join(KINDS) + " | all |",
           "|---|" + "---|" * (len(KINDS) + 1)]
    for m in METHODS:
        row = [sum(1 for c in cycles if c.method == m and c.kind == k) for k in KINDS]
        out.append(f"| {m} | " + " | ".join(map(str, row)) + f" | {sum(row)} |")
    col = [sum(1 for c in cycles if c.kind == k) for k in KINDS]
    out.append("| all | " + " | ".join(map(str, col)) + f" | {len(cycles)} |")
    moments = Counter(c.moment for c in cycles)
    hits = Counter(re.sub(r" \+[\d.]+s", "", c.hit) for c in cycles)
    outcomes = Counter(("forced " if c.forced else "") + str(c.state) for c in cycles)
    out += ["", "| figure | value |", "|---|---|",
            "| moments | " + ", ".join(f"{k} {v}" for k, v in sorted(moments.items())) + " |",
            "| moments hit | " + ", ".join(f"{k} {v}" for k, v in sorted(hits.items())) + " |",
            "| outcomes | " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) + " |",
            f"| failed cycles | {sum(1 for c in cycles if c.failures)} |",
            f"| processes seen / left | {sum(c.seen_pids for c in cycles)} / "
            f"{sum(len(c.leftovers) for c in cycles)} (lingered past the launcher's exit, gone "
            f"within 2 s: {sum(c.lingered for c in cycles)}) |",
            f"| checkpoints loaded | {sum(len(c.checkpoints) for c in cycles)} "
            f"({sum(1 for c in cycles for k in c.checkpoints if 'False' in k)} needed "
            f"weights_only=False); cycles without one (stopped before step 1): "
            f"{sum(1 for c in cycles if not c.checkpoints and not c.failures)} |",
            f"| `ddp_engine stop` refused a starting run (asked again) | "
            f"{sum(c.stop_refusals for c in cycles)} times in "
            f"{sum(1 for c in cycles if c.stop_refusals)} cycles |",
            f"| slowest cycle | {max((c.wall_s for c in cycles), default=0):.1f} s |"]
    failed = [c for c in cycles if c.failures]
    if failed:
        out += ["", "Failed cycles (folders kept):", ""]
        out += [f"- cycle {c.index + 1} ({c.method}, {c.kind}, {c.moment}: {c.hit}), "
                f"{c.folder}: {'; '.join(c.failures)}" for c in failed]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the cycles' run folders (default: a new temp folder)")
    parser.add_argument("--out", type=Path, default=None, help="also write the summary here")
    parser.add_argument("--cycle-timeout", type=float, default=120.0)
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="comma-separated subset of " + ",".join(METHODS))
    parser.add_argument("--keep", action="store_true", help="keep passed cycles' folders too")
    args = parser.parse_args(argv)
    methods = tuple(m for m in args.methods.split(",") if m)
    if not set(methods) <= set(METHODS) or args.cycles < 1:
        parser.error(f"--methods: choose from {', '.join(METHODS)}; --cycles >= 1")
    work = (args.work or Path(tempfile.mkdtemp(prefix="rankscope-soak-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    qapp = None
    if "app-stop" in methods:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        from PySide6.QtCore import QCoreApplication

        qapp = QCoreApplication.instance() or QCoreApplication([])
    rng = random.Random(args.seed)
    combos = [(m, k) for m in methods for k in KINDS]
    order: list[tuple[str, str]] = []  # every (method, kind) once in each block of 12 cycles
    while len(order) < args.cycles:
        order += rng.sample(combos, len(combos))
    print(f"soak: {args.cycles} cycles, seed {args.seed}, methods {', '.join(methods)}, "
          f"work folder {work}", flush=True)
    cycles: list[Cycle] = []
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)
    interrupted = False
    try:
        soak(args, work, qapp, rng, order, cycles)
    except KeyboardInterrupt:  # the cycle under way was killed (run_cycle's finally), left out
        interrupted = True
        print(f"soak: interrupted after {len(cycles)} cycles", flush=True)
    text = summary(cycles, time.monotonic() - started,
                   [Path(sys.executable).name, "bench/soak.py", *(argv or sys.argv[1:])])
    print("\n" + text, flush=True)
    if interrupted:
        text = f"INTERRUPTED after {len(cycles)} of {args.cycles} cycles\n\n" + text
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 1 if interrupted or any(c.failures for c in cycles) else 0


def soak(args: argparse.Namespace, work: Path, qapp: Any, rng: random.Random,
         order: list[tuple[str, str]], cycles: list[Cycle]) -> None:
    with open(work / "cycles.jsonl", "a", encoding="utf-8") as record:
        for i in range(args.cycles):
            cycle = plan(i, rng, work, *order[i])
            run_cycle(cycle, qapp, args.cycle_timeout)
            cycles.append(cycle)
            print(line(cycle), flush=True)
            record.write(json.dumps({k: (str(v) if isinstance(v, Path) else v)
                                     for k, v in vars(cycle).items()}) + "\n")
            record.flush()
            if not cycle.failures and not args.keep:
                shutil.rmtree(cycle.folder, ignore_errors=True)


def _interrupt(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
