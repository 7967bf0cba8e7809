"""A user's own training script under Rankscope: real 2-process gloo runs through the launcher
(``launch --script FILE.py -- ARGS``), and the same files under plain torchrun."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_engine.common.run_dir import iter_metrics, read_rank_files, read_status
from tests.conftest import (
    REPO,
    assert_default_report_steps,
    engine_env,
    run_engine,
    start_engine,
    wait_for,
)
from tests.ddp_engine.launch.test_launcher import assert_no_process_left, events, metrics

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "ddp_train.py"
CUSTOM = REPO / "examples" / "custom_loop.py"
VARIANTS = Path(__file__).parent / "scripts" / "variants.py"


def _launch(tmp_path: Path, script: Path, *script_args: str, extra: tuple[str, ...] = (),
            timeout: float = 240) -> tuple[Path, subprocess.CompletedProcess[str]]:
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--script", str(script), "--nproc", "2", "--run-dir",
                      str(run_dir), *extra, "--", *script_args, timeout=timeout)
    return run_dir, proc


def _stopped(tmp_path: Path, script: Path, *script_args: str, reports: int = 2,
             how: str = "socket") -> Path:
    """A script run that trains until stopped, stopped once it reported ``reports`` times:
    over the socket (``ddp_engine stop``, as the app) or by Ctrl+C (SIGINT to the launcher)."""
    run_dir = tmp_path / "run"
    proc = start_engine("launch", "--script", str(script), "--nproc", "2", "--run-dir",
                        str(run_dir), "--", *script_args, log=tmp_path / "out.log")
    try:
        wait_for(lambda: len(metrics(run_dir)) >= reports, 120, f"{reports} reports")
        if how == "socket":
            stopped = run_engine("stop", str(run_dir))
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        else:
            proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0, (tmp_path / "out.log").read_text()
    finally:
        proc.kill()
    return run_dir


def test_the_example_script_trains_watched_with_loss_steps_and_sync(tmp_path: Path) -> None:
    ck = tmp_path / "own.pt"
    run_dir, proc = _launch(tmp_path, EXAMPLE, "--epochs", "2", "--samples", "4096",
                            "--checkpoint", str(ck))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_status(run_dir)["state"] == "completed"
    (start,) = events(run_dir, "run_start")
    assert start["source"] == "script" and start["script"] == str(EXAMPLE)
    assert [e["epoch"] for e in events(run_dir, "epoch_start")] == [0, 1]  # set_epoch seen
    ms = metrics(run_dir)
    # 4096 samples / 2 ranks / 64 per batch = 32 optimizer steps per epoch, 2 epochs.
    assert_default_report_steps([m["step"] for m in ms], 10, 64)  # none lost at the end
    assert events(run_dir, "completed")[0]["step"] == 64
    for r in (0, 1):
        losses = [m["ranks"][r]["loss"] for m in ms]
        assert losses[-1] < 0.8 * losses[0], losses  # the loss backward() was called on
        for m in ms:
            entry = m["ranks"][r]
            assert entry["step_time_s"] > 0 and entry["samples_per_s"] > 0
            assert entry["sync_time_s"] > 0 and entry["sync_buckets"] >= 1  # DDP's timers
            assert entry["forward_s"] > 0 and entry["backward_s"] > 0
    assert ck.is_file()  # the script's own checkpoint, where it asked
    assert not events(run_dir, "unavailable")  # everything measured
    assert "epoch 1: mean loss" in (run_dir / "logs").joinpath(
        *next((run_dir / "logs").rglob("0/stdout.log")).relative_to(run_dir / "logs").parts
    ).read_text()  # the script's prints are in rank 0's log


def test_an_agreed_stop_stops_every_rank_at_one_step_with_a_checkpoint(tmp_path: Path) -> None:
    run_dir = _stopped(tmp_path, EXAMPLE, "--epochs", "1000", "--samples", "4096",
                       "--checkpoint", str(tmp_path / "never.pt"))
    status = read_status(run_dir)
    assert status["state"] == "stopped", status
    ranks = read_rank_files(run_dir)
    assert {d["state"] for d in ranks.values()} == {"stopped"}
    (step,) = {d["step"] for d in ranks.values()}  # the same optimizer step on every rank
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == step and state["source"] == "script"
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    model.load_state_dict(state["model"])  # module.state_dict(): no "module." prefix
    assert state["optimizer"]["param_groups"][0]["momentum"] == 0.9  # the script's SGD
    assert not (tmp_path / "never.pt").exists()  # the script was left at the stop
    assert_no_process_left(run_dir)


def test_the_example_files_still_run_under_plain_torchrun(tmp_path: Path) -> None:
    env = {**engine_env(), "OMP_NUM_THREADS": "1"}
    for script, args in ((EXAMPLE, ["--epochs", "1", "--samples", "2048", "--checkpoint",
                                    str(tmp_path / "plain.pt")]),
                         (CUSTOM, ["--steps", "20"])):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", "2", str(script), *args],
                              capture_output=True, text=True, timeout=240, env=env,
                              cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "plain.pt").is_file()
    assert "done at step 20" in proc.stdout  # rankscope's API did nothing, as promised


def test_a_raising_script_fails_naming_its_rank_and_exception(tmp_path: Path) -> None:
    """Its ``finally: destroy_process_group()`` runs on the failing rank while the other trains
    on: no collective of Rankscope's there (it would wait out the 120 s collective timeout)."""
    run_dir, proc = _launch(tmp_path, VARIANTS, "--raise-on-rank", "1", "--raise-at-step", "3",
                            timeout=100)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    status = read_status(run_dir)
    assert status["state"] == "failed"
    assert "rank 1" in status["reason"] and "ValueError: bad batch at step 3" in status["reason"]
    assert "ValueError: bad batch at step 3" in proc.stdout
    assert read_rank_files(run_dir)[1]["state"] == "failed"
    assert_no_process_left(run_dir)


def test_a_non_zero_exit_code_fails_the_run_and_zero_completes(tmp_path: Path) -> None:
    run_dir, proc = _launch(tmp_path / "a", VARIANTS, "--steps", "3", "--exit-code", "3")
    assert proc.returncode == 1 and read_status(run_dir)["state"] == "failed"
    assert "exited with code 3" in read_status(run_dir)["reason"]
    run_dir, proc = _launch(tmp_path / "b", VARIANTS, "--steps", "3", "--exit-code", "0")
    assert proc.returncode == 0 and read_status(run_dir)["state"] == "completed"


def test_argv_cwd_and_name_are_what_torchrun_gives(tmp_path: Path) -> None:
    cwd = tmp_path / "work"
    cwd.mkdir()
    seen = tmp_path / "seen.txt"
    run_dir, proc = _launch(tmp_path, VARIANTS, "--steps", "2", "--write-cwd", str(seen),
                            extra=("--script-cwd", str(cwd)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    where, argv, name, world = seen.read_text().splitlines()
    assert where == str(cwd) and name == "__main__" and world == "2"
    assert eval(argv) == [str(VARIANTS), "--steps", "2", "--write-cwd", str(seen)]


@pytest.mark.parametrize(("hook", "timing"), [("python", "reducer"), ("builtin", "reducer"),
                                              ("python", "hook"), ("builtin", "hook")])
def test_a_script_with_its_own_comm_hook_keeps_it(tmp_path: Path, hook: str,
                                                  timing: str) -> None:
    """By default DDP's reducer timers time its sync whatever hook it has (a Python one, DDP's
    built-in C++ ALLREDUCE). With ``--sync-timing hook`` its Python hook is wrapped and timed;
    DDP's built-in one cannot be, and the run says why. Either way the script trains, and
    max_steps stops it (completed) at step 20."""
    run_dir, proc = _launch(tmp_path, VARIANTS, "--steps", "1000", "--hook", hook,
                            extra=("--max-steps", "20", "--sync-timing", timing))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_status(run_dir)["state"] == "completed"
    assert events(run_dir, "completed")[0]["step"] == 20
    assert events(run_dir, "run_start")[0]["sync_timing"] == timing
    last = metrics(run_dir)[-1]
    assert last["step"] == 20
    sync = [r["sync_time_s"] for r in last["ranks"]]
    if hook == "python" or timing == "reducer":
        assert all(s is not None and s > 0 for s in sync), sync
        assert not events(run_dir, "unavailable")
    else:
        assert sync == [None, None]
        said = events(run_dir, "unavailable")[-1]["items"]
        assert "built-in comm hook ALLREDUCE" in said["sync"]
        assert "gradient sync timing" in proc.stdout


def test_a_script_without_ddp_reports_steps_and_loss_and_says_what_is_missing(
        tmp_path: Path) -> None:
    run_dir, proc = _launch(tmp_path, VARIANTS, "--steps", "30", "--no-ddp")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ms = metrics(run_dir)
    assert_default_report_steps([m["step"] for m in ms], 10, 30)
    assert all(r["loss"] is not None and r["samples_per_s"] is None
               for m in ms for r in m["ranks"])
    said = events(run_dir, "unavailable")[-1]["items"]
    assert set(said) == {"sync", "samples"} and "no DistributedDataParallel" in said["sync"]


def test_the_api_logs_series_and_saves_the_scripts_checkpoint_at_a_stop(tmp_path: Path) -> None:
    run_dir = _stopped(tmp_path, CUSTOM, "--steps", "100000", reports=3)
    assert read_status(run_dir)["state"] == "stopped"
    ms = metrics(run_dir)
    for m in ms:
        for r in m["ranks"]:
            assert set(r["logged"]) == {"lr", "weight_error"}
    for m in ms:  # the last value before each report: the lr of the report's own step
        lr = 0.5 * 0.5 * (1 + math.cos(math.pi * m["step"] / 100000))
        assert m["ranks"][0]["logged"]["lr"] == pytest.approx(lr, rel=1e-9)
    # A tensor, read on reporting steps: the distance to the true weights (|w| about 4 at the
    # start) is down to the data's noise within ten steps.
    assert 0 < ms[-1]["ranks"][1]["logged"]["weight_error"] < 0.1
    (step,) = {d["step"] for d in read_rank_files(run_dir).values()}
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert saved["step"] == step and saved["w"].shape == (16, 1)  # on_stop's own dict
    log = next(run_dir.rglob("0/stdout.log")).read_text()
    assert f"stopping at step {step}, as asked" in log  # should_stop() said True, once
    lines = [m for m in iter_metrics(run_dir) if m["type"] == "event"]
    assert [e["kind"] for e in lines][-1] == "stopped"


def test_ctrl_c_stops_a_script_at_one_step_as_a_built_in_run(tmp_path: Path) -> None:
    run_dir = _stopped(tmp_path, VARIANTS, "--steps", "10000000", how="sigint")
    assert read_status(run_dir)["state"] == "stopped"
    ranks = read_rank_files(run_dir)
    (step,) = {d["step"] for d in ranks.values()}
    # The launcher turned its SIGINT into the agreed stop: no rank saw the signal.
    assert {d["reason"] for d in ranks.values()} == {"a stop signal to the launcher"}
    assert read_status(run_dir)["reason"] == (f"stop requested (SIGINT to the launcher); all "
                                              f"ranks stopped at step {step}")
    # The live line names the signal too, as it happens.
    assert f"stopping at step {step} (SIGINT to the launcher)" in \
        (tmp_path / "out.log").read_text()
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == step
    assert_no_process_left(run_dir)


def test_a_sweep_runs_a_script_for_its_steps_at_each_count(tmp_path: Path) -> None:
    proc = run_engine("sweep", "--script", str(VARIANTS), "--counts", "1,2", "--steps", "20",
                      "--runs-dir", str(tmp_path / "runs"), "--", "--steps", "100000")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (group,) = (tmp_path / "runs").iterdir()
    assert group.name.startswith("variants-sweep-")
    for count in (1, 2):
        sub = group / f"nproc-{count}"
        assert read_status(sub)["state"] == "completed"
        last = metrics(sub)[-1]
        assert last["step"] == 20 and len(last["ranks"]) == count
        assert all(r["samples_per_s"] > 0 for r in last["ranks"])
