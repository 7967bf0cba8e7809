"""The runs index: every run folder summarized, live decided from processes, groups nested."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ddp_engine.common.runs import (
    INTERRUPTED,
    RunIndex,
    fmt_duration,
    owner_process,
    process_if_alive,
)
from tests.conftest import make_run_folder


def test_runs_are_listed_newest_first_with_what_the_list_shows(tmp_path: Path) -> None:
    make_run_folder(tmp_path, "old", state="completed", started=1_000.0, steps=30)
    make_run_folder(tmp_path, "new", state="stopped", started=2_000.0, steps=20,
                    losses=lambda step, rank: 1.0 + rank - step / 100)
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "stray.txt").write_text("x")
    runs = RunIndex(tmp_path).refresh()
    assert [r.name for r in runs] == ["new", "old"]
    new = runs[0]
    assert (new.state, new.live, new.model, new.dataset, new.devices) == (
        "stopped", False, "mlp", "synthetic", "cpu x2")
    assert (new.step, new.total_steps, new.val_loss) == (20, 20, 0.5)
    # best loss: the lowest mean over ranks (ranks 1.0-s/100 and 2.0-s/100 at s=20)
    assert abs(new.best_loss - 1.3) < 1e-9
    assert new.duration_s == 20.0 and new.resumable


def test_a_run_of_a_users_script_is_listed_by_the_scripts_name(tmp_path: Path) -> None:
    run = make_run_folder(tmp_path, "train-1")
    config = json.loads((run / "config.json").read_text())
    config.update(script="/home/me/jobs/train.py", script_args=["--epochs", "3"])
    (run / "config.json").write_text(json.dumps(config))
    (summary,) = RunIndex(tmp_path).refresh()
    assert (summary.model, summary.dataset) == ("train.py", "(script)")


def test_a_run_whose_launcher_is_gone_is_interrupted_not_running(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    make_run_folder(tmp_path, "killed", state="running", launcher_pid=dead.pid)
    (s,) = RunIndex(tmp_path).refresh()
    assert s.state == INTERRUPTED and not s.live
    assert "launcher is gone" in (s.reason or "")


def test_a_run_whose_launcher_lives_is_live(tmp_path: Path, fake_launcher) -> None:
    run = make_run_folder(tmp_path, "alive", state="running", launcher_pid=fake_launcher.pid,
                          started=time.time())
    (s,) = RunIndex(tmp_path).refresh()
    assert s.live and s.state == "running" and not s.resumable and not s.deletable
    assert owner_process(run).pid == fake_launcher.pid


def test_a_reused_pid_does_not_make_an_old_run_live(tmp_path: Path, fake_launcher) -> None:
    # status.json says the launcher started long before this pid's process did
    pid = fake_launcher.pid
    assert process_if_alive(pid, started=fake_launcher.create_time() - 3600) is None
    make_run_folder(tmp_path, "old", state="running", launcher_pid=pid, started=1_000.0)
    (s,) = RunIndex(tmp_path).refresh()
    assert not s.live and s.state == INTERRUPTED


def test_a_pid_that_is_not_ours_is_never_taken_for_a_launcher(tmp_path: Path) -> None:
    # this test process is alive and old enough, but is not a ddp_engine process
    make_run_folder(tmp_path, "other", state="running", launcher_pid=os.getpid(),
                    started=time.time())
    (s,) = RunIndex(tmp_path).refresh()
    assert not s.live and s.state == INTERRUPTED
    assert process_if_alive(os.getpid(), mentions=None) is not None


def test_a_run_of_another_machine_is_neither_live_nor_deletable(tmp_path: Path,
                                                               fake_launcher) -> None:
    run = make_run_folder(tmp_path, "remote", state="running", launcher_pid=fake_launcher.pid,
                          started=time.time())
    status = json.loads((run / "status.json").read_text())
    status["hostname"] = "some-other-node"
    (run / "status.json").write_text(json.dumps(status))
    (s,) = RunIndex(tmp_path).refresh()
    assert not s.live and s.state == "running" and s.hostname == "some-other-node"
    assert not s.deletable and owner_process(run) is None


def test_a_plain_torchrun_run_is_live_through_monitor_json(tmp_path: Path,
                                                          fake_launcher) -> None:
    run = tmp_path / "plain"
    run.mkdir()
    (run / "monitor.json").write_text(json.dumps({
        "host": "127.0.0.1", "port": 1, "token": "t", "pid": fake_launcher.pid,
        "started": time.time()}))
    (s,) = RunIndex(tmp_path).refresh()
    assert s.live and s.state == "running"
    fake_launcher.kill()
    fake_launcher.wait()
    with open(run / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"type": "event", "time": 5.0, "kind": "completed", "step": 7}) + "\n")
    (s,) = RunIndex(tmp_path).refresh()
    assert (s.live, s.state, s.step) == (False, "completed", 7)


def test_a_resumed_run_names_its_parent(tmp_path: Path) -> None:
    parent = make_run_folder(tmp_path, "parent", state="stopped", started=1.0)
    make_run_folder(tmp_path, "child", started=2.0,
                    resume=str(parent / "checkpoints" / "last.pt"))
    child = RunIndex(tmp_path).refresh()[0]
    assert child.name == "child" and child.parent == parent


def test_best_loss_follows_a_growing_metrics_file(tmp_path: Path) -> None:
    """(the run is not live: its metrics are still read as they grow, e.g. a remote run)"""
    run = make_run_folder(tmp_path, "r", state="running", started=1.0)
    index = RunIndex(tmp_path)
    before = index.refresh()[0].best_loss
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"type": "metrics", "time": time.time(), "step": 40,
                            "ranks": [{"rank": 0, "loss": 0.01}, {"rank": 1, "loss": None}]})
                + "\n")
        f.write('{"type": "metrics", "step": 50, "ranks": [{"rank": 0, "lo')  # torn
    assert index.refresh()[0].best_loss == 0.01 < before


def test_a_sweep_group_lists_its_runs_as_children(tmp_path: Path) -> None:
    group = tmp_path / "mlp-sweep-1"
    group.mkdir()
    for n in (1, 2, 10):
        make_run_folder(group, f"nproc-{n}", world_size=n, started=3.0 + n,
                        losses=lambda step, rank, n=n: n + 1.0 / step)
    (group / "group.json").write_text(json.dumps({
        "kind": "scaling_sweep", "state": "completed", "counts": [1, 2], "steps": 30,
        "device": "cpu", "config": {"model": "mlp", "dataset": "synthetic"}, "started": 3.0,
        "ended": 9.0}))
    make_run_folder(tmp_path, "single", started=1.0)
    runs = RunIndex(tmp_path).refresh()
    assert [r.name for r in runs] == ["mlp-sweep-1", "single"]
    g = runs[0]
    assert g.kind == "scaling_sweep" and g.state == "completed" and g.nproc == 2
    assert [c.name for c in g.children] == ["nproc-1", "nproc-2", "nproc-10"]
    assert abs(g.best_loss - (1 + 1 / 30)) < 1e-9


def test_durations_read_as_clock_times() -> None:
    assert fmt_duration(5) == "0:05" and fmt_duration(3725) == "1:02:05"
    assert fmt_duration(None) == "?" and fmt_duration(float("nan")) == "?"


def test_the_runs_command_lists_them_as_the_panel_does(tmp_path: Path, capsys) -> None:
    from ddp_engine.launch.cli import main

    make_run_folder(tmp_path, "older", state="failed", started=1.0, steps=20)
    make_run_folder(tmp_path, "newer", state="completed", started=2.0, steps=30)
    assert main(["runs", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "STATE", "MODEL"]
    assert lines[1].split()[:6] == ["newer", "completed", "mlp", "synthetic", "cpu", "x2"]
    assert lines[2].split()[:2] == ["older", "failed"]
    assert main(["runs", str(tmp_path / "nope")]) == 2
    assert "runs_dir: " in capsys.readouterr().err


def test_the_list_comes_first_and_best_losses_fill_in_within_a_time_budget(
        tmp_path: Path) -> None:
    make_run_folder(tmp_path, "a", steps=50)
    index = RunIndex(tmp_path, budget_s=0.0)  # no time at all for reading metrics
    (s,) = index.refresh()
    assert s.name == "a" and s.state == "completed" and s.best_loss is None and index.pending
    index.budget_s = 5.0
    (s,) = index.refresh()
    assert s.best_loss == 2.0 / 51 and not index.pending
