"""What the Runs panel's scan costs: RunIndex.refresh() over many finished runs.

    .venv/bin/python bench/runs_index.py --runs 200 --reports 2000

Builds RUNS run folders (status.json, config.json and a metrics.jsonl of REPORTS two-rank
reports each, written as the engine writes them) in a temporary folder, then times the first
scan (the list, with a time budget for reading metrics), the scans until every metrics.jsonl
was read once for the best loss, and the scans after that (nothing changed: two small JSON
files per run), as the panel's watcher thread does every 2 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddp_engine.common.runs import RunIndex  # noqa: E402
from tests.conftest import make_run_folder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--reports", type=int, default=2000, help="metrics lines per run")
    parser.add_argument("--reps", type=int, default=10, help="steady-state scans to time")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(ns.runs):
            make_run_folder(root, f"run-{i:04d}", started=1_000.0 + i, steps=ns.reports,
                            log_every=1)
        size = sum(p.stat().st_size for p in root.glob("*/metrics.jsonl"))
        index = RunIndex(root)
        t0 = time.perf_counter()
        first = index.refresh()
        first_s = time.perf_counter() - t0
        scans = 1
        while index.pending:  # as the watcher does: rescan at once until every file is read
            index.refresh()
            scans += 1
        all_s = time.perf_counter() - t0
        steady = []
        for _ in range(ns.reps):
            t0 = time.perf_counter()
            index.refresh()
            steady.append(time.perf_counter() - t0)
    assert len(first) == ns.runs
    print(f"{ns.runs} runs, {ns.reports} reports each, {size / 2**20:.0f} MiB of metrics.jsonl")
    print(f"first scan (the list, {index.budget_s:g} s budget for metrics): {first_s:.2f} s")
    print(f"every best loss known after {scans} scans: {all_s:.2f} s")
    print(f"later scans (median of {ns.reps}): {1e3 * statistics.median(steady):.1f} ms "
          f"({1e3 * statistics.median(steady) / ns.runs:.2f} ms per run)")


if __name__ == "__main__":
    main()
