"""The Scaling tab: a sweep's group folder drawn, and a real sweep started from the window."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from ddp_engine.common.sweep_plan import read_group, result_rows
from tests.conftest import make_run_folder, processes_mentioning


def test_a_finished_sweep_opens_in_the_scaling_tab(open_window, tmp_path: Path) -> None:
    group = tmp_path / "runs" / "mlp-synthetic-sweep-1"
    group.mkdir(parents=True)
    for n in (1, 2):
        make_run_folder(group, f"nproc-{n}", world_size=n)
    (group / "group.json").write_text(json.dumps({
        "kind": "scaling_sweep", "version": 1, "state": "completed", "counts": [1, 2],
        "steps": 30, "device": "cpu", "config": {"model": "mlp"}, "started": 1.0,
        "ended": 9.0, "sweep_pid": 1, "current": None, "reason": None,
        "results": [{"nproc": 1, "run": "nproc-1", "state": "completed",
                     "samples_per_s": 1000.0, "efficiency": 1.0},
                    {"nproc": 2, "run": "nproc-2", "state": "completed",
                     "samples_per_s": 1800.0, "efficiency": 0.9}]}))
    w = open_window(tmp_path / "runs")
    assert w.open_run(group) == "group"
    view = w.scaling
    assert w.tabs.currentWidget() is view
    x, y = view.throughput.curves["measured"].getData()
    assert list(x) == [1, 2] and list(y) == [1000.0, 1800.0]
    _, ideal = view.throughput.curves["ideal (linear)"].getData()
    assert list(ideal) == [1000.0, 2000.0]
    _, eff = view.efficiency.curves["measured"].getData()
    assert list(eff) == [1.0, 0.9]
    assert "completed" in view.label.text() and "efficiency 0.90" in view.label.text()
    assert not view.stop_button.isEnabled()
    assert view.warnings.isHidden() and "\u26a0" not in view.label.text()


def test_a_count_the_sweep_distrusts_is_marked_and_says_why(open_window, tmp_path: Path) -> None:
    """Issue 30 item 5: efficiency 4.07 from two usable reports was shown without a word."""
    group = tmp_path / "runs" / "mlp-synthetic-sweep-1"
    group.mkdir(parents=True)
    for n in (1, 2):
        make_run_folder(group, f"nproc-{n}", world_size=n)
    rows = result_rows([(1, "completed", 3843.0, 0.01, 2), (2, "completed", 31309.0, 0.02, 4)])
    (group / "group.json").write_text(json.dumps({
        "kind": "scaling_sweep", "version": 1, "state": "completed", "counts": [1, 2],
        "steps": 20, "device": "cpu", "config": {"model": "mlp"}, "started": 1.0,
        "ended": 9.0, "sweep_pid": 1, "current": None, "reason": None, "results": rows}))
    w = open_window(tmp_path / "runs")
    assert w.open_run(group) == "group"
    view = w.scaling
    assert "1 device: 3,843 samples/s, efficiency 1.00 (\u26a0)" in view.label.text()
    assert "efficiency 4.07 (\u26a0)" in view.label.text()
    assert not view.warnings.isHidden()
    assert view.warnings.text().splitlines() == [
        "\u26a0 1 device: only 2 reports: the throughput includes the warm-up; raise --steps "
        "(at least 3 reports)",
        "\u26a0 2 devices: efficiency 4.07 is above 1.1, better than linear: the smaller count "
        "was slowed (warm-up, other work on the machine); raise --steps or run again"]


def test_the_dashboard_follows_a_count_once_its_launcher_has_written_its_status(
        qtbot, open_window, fake_launcher, tmp_path: Path) -> None:
    """The sweep names its current count as it starts that count's launcher, which writes the
    count's status.json a moment later (longer on a loaded machine). A poll in between found
    nothing to attach to: the dashboard showed a record of the count, never the live run, and
    Stop was not the sweep's (CI caught it). The count is followed once it can be attached."""
    group = tmp_path / "runs" / "mlp-synthetic-sweep-1"
    (group / "nproc-1").mkdir(parents=True)  # as the sweep leaves it before the launcher runs
    (group / "group.json").write_text(json.dumps({
        "kind": "scaling_sweep", "version": 1, "state": "running", "counts": [1, 2],
        "steps": 1000, "device": "cpu", "config": {"model": "mlp"},
        "started": fake_launcher.create_time(), "ended": None, "sweep_pid": fake_launcher.pid,
        "hostname": socket.gethostname(), "current": "nproc-1", "reason": None, "results": []}))
    w = open_window(tmp_path / "runs")
    followed: list[Path] = []
    w.scaling.current_run.connect(followed.append)
    assert w.open_run(group) == "group"
    assert w.scaling.live and followed == [] and w.viewing is None  # not yet: no status
    shutil.rmtree(group / "nproc-1")
    make_run_folder(group, "nproc-1", state="running", world_size=1,
                    launcher_pid=fake_launcher.pid, started=fake_launcher.create_time())
    w.scaling.poll_once()
    assert followed == [group / "nproc-1"]
    assert w.controller.active and w.viewing == (group / "nproc-1").resolve()
    assert w.sweeps.watching_sweep()  # Stop now stops the sweep
    w.scaling.poll_once()
    assert followed == [group / "nproc-1"]  # once
    fake_launcher.kill()  # the count's launcher (and the sweep) gone: the window sees it end
    qtbot.waitUntil(lambda: w.controller.poll_once() or not w.controller.active,
                    timeout=30_000)


def test_the_last_counts_end_leaves_the_sweeps_words_in_the_status_bar(
        qtbot, open_window, fake_launcher, tmp_path: Path) -> None:
    """The sweep has completed (the Scaling tab said so) and only then does the window see its
    last count end: the status bar keeps speaking of the sweep (issue 18 item 11), not of that
    count (the order CI's load gave once)."""
    group = tmp_path / "runs" / "mlp-synthetic-sweep-1"
    group.mkdir(parents=True)
    count = make_run_folder(group, "nproc-2", state="running", world_size=2,
                            launcher_pid=fake_launcher.pid, started=fake_launcher.create_time())
    (group / "group.json").write_text(json.dumps({
        "kind": "scaling_sweep", "version": 1, "state": "completed", "counts": [2],
        "steps": 30, "device": "cpu", "config": {"model": "mlp"}, "started": 1.0, "ended": 9.0,
        "sweep_pid": 1, "current": None, "reason": None,
        "results": result_rows([(2, "completed", 1800.0, 0.01, 4)])}))
    w = open_window(tmp_path / "runs")
    assert w.open_run(count) == "live"
    w.scaling.show_group(group)
    said = w.message_label.text()
    assert said.startswith("scaling sweep ") and "completed" in said
    fake_launcher.kill()
    qtbot.waitUntil(lambda: w.controller.poll_once() or not w.controller.active,
                    timeout=30_000)
    assert w.message_label.text() == said


def test_bad_sweep_input_is_named_and_starts_nothing(open_window, tmp_path: Path) -> None:
    w = open_window(tmp_path / "runs")
    w.scaling.counts.setText("1,x")
    assert w.start_sweep() is None
    assert "counts must be comma-separated" in w.scaling.label.text()
    w.scaling.counts.setText("1,64")
    assert w.start_sweep() is None
    assert "counts: 64 is more than" in w.scaling.label.text()
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_a_sweep_started_from_the_window_plots_every_count(qtbot, open_window,
                                                          tmp_path: Path) -> None:
    w = open_window(tmp_path / "runs")
    w.panel.runs_dir.setText(str(tmp_path / "runs"))
    w.message_label.setText("an old message of the last run")
    w.scaling.counts.setText("1,2")
    w.scaling.steps.setValue(30)
    followed: list[Path] = []
    said: list[str] = []
    w.scaling.current_run.connect(followed.append)
    w.scaling.said.connect(said.append)
    group = w.start_sweep()
    assert group is not None and w.tabs.currentWidget() is w.scaling
    assert not w.scaling.start_button.isEnabled() and w.start_sweep() is None
    assert w.start_run() is None and "a scaling sweep is training" in w.message_label.text()
    qtbot.waitUntil(lambda: w.scaling.poll_once(), timeout=240_000)
    data = read_group(group)
    assert data["state"] == "completed", data
    # Issue 18 item 11: the dashboard followed each count as it trained, and the status bar
    # spoke of the sweep, not of an old run.
    assert followed == [group / "nproc-1", group / "nproc-2"], followed
    assert w.viewing == group / "nproc-2"
    assert w.tabs.currentWidget() is w.scaling  # the tab on screen stayed
    assert any("training nproc-2" in text for text in said), said
    assert "scaling sweep" in w.message_label.text() and "completed" in w.message_label.text()
    x, y = w.scaling.throughput.curves["measured"].getData()
    assert list(x) == [1, 2] and all(v > 0 for v in y)
    assert data["results"][0]["efficiency"] == pytest.approx(1.0)
    # every 10 steps (the form's log_every is 0, the time pace): 3 reports, no warning for it
    assert [r["reports"] for r in data["results"]] == [3, 3]
    w.runs.refresh()
    qtbot.waitUntil(lambda: w.runs.item(group / "nproc-2") is not None, timeout=10_000)
    assert w.runs.item(group).childCount() == 2
    assert not processes_mentioning(str(group))


@pytest.mark.slow
def test_stop_while_the_dashboard_follows_a_sweep_stops_the_sweep(qtbot, open_window,
                                                                  tmp_path: Path) -> None:
    """Shift+F5 on a sweep's count, followed by the dashboard: the whole sweep stops (its
    count at an agreed step, no further count), not that count alone."""
    w = open_window(tmp_path / "runs")
    w.panel.runs_dir.setText(str(tmp_path / "runs"))
    w.scaling.counts.setText("1,2")
    w.scaling.steps.setValue(1_000_000)
    group = w.start_sweep()
    assert group is not None
    qtbot.waitUntil(lambda: w.controller.active and w.viewing == group / "nproc-1",
                    timeout=120_000)
    assert w.stop_action.isEnabled()
    w.stop_run()
    qtbot.waitUntil(lambda: w.scaling.poll_once(), timeout=120_000)
    data = read_group(group)
    assert data["state"] == "stopped", data
    assert not (group / "nproc-2").exists()
    # the window watched that count: it saw it end (nothing left to ask about at closing)
    qtbot.waitUntil(lambda: not w.controller.active, timeout=60_000)
    assert not processes_mentioning(str(group))
