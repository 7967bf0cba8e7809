"""Launch latency: from Start to the first metrics message, engine against plain torchrun.

    .venv/bin/python bench/launch_latency.py [--reps 5] [--nproc 2] [--steps 5]

Each repetition runs both variants (in a rotating order, so the machine's noise hits both
alike) on one config (mlp on synthetic data, the engine's defaults, --nproc CPU ranks, gloo):

- engine: ``python -m ddp_engine launch --config CFG --run-dir DIR`` (log_every 1), timed from
  the moment the process is spawned to the "time" stamp of the first "metrics" line of
  DIR/metrics.jsonl (written after step 1). Also shown: when the launcher had written
  status.json ("started") and when rank 0 emitted its "run_start" event (process group up,
  data and model built).
- plain: ``python -m torch.distributed.run --standalone --nproc-per-node N bench/plain_ddp.py
  --config CFG``, timed from the spawn to rank 0's first completed optimizer step
  (--first-step-file).

Both run --steps steps in all, and every process of a run is gone (checked with psutil) before
the next starts. A plain run whose rank aborts after its steps (at interpreter exit) still
counts, since its first step was stamped; its line says so. Prints each run, then medians and
the ratio engine / plain (target <= 1.2).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddp_engine.common.child_env import build_env  # noqa: E402
from ddp_engine.common.config import RunConfig  # noqa: E402
from ddp_engine.common.run_dir import iter_metrics, read_status  # noqa: E402

TARGET_RATIO = 1.2


def _ensure_gone(work: Path, timeout_s: float = 30.0) -> None:
    """Wait until no process whose command line names ``work`` is left (SIGKILL them after
    ``timeout_s``, and say so)."""
    def leftovers() -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter(["cmdline", "status"]):
            if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(str(work) in arg for arg in p.info["cmdline"] or []):
                out.append(p)
        return out

    deadline = time.monotonic() + timeout_s
    while (left := leftovers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        print(f"warning: killing processes left by the previous run: "
              f"{[p.pid for p in left]}", file=sys.stderr, flush=True)
        for p in left:
            p.kill()
        psutil.wait_procs(left, timeout=5)


def _run(argv: list[str], env: dict[str, str], log: Path, timeout_s: float) -> tuple[float, int]:
    """Spawn ``argv`` and wait for it to exit; returns the spawn's time.time() and the exit
    code."""
    with open(log, "wb") as out:
        t_spawn = time.time()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=REPO,
                                start_new_session=True)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return t_spawn, code


def _failed(argv: list[str], code: int, log: Path) -> RuntimeError:
    tail = "\n    ".join(log.read_text(errors="replace").splitlines()[-30:])
    return RuntimeError(f"{argv[2]} exited {code}; the end of its output:\n    {tail}")


def engine_run(cfg_path: Path, work: Path, name: str, timeout_s: float) -> dict[str, float]:
    """Seconds from the spawn to the first metrics line (and to "started", "run_start")."""
    run_dir = work / name
    argv = [sys.executable, "-m", "ddp_engine", "launch", "--config", str(cfg_path),
            "--run-dir", str(run_dir)]
    t_spawn, code = _run(argv, build_env(), work / f"{name}.log", timeout_s)
    if code != 0:
        raise _failed(argv, code, work / f"{name}.log")
    first = next(m for m in iter_metrics(run_dir) if m.get("type") == "metrics")
    run_start = next(m for m in iter_metrics(run_dir)
                     if m.get("type") == "event" and m.get("kind") == "run_start")
    status = read_status(run_dir) or {}
    if status.get("state") != "completed":
        raise RuntimeError(f"engine run ended {status.get('state')}: {status.get('reason')}")
    return {"first": first["time"] - t_spawn, "started": status["started"] - t_spawn,
            "run_start": run_start["time"] - t_spawn}


def plain_run(cfg_path: Path, nproc: int, work: Path, name: str,
              timeout_s: float) -> tuple[dict[str, float], str]:
    """Seconds from the spawn to rank 0's first completed step, and a note on how it ended.

    A rank that dies after its steps (torch 2.13's gloo sometimes aborts at interpreter exit,
    "terminate called without an active exception", after destroy_process_group returned)
    does not spoil the measurement: the run is counted, with the note."""
    stamp = work / f"{name}.first-step"
    env = build_env()
    env.update(OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // nproc)),
               CUDA_VISIBLE_DEVICES="")  # as the launcher sets them for CPU ranks
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(nproc), str(REPO / "bench/plain_ddp.py"), "--config", str(cfg_path),
            "--warmup", "0", "--first-step-file", str(stamp)]
    log = work / f"{name}.log"
    t_spawn, code = _run(argv, env, log, timeout_s)
    if not stamp.exists():
        raise _failed(argv, code, log)
    note = ""
    if code != 0:
        lines = log.read_text(errors="replace").splitlines()
        why = [line for line in lines if line.startswith("terminate called")] or [
            line.strip() for line in lines if line.strip().startswith("exitcode")]
        note = f"  (then torchrun exited {code}: a rank aborted at exit: {'; '.join(why)})"
    return {"first": float(stamp.read_text()) - t_spawn}, note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="steps per run (default: 5)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per run")
    args = parser.parse_args()
    cfg = RunConfig(model="mlp", dataset="synthetic", nproc=args.nproc, device="cpu",
                    max_steps=args.steps, log_every=1, eval_every=0, checkpoint_every=0)
    print(f"mlp on synthetic (engine defaults: batch {cfg.batch_size}/rank), {args.nproc} CPU "
          f"ranks (gloo), {args.steps} steps per run, {args.reps} repetitions, "
          f"{os.cpu_count()} cores; seconds from spawn")
    results: dict[str, list[float]] = {"engine": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cfg_path = work / "bench.json"
        cfg_path.write_text(cfg.to_json())
        variants = list(results)
        for rep in range(args.reps):
            k = rep % len(variants)
            for variant in variants[k:] + variants[:k]:
                _ensure_gone(work)
                name = f"{variant}-{rep + 1}"
                if variant == "engine":
                    t = engine_run(cfg_path, work, name, args.timeout)
                    detail = (f"  (launcher up {t['started']:.2f} s, run_start "
                              f"{t['run_start']:.2f} s)")
                else:
                    t, detail = plain_run(cfg_path, args.nproc, work, name, args.timeout)
                results[variant].append(t["first"])
                what = "first metrics" if variant == "engine" else "first step"
                print(f"rep {rep + 1} {variant:>6}: {what:<13} {t['first']:6.2f} s{detail}",
                      flush=True)
        _ensure_gone(work)
    med = {k: statistics.median(v) for k, v in results.items()}
    paired = [e / p for e, p in zip(results["engine"], results["plain"], strict=True)]
    print(f"\nmedian: engine {med['engine']:.2f} s, plain {med['plain']:.2f} s")
    print(f"engine / plain: {med['engine'] / med['plain']:.3f} of medians, "
          f"{statistics.median(paired):.3f} median of per-repetition ratios "
          f"({min(paired):.3f}..{max(paired):.3f}); target <= {TARGET_RATIO}")


if __name__ == "__main__":
    main()
