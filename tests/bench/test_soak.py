"""bench/soak.py in CI: 5 start/stop cycles of real 2-process gloo runs at random (seeded)
moments, which with seed 0 use each of the four stops (`ddp_engine stop`, SIGTERM, SIGINT to
the launcher's group, the app's Stop) and each run kind (built-in, built-in with DataLoader
workers, a script with workers) at least once (checked below: a change to soak.py's order
that lost one fails here). Every cycle must end stopped or completed at one step for every
rank, with nothing left running and every checkpoint loading. Every (stop, kind) pair, 200
cycles: `make soak`, figures in docs/RELIABILITY.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_five_start_stop_cycles_with_every_stop_and_run_kind_end_cleanly(tmp_path: Path) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = tmp_path / "soak.md"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "soak.py"), "--cycles", "5", "--seed", "0",
         "--work", str(tmp_path / "work"), "--out", str(out), "--cycle-timeout", "90"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = out.read_text(encoding="utf-8")
    assert "5 cycles, 0 failed" in summary
    assert "| failed cycles | 0 |" in summary
    for method in ("cli-stop", "sigterm", "sigint-group", "app-stop"):  # each one ran
        row = re.search(rf"^\| {method} \|.*\| (\d+) \|$", summary, re.MULTILINE)
        assert row is not None and int(row.group(1)) > 0, summary
    kinds = re.search(r"^\| all \| (\d+) \| (\d+) \| (\d+) \| 5 \|$", summary, re.MULTILINE)
    assert kinds is not None and all(int(n) > 0 for n in kinds.groups()), summary  # each kind
