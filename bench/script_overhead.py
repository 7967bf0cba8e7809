"""What watching a user's own script costs: examples/ddp_train.py under Rankscope against the
same file under plain torchrun, side by side.

    .venv/bin/python bench/script_overhead.py [--reps 5] [--hidden 256] [--epochs 4]

Each repetition runs the script once under plain ``torchrun --nproc-per-node 2`` and once under
``python -m ddp_engine launch --script examples/ddp_train.py --nproc 2`` (default settings:
telemetry on, reports on multiples of 10 steps at least 0.2 s apart), back to back in
alternating order, 2 CPU ranks with gloo, OMP_NUM_THREADS=1 for both. The throughput is what
the script itself prints for each epoch (rank 0's "N samples/s"); the first epoch is warm-up
and left out, the others' median is the run's. The ratio (Rankscope / plain) is taken within
each repetition; the median over repetitions is printed with its range and how many
repetitions were slower under Rankscope. ``--hidden`` sets the script's MLP width (its default
is 256: about 2 ms steps here; 1024: about 12 ms).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "ddp_train.py"
RATE = re.compile(r"epoch (\d+): mean loss [\d.]+, (\d+) samples/s")


def _rates(text: str) -> float:
    """The median samples/s of the epochs after the first, from the script's own lines."""
    rates = [float(r) for e, r in RATE.findall(text) if int(e) > 0]
    if not rates:
        raise RuntimeError(f"no epoch lines after the first in:\n{text[-2000:]}")
    return statistics.median(rates)


def run_plain(script_args: list[str], work: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(SCRIPT), *script_args],
                          capture_output=True, text=True, env=env, cwd=work, timeout=1800)
    if proc.returncode:
        raise RuntimeError(proc.stdout + proc.stderr)
    return _rates(proc.stdout)


def run_rankscope(script_args: list[str], work: Path, rep: int, flags: list[str]) -> float:
    run_dir = work / f"run-{rep}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "ddp_engine", "launch", "--script",
                           str(SCRIPT), "--nproc", "2", "--device", "cpu", "--run-dir",
                           str(run_dir), "--script-cwd", str(work), *flags, "--",
                           *script_args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    if proc.returncode:
        raise RuntimeError(proc.stdout + proc.stderr)
    (log,) = [p for p in run_dir.rglob("stdout.log") if p.parent.name == "0"]
    return _rates(log.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--flags", default="", help="launch flags for the Rankscope side, "
                        "e.g. '--no-telemetry' (a non-default: say so beside its figure)")
    args = parser.parse_args()
    script_args = ["--epochs", str(args.epochs), "--hidden", str(args.hidden), "--samples",
                   str(args.samples), "--checkpoint", "bench.pt"]
    print(f"examples/ddp_train.py {' '.join(script_args)}, 2 CPU ranks (gloo), "
          f"{args.reps} repetitions; Rankscope flags: {args.flags or '(defaults)'}", flush=True)
    ratios, pairs = [], []
    with tempfile.TemporaryDirectory(prefix="rankscope-bench-") as tmp:
        work = Path(tmp)
        for rep in range(args.reps):
            order = ["plain", "rankscope"] if rep % 2 == 0 else ["rankscope", "plain"]
            got = {}
            for which in order:
                got[which] = (run_plain(script_args, work) if which == "plain"
                              else run_rankscope(script_args, work, rep, args.flags.split()))
            ratio = got["rankscope"] / got["plain"]
            ratios.append(ratio)
            pairs.append(got)
            print(f"rep {rep + 1}: plain {got['plain']:,.0f} samples/s, rankscope "
                  f"{got['rankscope']:,.0f} samples/s, ratio {ratio:.3f}", flush=True)
    plain = statistics.median(p["plain"] for p in pairs)
    watched = statistics.median(p["rankscope"] for p in pairs)
    slower = sum(r < 1 for r in ratios)
    print(f"rankscope / plain: median {statistics.median(ratios):.3f} (range "
          f"{min(ratios):.3f}-{max(ratios):.3f}, slower in {slower} of {len(ratios)}); "
          f"ratio of medians {watched / plain:.3f} ({watched:,.0f} / {plain:,.0f} samples/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
