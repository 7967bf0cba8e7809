"""bench/node_watch_cost.py: a beat of each side timed against a real TCPStore."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO


def test_the_bench_times_a_beat_of_node_0_and_node_1() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "node_watch_cost.py"),
                           "--beats", "20", "--nnodes", "3"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(r"^\| 3 \| (\d) \| (\d+) µs \((\d+)\) \| (\d+) µs \((\d+)\) \| (\d+) µs \| "
                      r"([\d.]+)% \|$", proc.stdout, re.MULTILINE)
    assert [r[0] for r in rows] == ["0", "1"], proc.stdout
    for _, cpu, cpu99, wall, wall99, _, share in rows:
        assert int(wall) > 0 and int(cpu99) >= int(cpu) and int(wall99) >= int(wall)
        assert float(share) < 1.0  # under a hundredth of a core at a beat a second


def test_bad_input_names_the_field() -> None:
    for args, field in ((["--nnodes", "1"], "--nnodes"), (["--beats", "0"], "--beats")):
        proc = subprocess.run([sys.executable, str(REPO / "bench" / "node_watch_cost.py"), *args],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert proc.returncode == 2 and f"error: {field}: " in proc.stderr, proc.stderr
