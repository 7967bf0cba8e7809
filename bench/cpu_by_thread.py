"""Where the CPU goes in one run, seen from outside: CPU seconds of the launcher and each rank,
per thread (psutil every 0.2 s), with each process's minor page faults and context switches
per second, over the run's steady middle (issue 16's analysis).

    .venv/bin/python bench/cpu_by_thread.py [--plain] [extra launch flags]

The workload: an MLP 256-1024-1024-10 (about 12 ms steps here), 600 steps, 2 CPU ranks, SGD,
validation off; ``--plain`` runs bench/plain_ddp.py under plain torchrun instead of the engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
Snapshot = dict[int, tuple[str, float, dict[int, float], dict[int, str], tuple[int, int, int]]]


def _faults_and_switches(p: psutil.Process) -> tuple[int, int, int]:
    """(minor page faults, voluntary and involuntary context switches) of a whole process."""
    stat = Path(f"/proc/{p.pid}/stat").read_text()
    minflt = int(stat[stat.rindex(")") + 2:].split()[7])  # field 10, counting from 1
    switches = p.num_ctx_switches()
    return minflt, switches.voluntary, switches.involuntary


def _snapshot(root: psutil.Process) -> Snapshot:
    """pid -> (command, process CPU seconds, CPU seconds per thread, thread names)."""
    out: Snapshot = {}
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return out
    for p in procs:
        try:
            with p.oneshot():
                cpu = p.cpu_times()
                threads = {t.id: t.user_time + t.system_time for t in p.threads()}
                cmd = " ".join(p.cmdline()[1:4])[:60]
                counts = _faults_and_switches(p)
        except (psutil.Error, OSError):
            continue
        names = {}
        for tid in threads:
            try:
                names[tid] = Path(f"/proc/{p.pid}/task/{tid}/comm").read_text().strip()
            except OSError:
                names[tid] = "?"
        out[p.pid] = (cmd, cpu.user + cpu.system, threads, names, counts)
    return out


def main() -> None:
    plain = "--plain" in sys.argv
    extra = [a for a in sys.argv[1:] if a != "--plain"]
    work = Path(tempfile.mkdtemp())
    cfg = {"model": "mlp", "model_args": {"hidden": 1024, "depth": 2}, "dataset": "synthetic",
           "dataset_args": {"num_samples": 80000, "val_samples": 0, "input_shape": [256]},
           "nproc": 2, "device": "cpu", "max_steps": 600, "eval_every": 0, "batch_size": 64,
           "optimizer": "sgd", "lr": 0.01, "momentum": 0.0}
    (work / "c.json").write_text(json.dumps(cfg))
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    if plain:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", str(REPO / "bench/plain_ddp.py"), "--config",
                str(work / "c.json"), "--warmup", "150"]
    else:
        argv = [sys.executable, "-m", "ddp_engine", "launch", "--config", str(work / "c.json"),
                "--run-dir", str(work / "run"), *extra]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    root = psutil.Process(proc.pid)
    history: list[tuple[float, Snapshot]] = []
    while proc.poll() is None:
        history.append((time.monotonic() - t0, _snapshot(root)))
        time.sleep(0.2)
    # The steady window: 3 s after every process is up, to 1 s before the end.
    up = next(t for t, s in history if len(s) >= 3)
    first = next(i for i, (t, _s) in enumerate(history) if t >= up + 3.0)
    last = max(i for i, (t, _s) in enumerate(history) if t <= history[-1][0] - 1.0)
    (t1, s1), (t2, s2) = history[first], history[last]
    print(f"{'plain' if plain else 'engine'}: steady window {t1:.1f}..{t2:.1f} s")
    for pid, (cmd, cpu, threads, names, counts) in s2.items():
        if pid not in s1:
            continue
        before = s1[pid]
        used = cpu - before[1]
        rate = [(n - b) / (t2 - t1) for n, b in zip(counts, before[4], strict=True)]
        print(f"pid {pid:6d} {used:6.2f} s CPU = {100 * used / (t2 - t1):5.1f}% of a core  {cmd}")
        print(f"      per second: {rate[0]:8.0f} minor faults, {rate[1]:6.0f} voluntary and "
              f"{rate[2]:6.0f} involuntary context switches")
        spent = {tid: s - before[2].get(tid, 0.0) for tid, s in threads.items()}
        for tid, s in sorted(spent.items(), key=lambda kv: -kv[1])[:8]:
            if s > 0.01:
                print(f"      thread {'main' if tid == pid else names[tid]:<16} {s:6.2f} s")


if __name__ == "__main__":
    main()
