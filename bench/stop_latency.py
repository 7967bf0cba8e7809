"""Stop latency: from the stop request until every process of the run has exited, by step time.

    .venv/bin/python bench/stop_latency.py [--reps 5] [--step-times 0.01,1] [--via sigterm]

Each repetition starts one run per step time (in a rotating order, so the machine's noise hits
all alike): ``python -m ddp_engine launch --nproc 2 --model mlp --dataset synthetic --loss
bench/step_time.py:loss --log-every 1`` with RANKSCOPE_BENCH_STEP_S setting the step time, in a
session of its own with a fresh environment, as the app starts it. Once rank 0 has reported
--warm-steps steps, and after a random part of one stop-check period (so that the request falls
anywhere between two agreed-stop checks), the stop is requested: ``--via sigterm`` sends SIGTERM
to the launcher, which forwards it to the ranks as the agreed stop (what ``python -m ddp_engine
stop`` does for a run without telemetry); ``--via socket`` sends {"type": "stop"} over rank 0's
telemetry socket (the app's first step). The launcher and every descendant of it, collected
with psutil just before the request, are then polled every 5 ms until all have exited (a
zombie counts as exited).

Printed per run: the step time observed (median step_time_s of the ranks' rows), the stop
latency and its parts from metrics.jsonl (request -> "stopping" event: waiting for the agreed
stop; "stopping" -> "checkpoint_saved": the checkpoint; after it: teardown and exit), the
budget (one step + the checkpoint write + 2 s) and latency / budget; then medians per step time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddp_engine.common.child_env import build_env  # noqa: E402
from ddp_engine.common.protocol import Connection  # noqa: E402
from ddp_engine.common.run_dir import MetricsTail, iter_metrics, read_json, read_status  # noqa: E402

PLUGIN = REPO / "bench" / "step_time.py"
BUDGET_SLACK_S = 2.0
POLL_S = 0.005


@dataclasses.dataclass
class StopResult:
    """One run's stop, in seconds (times relative to the stop request)."""

    target_step_s: float
    step_s: float
    """Median step_time_s over the ranks' rows of every metrics line."""
    latency_s: float
    """Until the launcher and every descendant of it had exited."""
    ranks_gone_s: float
    """Until every descendant (the ranks, torchrun's helpers) had exited."""
    agree_s: float
    """Until rank 0's "stopping" event (every rank agreed to stop)."""
    checkpoint_s: float
    """From "stopping" to "checkpoint_saved" (RNG gather and the atomic save of last.pt)."""
    requested_after_step: int
    stopped_at_step: int
    processes: int
    state: str
    exit_code: int | None

    @property
    def budget_s(self) -> float:
        return self.step_s + self.checkpoint_s + BUDGET_SLACK_S

    @property
    def ratio(self) -> float:
        return self.latency_s / self.budget_s


def _wait_for_steps(launcher: subprocess.Popen[bytes], run_dir: Path, steps: int,
                    timeout_s: float) -> int:
    """Block until rank 0 has reported ``steps`` steps; returns the last step reported."""
    tail = MetricsTail(run_dir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            raise RuntimeError(f"the launcher exited ({launcher.returncode}) before training "
                               f"reported {steps} steps; see {run_dir}")
        reported = [m["step"] for m in tail.poll() if m.get("type") == "metrics"]
        if reported and max(reported) >= steps:
            return int(max(reported))
        time.sleep(0.02)
    raise TimeoutError(f"no report of step {steps} within {timeout_s:g} s; see {run_dir}")


def _read_all(conn: Connection) -> None:
    """Read and discard everything the server sends until it closes the connection."""
    with contextlib.suppress(OSError, ValueError):
        while conn.poll(0.2) is not None:
            pass


def _last_step(run_dir: Path) -> int:
    return max((int(m["step"]) for m in iter_metrics(run_dir) if m.get("type") == "metrics"),
               default=0)


def _exited(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait_all_exited(launcher: subprocess.Popen[bytes], tree: list[psutil.Process],
                     t0: float, timeout_s: float) -> tuple[float, float]:
    """Poll until the launcher and ``tree`` have exited. Returns (all gone, tree gone), in
    seconds after ``t0`` (perf_counter)."""
    left = {p.pid: p for p in tree}
    tree_gone = launcher_gone = None
    deadline = t0 + timeout_s
    while tree_gone is None or launcher_gone is None:
        now = time.perf_counter()
        if now > deadline:
            raise TimeoutError(f"still alive {timeout_s:g} s after the stop request: launcher "
                               f"{launcher.pid if launcher_gone is None else '-'}, pids "
                               f"{sorted(left)}")
        if launcher_gone is None and launcher.poll() is not None:
            launcher_gone = now - t0
        for pid in [pid for pid, p in left.items() if _exited(p)]:
            del left[pid]
        if tree_gone is None and not left:
            tree_gone = now - t0
        time.sleep(POLL_S)
    return max(tree_gone, launcher_gone), tree_gone


def _kill_leftovers(launcher: subprocess.Popen[bytes], tree: list[psutil.Process]) -> None:
    """SIGKILL whatever of this run is still alive (only after a failed measurement)."""
    procs = list(tree)
    with contextlib.suppress(psutil.Error):
        procs += psutil.Process(launcher.pid).children(recursive=True)
    if launcher.poll() is None:
        launcher.kill()
    for p in procs:
        if not _exited(p):
            with contextlib.suppress(psutil.Error):
                p.kill()
    launcher.wait()
    psutil.wait_procs(procs, timeout=5)


def _step_time(run_dir: Path, from_step: int) -> float:
    rows = [r["step_time_s"] for m in iter_metrics(run_dir)
            if m.get("type") == "metrics" and m.get("step", 0) >= from_step
            for r in m.get("ranks", []) if r.get("step_time_s") is not None]
    return statistics.median(rows) if rows else float("nan")


def _events(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The first event of each kind in metrics.jsonl."""
    out: dict[str, dict[str, Any]] = {}
    for m in iter_metrics(run_dir):
        if m.get("type") == "event":
            out.setdefault(str(m.get("kind")), m)
    return out


def stop_run(step_s: float, args: argparse.Namespace, work: Path, rng: random.Random,
             name: str) -> StopResult:
    run_dir = work / name
    argv = [sys.executable, "-m", "ddp_engine", "launch", "--nproc", str(args.nproc),
            "--device", "cpu", "--model", "mlp", "--dataset", "synthetic",
            "--max-steps", "100000000", "--loss", f"{PLUGIN}:loss", "--run-dir", str(run_dir),
            "--log-every", str(args.log_every)]
    if args.stop_check_every is not None:
        argv += ["--stop-check-every", str(args.stop_check_every)]
    env = build_env()
    env["RANKSCOPE_BENCH_STEP_S"] = repr(step_s)
    tree: list[psutil.Process] = []
    with open(work / f"{name}.log", "wb") as log:
        launcher = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=REPO,
                                    start_new_session=True)
    conn: Connection | None = None
    try:
        _wait_for_steps(launcher, run_dir, args.warm_steps, args.timeout)
        every = int((read_json(run_dir / "config.json") or {}).get("stop_check_every", 1))
        # within one check interval (0, the default: a round at least every 0.5 s)
        time.sleep(rng.uniform(0.0, every * step_s if every else 0.5))
        if args.via == "socket":
            conn = Connection(run_dir, timeout_s=10)
            # Read as the app does: a viewer that does not read leaves the server lines to
            # drain at the end (it waits up to 2 s for them), which the app never causes.
            threading.Thread(target=_read_all, args=(conn,), daemon=True).start()
        tree = [psutil.Process(launcher.pid)]
        tree += tree[0].children(recursive=True)
        requested_after = _last_step(run_dir)
        t_wall, t0 = time.time(), time.perf_counter()
        if conn is not None:
            conn.send({"type": "stop"})
        else:
            launcher.send_signal(signal.SIGTERM)
        latency, ranks_gone = _wait_all_exited(launcher, tree[1:], t0, args.timeout)
    except BaseException:
        _kill_leftovers(launcher, tree)
        raise
    finally:
        if conn is not None:
            conn.close()
    events = _events(run_dir)
    stopping, saved = events.get("stopping"), events.get("checkpoint_saved")
    status = read_status(run_dir) or {}
    nan = float("nan")
    return StopResult(
        target_step_s=step_s, step_s=_step_time(run_dir, from_step=2), latency_s=latency,
        ranks_gone_s=ranks_gone,
        agree_s=stopping["time"] - t_wall if stopping else nan,
        checkpoint_s=saved["time"] - stopping["time"] if saved and stopping else nan,
        requested_after_step=requested_after,
        stopped_at_step=int(stopping["step"]) if stopping else -1,
        processes=len(tree), state=str(status.get("state")) + (
            " (forced)" if status.get("forced") else ""),
        exit_code=launcher.returncode)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--step-times", default="0.01,1", metavar="S,S",
                        help="seconds each step sleeps (default: 0.01,1)")
    parser.add_argument("--via", choices=("sigterm", "socket"), default="sigterm",
                        help="SIGTERM to the launcher, or the stop command over rank 0's "
                        "telemetry socket (default: sigterm)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--warm-steps", type=int, default=3,
                        help="steps reported before the stop is requested (default: 3)")
    parser.add_argument("--log-every", type=int, default=1,
                        help="metrics every N steps (default 1, as this bench always ran; "
                             "the engine's default, 0, reports on multiples of 10 steps at "
                             "least 0.2 s apart: each report forces a round)")
    parser.add_argument("--stop-check-every", type=int, default=None,
                        help="passed to the launcher (default: the engine's default)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for start-up, and for the stop (default: 120)")
    parser.add_argument("--seed", type=int, default=0, help="for the random request moments")
    parser.add_argument("--keep", metavar="DIR", help="keep run folders and launcher logs here")
    args = parser.parse_args()
    step_times = [float(s) for s in args.step_times.split(",")]
    rng = random.Random(args.seed)
    print(f"mlp on synthetic (engine defaults), loss sleeping per step, {args.nproc} CPU ranks "
          f"(gloo), stop via {args.via}, {args.reps} repetitions, {os.cpu_count()} cores; "
          f"budget = step + checkpoint + {BUDGET_SLACK_S:g} s")
    print("rep  target    step   latency  (agree  ckpt  exit)  ranks gone  budget  "
          "lat/budget  steps        procs  state")
    results: dict[float, list[StopResult]] = {s: [] for s in step_times}
    with contextlib.ExitStack() as stack:
        if args.keep:
            work = Path(args.keep)
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for rep in range(args.reps):
            k = rep % len(step_times)
            for step_s in step_times[k:] + step_times[:k]:
                r = stop_run(step_s, args, work, rng, f"step{step_s:g}-rep{rep + 1}")
                results[step_s].append(r)
                exit_s = r.latency_s - r.agree_s - r.checkpoint_s
                print(f"{rep + 1:>3}  {_ms(step_s):>6}  {_ms(r.step_s):>6}  {r.latency_s:6.2f} s"
                      f"  ({r.agree_s:5.2f} {r.checkpoint_s:5.2f} {exit_s:5.2f})"
                      f"  {r.ranks_gone_s:8.2f} s  {r.budget_s:4.2f} s  {r.ratio:8.2f}    "
                      f"{r.requested_after_step:>4} ->{r.stopped_at_step:>5}  {r.processes:>5}  "
                      f"{r.state} (exit {r.exit_code})", flush=True)
    print("\nmedians per step time (latency and its parts in s)")
    print("target    step   latency  agree  ckpt   exit  budget  lat/budget (max)  over budget")
    for step_s, rs in results.items():
        med = {f: statistics.median(getattr(r, f) for r in rs)
               for f in ("step_s", "latency_s", "agree_s", "checkpoint_s", "budget_s", "ratio")}
        exit_med = statistics.median(r.latency_s - r.agree_s - r.checkpoint_s for r in rs)
        over = sum(r.ratio > 1 for r in rs)
        print(f"{_ms(step_s):>6}  {_ms(med['step_s']):>6}  {med['latency_s']:7.2f}  "
              f"{med['agree_s']:5.2f}  {med['checkpoint_s']:4.2f}  {exit_med:5.2f}  "
              f"{med['budget_s']:6.2f}  {med['ratio']:6.2f} ({max(r.ratio for r in rs):.2f})"
              f"       {over}/{len(rs)}")


if __name__ == "__main__":
    main()
