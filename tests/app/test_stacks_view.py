"""The dashboard's Stacks button and panel on a real hung 2-rank gloo run: the grouped stacks
shown with the saved file named, and taken once by themselves when the run looks hung."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.dashboard import Dashboard
from app.metric_store import MetricStore
from app.stacks_view import StacksPanel
from ddp_engine.common.stacks import StackReport
from tests.conftest import FAULTY, endless_run, wait_for

pytestmark = pytest.mark.slow


def _take(qtbot, panel: StacksPanel) -> StackReport:  # noqa: ANN001 (pytest-qt's fixture)
    with qtbot.waitSignal(panel.shown, timeout=30_000) as shown:
        panel.button.click()
    return shown.args[0]


def test_stacks_of_a_hung_run_are_shown_and_taken_once_when_it_looks_hung(
        qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    with endless_run(tmp_path, "--log-every", "1", "--loss",
                     f"{FAULTY}:stuck_on_rank1") as (_proc, run_dir):
        dash = Dashboard(MetricStore())
        qtbot.addWidget(dash)
        panel = dash.stacks
        assert not panel.button.isEnabled()  # no run shown
        wait_for(lambda: (run_dir / "ranks").is_dir(), 120, "the run folder")
        dash.run_dir = run_dir
        assert panel.button.isEnabled() and panel.isHidden()
        wait_for(lambda: "rank 1: stuck_here" in _take(qtbot, panel).summary, 120,
                 "rank 1 stuck", interval=0.5)
        assert panel.isVisibleTo(dash)
        text = panel.text.toPlainText()
        assert "rank 0: backward in trainer.py:" in text and "rank 1: stuck_here" in text
        assert "waiting for the other ranks" in text
        saved = panel.header.text().rsplit("saved in ", 1)[1]
        assert Path(saved).parent == run_dir / "ranks" and Path(saved).is_file()
        # The hang alert takes them once by itself, not at every alert of the same run.
        panel.hide()
        with qtbot.waitSignal(panel.shown, timeout=30_000):
            dash.looks_hung.emit("no progress for 12 s")
        assert panel.isVisibleTo(dash) and "rank 1: stuck_here" in panel.text.toPlainText()
        assert not panel.take(run_dir, automatic=True)
        # Another run shown: the panel goes; a remote one (no folder) has no Stacks.
        dash.run_dir = None
        assert panel.isHidden() and not panel.button.isEnabled()
