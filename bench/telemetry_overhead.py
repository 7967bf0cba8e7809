"""What monitoring costs: engine with telemetry on, off, and a plain DDP loop, side by side.

    .venv/bin/python bench/telemetry_overhead.py [--reps 5] [--steps 600] [--nproc 2]

Each repetition runs the three variants back to back (in a rotating order) on the same model,
data, batch size and world size, so that the machine's noise hits all three alike. Throughput
is rank 0's wall clock over steps [warmup, steps): for the engine from the "time" stamps of its
metrics lines at those steps (log_every divides both), for the plain loop measured the same way
inside it. Prints each run, then medians and the ratios.
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


def engine_run(cfg: RunConfig, telemetry: bool, warmup: int, work: Path) -> float:
    run_dir = work / f"engine-{'on' if telemetry else 'off'}-{len(list(work.iterdir()))}"
    argv = [sys.executable, "-m", "ddp_engine", "launch", "--config", str(work / "bench.json"),
            "--run-dir", str(run_dir), "--telemetry" if telemetry else "--no-telemetry"]
    subprocess.run(argv, check=True, capture_output=True, cwd=REPO)
    times = {m["step"]: m["time"] for m in iter_metrics(run_dir) if m["type"] == "metrics"}
    assert cfg.max_steps is not None
    samples = (cfg.max_steps - warmup) * cfg.batch_size * (cfg.nproc or 1)
    return samples / (times[cfg.max_steps] - times[warmup])


def plain_run(cfg: RunConfig, warmup: int, work: Path) -> float:
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // (cfg.nproc or 1))),
               CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", str(cfg.nproc), str(REPO / "bench/plain_ddp.py"),
                          "--config", str(work / "bench.json"), "--warmup", str(warmup)],
                         check=True, capture_output=True, text=True, cwd=REPO, env=env).stdout
    return float(json.loads(out.strip().splitlines()[-1])["samples_per_s"])


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
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "bench.json").write_text(cfg.to_json())
        variants = list(results)
        for rep in range(args.reps):
            order = variants[rep % 3:] + variants[:rep % 3]
            for name in order:
                if name == "plain":
                    value = plain_run(cfg, args.warmup, work)
                else:
                    value = engine_run(cfg, name == "on", args.warmup, work)
                results[name].append(value)
                print(f"rep {rep + 1} {name:>5}: {value:10,.0f} samples/s", flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\nmedian samples/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in med.items()))
    print("ratio               of medians   median of per-repetition ratios (min..max)")
    for a, b in (("on", "off"), ("on", "plain"), ("off", "plain")):
        paired = [x / y for x, y in zip(results[a], results[b], strict=True)]
        print(f"{a:>5} / {b:<6}      {med[a] / med[b]:.3f}        {statistics.median(paired):.3f} "
              f"({min(paired):.3f}..{max(paired):.3f})")


if __name__ == "__main__":
    main()
