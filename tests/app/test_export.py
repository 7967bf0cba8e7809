"""Exports of a run folder written by hand: CSV, TensorBoard event files, chart PNG/SVG."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PySide6.QtGui import QImage

from app.charts.base import Chart
from app.export import (
    ExportUnavailable,
    MetricsMissing,
    NothingToExport,
    export_chart,
    export_csv,
    export_tensorboard,
)
from app.metric_store import RANK_FIELDS
from tests.app.conftest import shown_chart
from tests.conftest import REPO

T0 = 1_796_221_900.0


def rank(r: int, step: int, **over: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "rank": r, "loss": 1.0 / step + r * 0.01, "samples_per_s": 1000.0 + 10 * r,
        "step_time_s": 0.006, "sync_time_s": 0.002, "sync_buckets": 1, "sync_bytes": 88104,
        "gpu_util_pct": None, "cpu_pct": 84.0, "device": "cpu"}
    entry.update(over)
    return entry


def metrics(step: int, *ranks: dict[str, Any]) -> dict[str, Any]:
    return {"type": "metrics", "time": T0 + step, "step": step, "epoch": step // 20,
            "total_steps": 40, "ranks": list(ranks)}


def write_run(run_dir: Path, lines: list[dict[str, Any] | str], torn: str = "") -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    text = "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines)
    (run_dir / "metrics.jsonl").write_text(text + torn, encoding="utf-8")
    return run_dir


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """2 ranks, steps 10-30, an eval at step 20, nulls, a NaN, and a torn last line."""
    nan_line = json.dumps(metrics(30, rank(0, 30), rank(1, 30))).replace(
        '"cpu_pct": 84.0', '"cpu_pct": NaN', 1)
    return write_run(tmp_path / "run", [
        {"type": "event", "time": T0, "kind": "run_start", "total_steps": 40, "world_size": 2,
         "start_step": 0},
        metrics(10, rank(0, 10), rank(1, 10)),
        metrics(20, rank(0, 20), rank(1, 20, sync_time_s=None)),
        {"type": "event", "time": T0 + 20.5, "kind": "eval", "step": 20, "epoch": 1,
         "val_loss": 0.25, "val_accuracy": 0.875},
        {"type": "event", "time": T0 + 21, "kind": "checkpoint_saved", "step": 20,
         "paths": ["x"]},
        nan_line,
    ], torn='{"type": "metrics", "time": 1796221940.0, "step": 40, "ranks": [{"ra')


# ---------------------------------------------------------------------------------- CSV
def test_csv_has_a_row_per_rank_and_per_eval(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.csv"
    assert export_csv(run, out) == 7  # 3 metrics lines x 2 ranks + 1 eval; torn line left out
    with open(out, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    others = [key for key in ("sync_buckets",) if key not in RANK_FIELDS]
    assert reader.fieldnames == ["time", "step", "epoch", "rank", *RANK_FIELDS, *others,
                                 "val_loss", "val_accuracy"]
    assert [(r["step"], r["rank"]) for r in rows] == [
        ("10", "0"), ("10", "1"), ("20", "0"), ("20", "1"), ("20", ""), ("30", "0"), ("30", "1")]
    first = rows[0]
    assert float(first["time"]) == T0 + 10 and first["epoch"] == "0"
    assert float(first["loss"]) == pytest.approx(0.1)
    assert float(first["samples_per_s"]) == 1000.0 and first["sync_buckets"] == "1"
    assert first["sync_bytes"] == "88104"
    assert first["gpu_util_pct"] == "" and first["gpu_temp_c"] == ""  # null, and absent
    assert first["val_loss"] == "" and "device" not in first
    assert rows[3]["sync_time_s"] == "" and rows[2]["sync_time_s"] == "0.002"
    evaluation = rows[4]
    assert evaluation["val_loss"] == "0.25" and evaluation["val_accuracy"] == "0.875"
    assert evaluation["loss"] == "" and evaluation["epoch"] == "1"
    assert rows[5]["cpu_pct"] == "" and rows[6]["cpu_pct"] == "84.0"  # NaN -> empty


def test_csv_has_a_column_per_logged_series_apart_from_the_built_in_fields(
        tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [
        metrics(10, rank(0, 10), rank(1, 10)),  # nothing logged yet
        metrics(20, rank(0, 20, logged={"lr": 0.1, "acc": 0.7, "loss": 9.0}),
                rank(1, 20, logged={"lr": 0.1, "acc": 0.6})),
        metrics(30, rank(0, 30, logged={"lr": 0.05, "acc": None, "bad": "x"}), rank(1, 30)),
    ])
    out = tmp_path / "run.csv"
    assert export_csv(run, out) == 6
    with open(out, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == ["time", "step", "epoch", "rank", *RANK_FIELDS, "sync_buckets",
                                 "logged/acc", "logged/loss", "logged/lr", "val_loss",
                                 "val_accuracy"]
    cells = [(r["step"], r["rank"], r["logged/acc"], r["logged/loss"], r["logged/lr"])
             for r in rows]
    assert cells == [("10", "0", "", "", ""), ("10", "1", "", "", ""),
                     ("20", "0", "0.7", "9.0", "0.1"), ("20", "1", "0.6", "", "0.1"),
                     ("30", "0", "", "", "0.05"), ("30", "1", "", "", "")]
    assert float(rows[2]["loss"]) == pytest.approx(0.05)  # a logged "loss" is its own column


def test_csv_of_a_missing_metrics_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-run"
    with pytest.raises(MetricsMissing, match=r"metrics.jsonl: .*no-run/metrics.jsonl is "
                                             r"missing: nothing to export") as info:
        export_csv(missing, tmp_path / "x.csv")
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, ValueError)
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("torn", ["", '{"type": "metrics", "step": 1'])
def test_csv_of_an_empty_metrics_file(tmp_path: Path, torn: str) -> None:
    run = write_run(tmp_path / "run", [], torn=torn)
    with pytest.raises(NothingToExport, match=r"metrics.jsonl: .* has no complete metrics"):
        export_csv(run, tmp_path / "x.csv")


# -------------------------------------------------------------------------------- charts
@pytest.fixture
def chart(qtbot) -> Chart:
    c = shown_chart(qtbot, 640, 400)
    x = np.arange(10.0)
    c.set_data("rank 0", x, 1 / (x + 1), "#1f77b4")
    c.set_data("rank 1", x, np.where(x == 4, np.nan, 1.1 / (x + 1)), "#ff7f0e")
    return c


def test_chart_png(chart: Chart, tmp_path: Path) -> None:
    path = chart.export(tmp_path / "loss.png")
    assert path == tmp_path / "loss.png"
    image = QImage(str(path))
    assert not image.isNull() and image.width() == 640 and image.height() == 400
    wide = QImage(str(export_chart(chart, tmp_path / "wide.PNG", width=1280)))
    assert (wide.width(), wide.height()) == (1280, 800)


def test_chart_svg(chart: Chart, tmp_path: Path) -> None:
    path = export_chart(chart, tmp_path / "loss.svg")
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.find(".//{http://www.w3.org/2000/svg}path") is not None


def test_chart_bad_input(chart: Chart, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"suffix must be one of \.png, \.svg, got '\.jpg'"):
        export_chart(chart, tmp_path / "loss.jpg")
    with pytest.raises(ValueError, match="got 'none'"):
        chart.export(tmp_path / "loss")
    with pytest.raises(ValueError, match="width must be >= 1 pixel, got 0"):
        chart.export(tmp_path / "loss.png", width=0)
    with pytest.raises(OSError, match="could not write"):
        chart.export(tmp_path / "no-such-folder" / "loss.png")


# --------------------------------------------------------------------------- TensorBoard
def scalars(event_file: Path) -> dict[str, list[tuple[int, float, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(event_file)).Reload()
    return {tag: [(s.step, s.value, s.wall_time) for s in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def test_tensorboard_scalars(run: Path) -> None:
    pytest.importorskip("tensorboard")
    event_file = export_tensorboard(run)
    assert event_file.parent == run / "tensorboard"
    got = scalars(event_file)
    steps = {tag: [s for s, _, _ in points] for tag, points in got.items()}
    assert steps["loss/rank0"] == [10, 20, 30] and steps["loss/rank1"] == [10, 20, 30]
    assert [v for _, v, _ in got["loss/rank0"]] == pytest.approx([0.1, 0.05, 1 / 30])
    assert [w for _, _, w in got["loss/rank0"]] == [T0 + 10, T0 + 20, T0 + 30]
    assert [v for _, v, _ in got["loss/mean"]] == pytest.approx([0.105, 0.055, 1 / 30 + 0.005])
    assert [v for _, v, _ in got["samples_per_s/total"]] == pytest.approx([2010.0] * 3)
    assert steps["sync_time_s/rank1"] == [10, 30]  # null at step 20
    assert got["val/loss"] == [(20, 0.25, T0 + 20.5)]
    assert got["val/accuracy"][0][:2] == (20, 0.875)
    assert not any(tag.startswith("gpu_util_pct/") for tag in got)  # null throughout
    assert {"step_time_s/rank0", "samples_per_s/rank1"} <= set(got)


def test_tensorboard_has_a_tag_per_logged_series_and_rank(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    run = write_run(tmp_path / "run", [
        metrics(10, rank(0, 10, logged={"lr": 0.1, "loss": 9.0}), rank(1, 10)),
        metrics(20, rank(0, 20, logged={"lr": 0.05}), rank(1, 20, logged={"val/acc": 0.5})),
    ])
    got = scalars(export_tensorboard(run))
    assert [(s, v) for s, v, _ in got["logged/lr/rank0"]] == [(10, pytest.approx(0.1)),
                                                               (20, pytest.approx(0.05))]
    assert [(s, v) for s, v, _ in got["logged/loss/rank0"]] == [(10, 9.0)]
    assert [(s, v) for s, v, _ in got["logged/val/acc/rank1"]] == [(20, 0.5)]
    assert [v for _, v, _ in got["loss/rank0"]] == pytest.approx([0.1, 0.05])  # built-in


def test_tensorboard_export_does_not_import_torch(run: Path) -> None:
    pytest.importorskip("tensorboard")
    code = ("import sys; from app.export import export_tensorboard; "
            f"export_tensorboard({str(run)!r}); sys.exit(1 if 'torch' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, "the export imported torch: " + proc.stderr[-2000:]


def test_tensorboard_export_again_replaces_the_file(run: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    out = tmp_path / "tb"
    first = export_tensorboard(run, out)
    second = export_tensorboard(run, out)
    assert list(out.iterdir()) == [second] and second != first


def test_tensorboard_resumed_run_keeps_steps_in_order(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    run = write_run(tmp_path / "run", [
        {"type": "event", "time": T0, "kind": "run_start", "start_step": 0},
        metrics(10, rank(0, 10)), metrics(20, rank(0, 20)), metrics(30, rank(0, 30)),
        {"type": "event", "time": T0 + 100, "kind": "run_start", "start_step": 20},
        metrics(30, rank(0, 30, loss=0.5)), metrics(40, rank(0, 40)),
    ])
    got = scalars(export_tensorboard(run))
    assert [(s, round(v, 4)) for s, v, _ in got["loss/rank0"]] == [
        (10, 0.1), (20, 0.05), (30, 0.5), (40, 0.025)]


def test_tensorboard_without_the_package(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ExportUnavailable, match="TensorBoard export needs the tensorboard "
                                                "package: pip install tensorboard"):
        export_tensorboard(run)
    assert not (run / "tensorboard").exists()


def test_tensorboard_of_a_missing_metrics_file(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    with pytest.raises(MetricsMissing, match="is missing: nothing to export"):
        export_tensorboard(tmp_path / "no-run")
    assert not (tmp_path / "no-run").exists()
