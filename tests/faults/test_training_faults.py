"""Faults inside training: a loss that turns NaN."""

from __future__ import annotations

from pathlib import Path

import torch

from ddp_engine.common.run_dir import iter_metrics, read_rank_files, read_status
from tests.conftest import FAULTY, processes_mentioning, run_engine
from tests.faults.conftest import fault_case

NAN_LOSS = f"{FAULTY}:nan_on_rank1_from_step_25"


@fault_case("NaN loss on rank 1 from step 25 (default policy)",
            "a warning event naming the ranks; an agreed stop of every rank at one step (the "
            "round that reads the report: at most one stop-check interval later); "
            "checkpoints/last.pt is the last good one (before the NaN), and loads")
def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(
        tmp_path: Path, observed: list[str]) -> None:
    run_dir = tmp_path / "run"
    done = run_engine("launch", "--nproc", "2", "--max-steps", "200", "--log-every", "10",
                      "--checkpoint-every", "20", "--loss", NAN_LOSS, "--run-dir", str(run_dir))
    status = read_status(run_dir)
    assert done.returncode == 0, done.stderr[-2000:]
    assert status["state"] == "stopped" and "non-finite loss" in status["reason"]
    warnings = [m for m in iter_metrics(run_dir)
                if m.get("type") == "event" and m.get("kind") == "warning"]
    # rank 0 is NaN too by then: the all-reduce averaged rank 1's NaN gradient into its weights
    assert warnings and 1 in warnings[0]["ranks"] and warnings[0]["step"] == 30
    steps = {r["step"] for r in read_rank_files(run_dir).values()}
    # the report of step 30 travels in a round that is read at the next one: the next
    # report's (--log-every 10) at the latest, sooner if a stop check falls first
    assert len(steps) == 1 and 30 <= min(steps) <= 40
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 20
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    assert not processes_mentioning(str(run_dir))
    observed.append(f"warning at step {warnings[0]['step']} naming ranks "
                    f"{warnings[0]['ranks']}; every rank stopped at step {steps.pop()}; "
                    f"last.pt from step {ckpt['step']}, all weights finite; state "
                    f"{status['state']}, exit code {done.returncode}; no process left")


@fault_case("NaN loss with --nonfinite-loss warn",
            "a warning event; training goes on to max_steps and completes")
def test_a_nan_loss_only_warns_when_asked_to(tmp_path: Path, observed: list[str]) -> None:
    run_dir = tmp_path / "run"
    done = run_engine("launch", "--nproc", "2", "--max-steps", "40", "--log-every", "10",
                      "--loss", NAN_LOSS, "--nonfinite-loss", "warn", "--run-dir", str(run_dir))
    status = read_status(run_dir)
    assert done.returncode == 0 and status["state"] == "completed" and status["step"] == 40
    warnings = [m for m in iter_metrics(run_dir) if m.get("kind") == "warning"]
    assert [w["step"] for w in warnings] == [30, 40]
    assert "training goes on" in warnings[0]["message"]
    observed.append(f"warnings at steps {[w['step'] for w in warnings]}; completed at step "
                    f"{status['step']}")
