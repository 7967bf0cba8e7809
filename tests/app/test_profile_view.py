"""The dashboard's profile panel (issue 31): the reading of two real gloo traces (a DDP run
whose rank 1 sleeps 20 ms in its forward), a run folder's latest profile shown when the run is,
a broken one named, the Profile button's states, and a profile taken of a live 2-rank run."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPointF
from PySide6.QtWidgets import QTableWidget

from app.profile_tables import PARTS, rank_columns
from app.profile_view import ENDED_TIP, UNDER_WAY, ProfilePanel, ProfileTaker
from ddp_engine.common.profile_files import PROFILES_DIR, SUMMARY_FILE, profile_folders
from ddp_engine.common.profile_summary import summarize
from ddp_engine.common.protocol import MONITOR_FILE
from ddp_engine.common.run_dir import iter_metrics
from tests.conftest import endless_run, wait_for

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "profiles" / "ddp-2rank"
"""rank-0.json.gz and rank-1.json.gz: 5 steps of a 2-rank gloo DDP run, rank 1 20 ms late."""


def _panel(qtbot) -> ProfilePanel:  # noqa: ANN001 (pytest-qt's fixture)
    panel = ProfilePanel()
    qtbot.addWidget(panel)
    panel.resize(1000, 560)
    return panel


def _cells(table: QTableWidget) -> list[list[str]]:
    return [[table.item(r, c).text() for c in range(table.columnCount())]
            for r in range(table.rowCount())]


def _run_with_profile(tmp_path: Path, *files: str) -> Path:
    """A run folder whose one profile holds the fixture's traces (no summary.json)."""
    run = tmp_path / "run"
    folder = run / PROFILES_DIR / "20261207-033400-step40"
    folder.mkdir(parents=True)
    for name in files:
        shutil.copy(TRACES / name, folder / name)
    return run


def _trains(run_dir: Path) -> bool:
    return any(m["type"] == "metrics" for m in iter_metrics(run_dir))


def assert_shows_the_ddp_profile(panel: ProfilePanel, summary: dict[str, Any]) -> None:
    view = panel.view
    assert not panel.isHidden() and not view.isHidden()
    assert "ms per step" in view.headline.text()
    assert "2 of 2 ranks" in view.headline.text()
    # Per rank: every part in a column of its own, adding up to the step.
    columns = [view.ranks.horizontalHeaderItem(c).text() for c in range(view.ranks.columnCount())]
    assert columns == rank_columns("cpu") and "waiting" in columns  # CPU: "idle" is waiting
    rows = _cells(view.ranks)
    assert [row[0] for row in rows] == ["0", "1"]
    for row in rows:
        parts = sum(float(x) for x in row[2:2 + len(PARTS)])
        assert parts == pytest.approx(float(row[1]), rel=0.10), row
    # Rank 1 is late into every all-reduce: it waits least, rank 0 waits for it.
    kinds = [row[0] for row in _cells(view.collectives)]
    assert "all_reduce" in kinds
    all_reduce = _cells(view.collectives)[kinds.index("all_reduce")]
    assert all_reduce[-1].startswith("rank 1 x"), all_reduce
    assert view.last.isVisibleTo(view) and view.last.text().startswith("Last to arrive: rank 1,")
    assert "Bus bandwidth, all_reduce" in view.bandwidth.text()
    # One stacked bar per rank, its segments' widths in proportion to the parts' ms.
    bars = view.bars.bar_rects()
    assert len(bars) == 2 and all(b.width() > 0 for b in bars)
    for per_rank, segments, bar in zip(summary["per_rank"], view.bars.segments(), bars,
                                       strict=True):
        assert sum(r.width() for _, r in segments) == pytest.approx(bar.width())
        for part, rect in segments:
            share = per_rank["parts_ms"][part] / sum(per_rank["parts_ms"].values())
            assert rect.width() == pytest.approx(bar.width() * share, abs=0.5)
        part, rect = max(segments, key=lambda s: s[1].width())
        assert view.bars.tip_at(rect.center()).startswith(f"rank {per_rank['rank']}: ")
    assert view.bars.tip_at(QPointF(-5, -5)) is None
    # The slowest rank's top operators, and where the traces are.
    assert 0 < view.operators.rowCount() <= 5
    assert view.operators_title.text().startswith("Top operators of rank ")
    assert summary["folder"] in view.where.text() and "ui.perfetto.dev" in view.where.text()
    assert view.folder == summary["folder"]


def test_a_summary_of_real_traces_is_shown_in_tables_and_bars(qtbot) -> None:  # noqa: ANN001
    panel = _panel(qtbot)
    summary = summarize(TRACES)
    assert panel.isHidden()  # nothing to show yet
    with qtbot.waitSignal(panel.shown, timeout=1000):
        panel.show_summary(summary)
    assert not panel.isHidden() and not panel.view.isHidden()
    assert_shows_the_ddp_profile(panel, summary)
    panel.show()
    qtbot.waitExposed(panel)
    assert panel.view.tabs.height() <= 230 and panel.view.bars.width() > 0


def test_a_run_with_a_profile_shows_its_latest_made_from_its_traces(
        qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    run = _run_with_profile(tmp_path, "rank-0.json.gz", "rank-1.json.gz")
    folder = profile_folders(run)[-1]
    panel = _panel(qtbot)
    with qtbot.waitSignal(panel.shown, timeout=30_000) as shown:
        panel.set_run(run)
    summary = shown.args[0]
    assert summary["folder"] == str(folder) and (folder / SUMMARY_FILE).is_file()
    assert_shows_the_ddp_profile(panel, summary)
    assert panel.status.isHidden()
    # The run ends: its profile stays, but no new one can be taken.
    panel.set_ended(True)
    assert not panel.view.isHidden() and not panel.button.isEnabled()
    # Another run, without profiles: the panel goes.
    panel.set_run(tmp_path / "other")
    assert panel.isHidden() and panel.summary is None


def test_a_broken_trace_is_named_and_nothing_raises(qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    run = _run_with_profile(tmp_path, "rank-1.json.gz")
    folder = profile_folders(run)[-1]
    (folder / "rank-0.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [')[:-9])
    panel = _panel(qtbot)
    panel.set_run(run)
    qtbot.waitUntil(lambda: "could not be read" in panel.status.text(), timeout=30_000)
    text = panel.status.text()
    assert str(folder) in text and "Error" in text, text
    assert not panel.isHidden() and panel.view.isHidden() and panel.summary is None


def test_the_button_follows_the_step_count_and_the_run(qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    panel = _panel(qtbot)
    assert panel.button.text() == "Profile 5 steps" and panel.steps.value() == 5
    assert panel.controls.isAncestorOf(panel.steps) and panel.controls.isAncestorOf(panel.button)
    assert not panel.button.isEnabled()  # no run shown
    panel.set_run(tmp_path)
    assert panel.button.isEnabled() and "torch.profiler" in panel.button.toolTip()
    assert "5 steps" in panel.button.toolTip()
    panel.steps.setValue(12)
    assert panel.button.text() == "Profile 12 steps" and "12 steps" in panel.button.toolTip()
    panel.steps.setValue(1)
    assert panel.button.text() == "Profile 1 step"
    assert panel.steps.maximum() == 50 and panel.steps.minimum() == 1
    panel.set_ended(True)
    assert not panel.button.isEnabled() and panel.button.toolTip() == ENDED_TIP
    assert not panel.take()
    panel.set_ended(False)
    assert panel.button.isEnabled()


def test_asking_a_folder_with_no_live_run_fails_with_the_reason(
        qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    taker = ProfileTaker()
    with qtbot.waitSignal(taker.failed, timeout=10_000) as failed:
        taker.start(tmp_path, 3)
    assert failed.args[0] == tmp_path
    assert MONITOR_FILE in failed.args[1] and "\n" not in failed.args[1]
    # Through the panel: the reason in its status line, the button back.
    panel = _panel(qtbot)
    panel.set_run(tmp_path)
    with qtbot.waitSignal(panel.taker.failed, timeout=10_000):
        panel.button.click()
        assert not panel.isHidden() and panel.status.text() == "asking the ranks\u2026"
        assert not panel.button.isEnabled()
    assert panel.status.text().startswith("Profile not taken: ") and panel.button.isEnabled()


def test_a_profile_under_way_of_one_run_leaves_another_free(qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    """Run A asked for a profile (its rank 0 here a socket that has not answered yet); run B
    shown meanwhile can be profiled; A shown again says its profile is under way; A's answer
    while B is shown changes nothing of B's."""
    a, b = tmp_path / "a", tmp_path / "b"
    for run in (a, b):
        run.mkdir()
    with socket.create_server(("127.0.0.1", 0)) as server:
        (a / MONITOR_FILE).write_text(json.dumps({"host": "127.0.0.1", "port":
                                                  server.getsockname()[1], "token": "t",
                                                  "pid": os.getpid()}))
        panel = _panel(qtbot)
        panel.set_run(a)
        assert panel.take() and not panel.button.isEnabled() and not panel.take()
        panel.set_run(b)
        assert panel.button.isEnabled() and panel.status.isHidden()
        panel.set_run(a)
        assert not panel.button.isEnabled() and panel.status.text() == UNDER_WAY
        assert panel.button.toolTip().startswith("A profile of this run is under way")
        panel.set_run(b)
        with qtbot.waitSignal(panel.taker.failed, timeout=10_000) as failed:
            server.accept()[0].close()  # A's rank 0 hangs up
    assert failed.args[0] == a and panel.run_dir == b
    assert panel.status.isHidden() and panel.button.isEnabled()
    panel.set_run(a)
    assert panel.button.isEnabled() and panel.status.isHidden()


@pytest.mark.slow
def test_a_profile_of_a_live_run_is_taken_and_shown(qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    with endless_run(tmp_path, "--log-every", "5") as (proc, run_dir):
        # Asked as soon as rank 0 serves, while the trainer is still being built: the ask is
        # kept for the first round.
        wait_for(lambda: (run_dir / MONITOR_FILE).exists() or proc.poll() is not None, 120,
                 "rank 0 to serve")
        assert proc.poll() is None, (tmp_path / "out.log").read_text()
        panel = _panel(qtbot)
        panel.set_run(run_dir)
        panel.steps.setValue(3)
        statuses: list[str] = []
        panel.taker.started.connect(lambda _run, _msg: statuses.append(panel.status.text()))
        with qtbot.waitSignal(panel.shown, timeout=240_000) as shown:
            panel.button.click()
        summary = shown.args[0]
    assert statuses and statuses[0].startswith("recording steps ") and "\u2013" in statuses[0]
    assert summary["steps"] == 3 and summary["ranks"] == [0, 1]
    assert Path(summary["folder"]).parent == run_dir / PROFILES_DIR
    assert panel.view.ranks.rowCount() == 2 and len(panel.view.bars.bar_rects()) == 2
    assert panel.status.isHidden() and panel.button.isEnabled()


def test_a_profile_written_while_shown_replaces_the_one_shown(qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    """As when a profile asked from a terminal is written (the dashboard calls refresh on its
    "written" event): the panel reads the newest folder, not only when the run changes."""
    run = _run_with_profile(tmp_path, "rank-0.json.gz", "rank-1.json.gz")
    panel = _panel(qtbot)
    with qtbot.waitSignal(panel.shown, timeout=30_000):
        panel.set_run(run)
    newer = run / PROFILES_DIR / "20261207-033500-step90"
    shutil.copytree(TRACES, newer)
    with qtbot.waitSignal(panel.shown, timeout=30_000) as shown:
        panel.refresh()
    assert shown.args[0]["folder"] == str(newer) and panel.summary == shown.args[0]
