"""``python -m ddp_engine stacks RUN_DIR`` on a real hung 2-rank gloo run, on a run folder
without live ranks, and on bad input."""

from __future__ import annotations

import inspect
import os
import signal
from pathlib import Path

import pytest

from ddp_engine.common.run_dir import read_rank_files, read_status
from tests.conftest import FAULTY, endless_run, make_run_folder, run_engine, wait_for


def _stuck_line() -> int:
    """The line of faulty.py's stuck_here where its loop sleeps (where rank 1 stands)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("faulty", FAULTY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines, first = inspect.getsourcelines(module.stuck_here)
    return first + next(i for i, line in enumerate(lines) if "time.sleep" in line)


@pytest.mark.slow
def test_stacks_of_a_hung_run_name_the_stuck_rank_and_survive_its_failure(
        tmp_path: Path) -> None:
    with endless_run(tmp_path, "--log-every", "1", "--loss",
                     f"{FAULTY}:stuck_on_rank1") as (proc, run_dir):
        done: list = []

        def apart() -> bool:
            done.append(run_engine("stacks", str(run_dir), timeout=60,
                                   env={"RANKSCOPE_PY_SPY": "0"}))  # whatever PATH holds
            return done[-1].returncode == 0 and "rank 1: stuck_here" in done[-1].stdout

        wait_for(apart, 120, "rank 1 stuck in stuck_here", interval=0.5)
        out = done[-1].stdout
        summary = out.splitlines()[1]
        assert summary.startswith("rank 0: backward in trainer.py:"), out
        assert "(waiting for the other ranks in DDP's gradient all-reduce)" in summary
        assert summary.endswith(f"; rank 1: stuck_here in faulty.py:{_stuck_line()}"), out
        assert "rank 1 is outside any collective while the others wait" in out
        assert "taken" in out.splitlines()[0] and "by faulthandler" in out.splitlines()[0]
        saved = Path(out.rsplit("saved, with every thread of every rank: ", 1)[1].strip())
        assert saved.parent == run_dir / "ranks" and saved.name.startswith("stacks-")
        # The run then fails (its stuck rank is killed): the stacks stay in its folder.
        os.kill(read_rank_files(run_dir)[1]["pid"], signal.SIGKILL)
        assert proc.wait(timeout=90) == 1
    assert (read_status(run_dir) or {}).get("state") == "failed"
    kept = saved.read_text()
    assert summary in kept and "---- rank 1 (pid" in kept and "in stuck_here" in kept
    assert "_bootstrap" in kept  # every thread, not only the main ones


def test_a_run_without_live_ranks_exits_1_naming_the_folder(tmp_path: Path) -> None:
    run = make_run_folder(tmp_path, "done")
    (run / "ranks" / "rank-0.json").write_text(
        '{"rank": 0, "pid": 1, "state": "completed", "time": 1}')
    proc = run_engine("stacks", str(run), timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"no live rank to take stacks from in {run} (the run has "
                                   "ended, or not started its ranks yet)")
    assert proc.stdout == "" and not list((run / "ranks").glob("stacks-*"))


def test_bad_input_exits_2_with_the_field_and_the_value(tmp_path: Path) -> None:
    proc = run_engine("stacks", str(tmp_path / "nowhere"), timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: run_dir: {str(tmp_path / 'nowhere')!r} is not a folder"
    proc = run_engine("stacks", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "is not a run folder" in proc.stderr
    proc = run_engine("stacks", str(tmp_path), "--timeout", "0", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --timeout must be > 0 seconds, got 0"
