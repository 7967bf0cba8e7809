"""What monitoring costs: engine with telemetry on, off, and a plain DDP loop, side by side.

    .venv/bin/python bench/telemetry_overhead.py [--reps 5] [--steps 600] [--nproc 2]

Each repetition runs the three variants back to back (in a rotating order) on the same model,
data, batch size and world size, so that the machine's noise hits all three alike. Throughput
is rank 0's wall clock over steps [warmup, steps): for the engine from the "time" stamps of its
metrics lines at those steps (log_every divides both), for the plain loop measured the same way
inside it. Prints each run, then medians and the ratios; and the same ratios from the CPU
work per sample (every rank's process CPU seconds over those steps), which the machine's
other tenants disturb far less than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddp_engine.config import RunConfig  # noqa: E402
from ddp_engine.run_dir import iter_metrics  # noqa: E402


def engine_run(cfg: RunConfig, telemetry: bool, warmup: int, work: Path) -> tuple[float, float]:
    run_dir = work / f"engine-{'on' if telemetry else 'off'}-{len(list(work.iterdir()))}"
    argv = [sys.executable, "-m", "ddp_engine", "launch", "--config", str(work / "bench.json"),
            "--run-dir", str(run_dir), "--telemetry" if telemetry else "--no-telemetry"]
    subprocess.run(argv, check=True, capture_output=True, cwd=REPO)
    reports = {m["step"]: m for m in iter_metrics(run_dir) if m["type"] == "metrics"}
    assert cfg.max_steps is not None
    samples = (cfg.max_steps - warmup) * cfg.batch_size * (cfg.nproc or 1)
    first, last = reports[warmup], reports[cfg.max_steps]

    def cpu(m: dict) -> float:
        return sum(r["process_cpu_s"] for r in m["ranks"])

    return (samples / (last["time"] - first["time"]),
            1000 * (cpu(last) - cpu(first)) / samples)


def plain_run(cfg: RunConfig, warmup: int, work: Path) -> tuple[float, float]:
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // (cfg.nproc or 1))),
               CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", str(cfg.nproc), str(REPO / "bench/plain_ddp.py"),
                          "--config", str(work / "bench.json"), "--warmup", str(warmup)],
                         check=True, capture_output=True, text=True, cwd=REPO, env=env).stdout
    got = json.loads(out.strip().splitlines()[-1])
    return float(got["samples_per_s"]), float(got["cpu_s_per_ksample"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=512)
    args = parser.parse_args()
    cfg = RunConfig(model="mlp", model_args={"hidden": args.hidden, "depth": 3},
                    dataset="synthetic", dataset_args={"num_samples": 16384, "val_samples": 0,
                                                       "input_shape": [256]},
                    nproc=args.nproc, device="cpu", max_steps=args.steps, eval_every=0,
                    batch_size=args.batch_size, log_every=50, checkpoint_every=0)
    print(f"mlp hidden={args.hidden} depth=3 input=256, batch {args.batch_size}/rank, "
          f"{args.nproc} CPU ranks (gloo), steps {args.warmup}..{args.steps}, "
          f"{args.reps} repetitions, {os.cpu_count()} cores")
    results: dict[str, list[float]] = {"plain": [], "off": [], "on": []}
    work_per_sample: dict[str, list[float]] = {k: [] for k in results}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "bench.json").write_text(cfg.to_json())
        variants = list(results)
        for rep in range(args.reps):
            order = variants[rep % 3:] + variants[:rep % 3]
            for name in order:
                if name == "plain":
                    value, cpu = plain_run(cfg, args.warmup, work)
                else:
                    value, cpu = engine_run(cfg, name == "on", args.warmup, work)
                results[name].append(value)
                work_per_sample[name].append(cpu)
                print(f"rep {rep + 1} {name:>5}: {value:10,.0f} samples/s  {cpu:6.3f} CPU s per "
                      "1,000 samples", flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\nmedian samples/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in med.items()))
    print("ratio               of medians   median of per-repetition ratios (min..max)")
    for a, b in (("on", "off"), ("on", "plain"), ("off", "plain")):
        paired = [x / y for x, y in zip(results[a], results[b], strict=True)]
        print(f"{a:>5} / {b:<6}      {med[a] / med[b]:.3f}        {statistics.median(paired):.3f} "
              f"({min(paired):.3f}..{max(paired):.3f})")
    # The same ratios from the CPU work per sample (every rank's process CPU time): with both
    # cores busy, throughput is cores / work per sample, and CPU time does not count the time
    # a rank waited for a core another tenant held, which is most of this machine's noise.
    cpu_med = {k: statistics.median(v) for k, v in work_per_sample.items()}
    print("\nmedian CPU s per 1,000 samples: " + ", ".join(f"{k} {v:.3f}"
                                                         for k, v in cpu_med.items()))
    print("throughput ratio from CPU work   of medians   median of per-repetition (min..max)")
    for a, b in (("on", "off"), ("on", "plain"), ("off", "plain")):
        paired = [y / x for x, y in zip(work_per_sample[a], work_per_sample[b], strict=True)]
        print(f"{a:>5} / {b:<6}                    {cpu_med[b] / cpu_med[a]:.3f}        "
              f"{statistics.median(paired):.3f} ({min(paired):.3f}..{max(paired):.3f})")

if __name__ == "__main__":
    main()
