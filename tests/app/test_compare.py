"""The Compare view of two run folders written by hand (docs/RUN_FOLDER.md): the settings table
and the validation loss beside the training loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QLabel, QTabWidget

from app.compare import CHARTS_SHARE, DIFFERS_BACKGROUND, X_TIME, CompareView

START = 1_790_000_000.0


def _run(parent: Path, name: str, config: dict, evals: list[tuple[int, float]]) -> Path:
    """A finished 2-rank run of 30 steps: config.json and metrics.jsonl (metrics every 10
    steps, an ``eval`` event per ``(step, val_loss)``)."""
    run = parent / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({**config, "run_dir": str(run)}))
    lines: list[dict] = [{"type": "event", "time": START, "kind": "run_start",
                          "total_steps": 30, "world_size": 2, "start_step": 0}]
    for step in (10, 20, 30):
        lines.append({"type": "metrics", "time": START + step, "step": step, "epoch": 0,
                      "ranks": [{"rank": r, "loss": 2.0 / step + r, "samples_per_s": 100.0,
                                 "device": "cpu"} for r in range(2)]})
        lines += [{"type": "event", "time": START + s + 0.5, "kind": "eval", "step": s,
                   "val_loss": v, "val_accuracy": 0.5} for s, v in evals if s == step]
    lines.append({"type": "event", "time": START + 31, "kind": "completed", "step": 30})
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return run


@pytest.fixture
def view(qtbot, tmp_path: Path) -> CompareView:
    base = {"model": "gpt-tiny", "dataset": "synthetic", "device": "cpu", "nproc": 2,
            "batch_size": 32, "optimizer": "adamw", "gpus": None}
    a = _run(tmp_path, "a", {**base, "lr": 0.001, "model_args": {"hidden": 64}},
             evals=[(10, 0.9), (20, 0.7), (30, 0.6)])
    b = _run(tmp_path, "b", {**base, "lr": 0.003, "model_args": {"hidden": 64, "layers": 2}},
             evals=[])
    del_gpus = json.loads((b / "config.json").read_text())
    del del_gpus["gpus"]  # an older config.json without the key: the same as null
    (b / "config.json").write_text(json.dumps(del_gpus))
    v = CompareView()
    qtbot.addWidget(v)
    v.resize(1000, 700)
    v.show()
    v.set_runs([a, b])
    return v


def test_the_settings_table_highlights_what_differs_first(view: CompareView) -> None:
    table = view.settings.table
    assert [table.horizontalHeaderItem(c).text() for c in range(3)] == ["setting", "a", "b"]
    # issue 30 item 13: each run's own folder is shown, not flagged as a difference
    assert view.settings.highlighted() == ["model_args.layers", "lr"]
    rows = [[table.item(r, c).text() for c in range(3)] for r in range(table.rowCount())]
    assert rows[:2] == [["model_args.layers", "-", "2"], ["lr", "0.001", "0.003"]]
    same = {row[0]: row[1:] for row in rows[2:]}
    assert same["model_args.hidden"] == ["64", "64"] and same["gpus"] == ["-", "-"]
    assert [Path(d).name for d in same["run_dir"]] == ["a", "b"]
    for col in range(3):
        differing, equal = table.item(1, col), table.item(3, col)
        assert differing.background().color().name() == DIFFERS_BACKGROUND
        assert QFont(differing.font()).bold()
        assert equal.background().style().name == "NoBrush" and not QFont(equal.font()).bold()
    assert view.settings.heading.text().startswith("Settings: 2 of ")
    view.settings.only_differences.setChecked(True)
    shown = [r for r in range(table.rowCount()) if not table.isRowHidden(r)]
    assert shown == [0, 1]
    view.settings.only_differences.setChecked(False)
    assert not any(table.isRowHidden(r) for r in range(table.rowCount()))


def test_validation_loss_is_drawn_dashed_beside_the_training_loss(view: CompareView) -> None:
    x, y = view.loss.curves["a validation"].getData()
    assert list(x) == [10, 20, 30] and list(y) == [0.9, 0.7, 0.6]
    assert view.loss.points("a") == 3 and view.loss.points("b") == 3
    assert "b validation" not in view.loss.curves  # b has no evaluations: no empty curve
    pen = view.loss.curves["a validation"].opts["pen"]
    assert pen.style().name == "DashLine" and pen.style() != view.loss.curves["a"].opts[
        "pen"].style()
    caption = view.validation_caption.text()
    assert "a: validation loss 0.6 at step 30 (best 0.6, 3 evaluations)" in caption
    assert "b: no evaluations" in caption
    view.axis.setCurrentText(X_TIME)
    x, _ = view.loss.curves["a validation"].getData()
    assert list(x) == [10.5, 20.5, 30.5]  # seconds after run_start


def test_a_growing_run_gains_its_validation_curve_and_keeps_its_table(
        view: CompareView, tmp_path: Path) -> None:
    table_row_count = view.settings.table.rowCount()
    view.settings.table.selectRow(2)
    with open(tmp_path / "b" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"type": "event", "time": START + 40, "kind": "eval", "step": 40,
                            "val_loss": 0.8}) + "\n")
    assert view.poll_once()
    x, y = view.loss.curves["b validation"].getData()
    assert list(x) == [40] and list(y) == [0.8]
    assert "b: validation loss 0.8 at step 40" in view.validation_caption.text()
    assert view.settings.table.rowCount() == table_row_count
    assert view.settings.table.currentRow() == 2  # not rebuilt: the selection stays


def test_the_charts_keep_their_share_of_a_small_view_until_the_user_drags(
        qtbot, tmp_path: Path) -> None:
    """In a 1000x700 window Compare is a tab about 650x470, first shown after its runs were
    set: its charts get CHARTS_SHARE of the splitter (sizes set in the constructor gave 55%
    here and, with stretch factors, 26%), a loss plot that says something, and keep a size
    the user dragged to."""
    runs = [_run(tmp_path, n, {"model": "mlp", "lr": lr}, evals=[(10, 0.9)])
            for n, lr in (("a", 0.001), ("b", 0.003))]
    tabs = QTabWidget()
    qtbot.addWidget(tabs)
    tabs.addTab(QLabel("the dashboard"), "Dashboard")
    view = CompareView()
    tabs.addTab(view, "Compare")
    tabs.resize(650, 470)
    tabs.show()
    qtbot.waitExposed(tabs)
    view.set_runs(runs)
    tabs.setCurrentWidget(view)
    qtbot.waitUntil(lambda: abs(view.splitter.sizes()[0] / sum(view.splitter.sizes())
                                - CHARTS_SHARE) < 0.02)
    assert view.loss.view.sceneBoundingRect().height() >= 80
    view.splitter.moveSplitter(120, 1)  # the user drags the handle up: that size stays
    dragged = view.splitter.sizes()
    tabs.resize(660, 480)
    qtbot.wait(20)
    assert view.splitter.sizes()[0] <= dragged[0] + 5
