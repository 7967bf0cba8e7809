"""The window that started a run dies: the run goes on, and the next window finds it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_engine.common.run_dir import read_status
from ddp_engine.common.runs import RunIndex
from tests.conftest import FAULTY, REPO, engine_env, processes_mentioning, wait_for
from tests.faults.conftest import fault_case

SLOW_LOSS = f"{FAULTY}:slow"
pytestmark = pytest.mark.slow


@fault_case("The app is SIGKILLed mid-run (it started the run with `main.py --start`)",
            "training continues and completes; the next window re-attaches to the run with "
            "its whole history and sees it complete; no process left")
def test_the_app_killed_mid_run_leaves_it_training_and_the_next_start_reattaches(
        qtbot, open_window, tmp_path: Path, observed: list[str]) -> None:
    runs_dir = tmp_path / "runs"
    preset = tmp_path / "p.toml"
    preset.write_text(f'loss = "{SLOW_LOSS}"\nmax_steps = 800\nnproc = 2\ndevice = "cpu"\n'
                      f'runs_dir = "{runs_dir}"\nlog_every = 10\n')
    app = subprocess.Popen([sys.executable, "main.py", "--runs-dir", str(runs_dir), "--config",
                            str(preset), "--start"], cwd=REPO,
                           env={**engine_env(), "QT_QPA_PLATFORM": "offscreen",
                                "HOME": str(tmp_path)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run_dir = wait_for(lambda: next(iter(runs_dir.glob("*/status.json")), None), 60,
                           "the app to start a run").parent
        wait_for(lambda: (read_status(run_dir) or {}).get("step", 0) >= 20, 120,
                 "the run to train")
        app.send_signal(signal.SIGKILL)
        app.wait(10)
        killed_at = time.monotonic()
    finally:
        app.kill()
    step = read_status(run_dir)["step"]
    wait_for(lambda: (read_status(run_dir) or {}).get("step", 0) >= step + 30, 60,
             "the run to keep training without its app")
    (summary,) = RunIndex(runs_dir).refresh()
    assert summary.live and summary.state == "running"
    w = open_window(runs_dir)
    qtbot.waitUntil(lambda: w.controller.active, timeout=20_000)
    assert w.viewing == run_dir.resolve()
    attached_at = read_status(run_dir)["step"]
    with qtbot.waitSignal(w.controller.finished, timeout=240_000) as sig:
        pass
    assert sig.args[0]["state"] == "completed" and sig.args[0]["step"] == 800
    assert w.store.info.step == 800 and w.store.mean_loss.x[0] == 10
    assert not processes_mentioning(str(run_dir))
    observed.append(f"killed at step {step}; the run went on ({summary.state}, live, "
                    f"{time.monotonic() - killed_at:.0f} s later); a new window re-attached at "
                    f"step {attached_at} with the history from step 10 and saw it complete at "
                    "800; no process left")
