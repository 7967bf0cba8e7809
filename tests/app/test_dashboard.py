"""The dashboard's frames: within a budget the stalest charts draw first; all catch up; the
labels take new text a few times a second."""

from __future__ import annotations

import json
from pathlib import Path

from app.charts.base import Chart
from app.dashboard import Dashboard
from app.metric_store import MetricStore
from tests.app.conftest import gpu_index, rank_rows


def _report(store: MetricStore, step: int, ranks: int = 4, total_steps: int | None = 1000,
            logged: dict[int, dict[str, float]] | None = None) -> dict:
    """Add a metrics message of ``ranks`` ranks at ``step`` (``logged``: rank -> what it
    logged) to the store; returns it."""
    rows = rank_rows(ranks, step)
    for rank, scalars in (logged or {}).items():
        rows[rank]["logged"] = scalars
    message = {"type": "metrics", "time": float(step), "step": step, "epoch": 0,
               "total_steps": total_steps, "ranks": rows}
    store.add(message)
    return message


def _dashboard(qtbot) -> Dashboard:
    dash = Dashboard(MetricStore())
    dash.timer.stop()  # frames are drawn here, one at a time
    dash.show_welcome(False)  # a run is shown (the window does this)
    qtbot.addWidget(dash)
    dash.resize(1000, 700)
    dash.show()
    qtbot.waitExposed(dash)
    return dash


def test_a_frame_draws_what_fits_its_budget_stalest_first_and_all_catch_up(qtbot) -> None:
    dash = _dashboard(qtbot)
    store = dash.store
    for step in range(1, 6):
        _report(store, step)
    dash.redraw(budget_s=None)  # everything, at once: each chart measures its cost
    assert dash.drawn_version == store.version
    assert all(cost > 0 for cost in dash.cost_s.values())
    assert dash.loss.chart.points("rank 3") == 5

    _report(store, 6)
    order: list[Chart] = []
    for _frame in range(len(dash.charts)):
        assert dash.has_work()
        before = set(dash.behind())
        dash.redraw(budget_s=1e-9)  # a budget nothing fits in: one chart per frame
        after = set(dash.behind())
        assert len(before - after) == 1, "exactly one chart drew"
        order.extend(before - after)
        if after:
            assert dash.drawn_version < store.version
    assert dash.drawn_version == store.version and not dash.has_work()
    assert order == list(dash.charts)  # ties in staleness: in the dashboard's order
    assert dash.loss.chart.points("rank 3") == 6

    # New data while three charts still show step 6: those draw first when step 8 comes.
    _report(store, 7)
    for _frame in range(3):
        dash.redraw(budget_s=1e-9)
    assert dash.behind() == list(dash.charts[3:])
    _report(store, 8)
    dash.redraw(budget_s=1e-9)
    assert dash.behind() == [*dash.charts[:3], *dash.charts[4:]]  # the stalest drew
    dash.redraw(budget_s=None)
    assert dash.drawn_version == store.version
    assert dash.sync.share.points("rank 0") == 8


def test_the_timer_keeps_drawing_until_every_chart_is_current(qtbot) -> None:
    dash = _dashboard(qtbot)
    store = dash.store
    for step in range(1, 200):
        _report(store, step, ranks=8)
    dash.timer.start()
    qtbot.waitUntil(lambda: dash.drawn_version == store.version, timeout=10_000)
    assert not dash.has_work()
    assert dash.throughput.chart.points("rank 7") == 199


def test_the_labels_take_new_text_every_labels_s_and_catch_up(qtbot) -> None:
    dash = _dashboard(qtbot)
    store = dash.store
    _report(store, 1)
    dash.redraw()  # the first frame with data: the labels too
    assert dash.labels_version == store.version
    assert dash.progress_label.text().startswith("step 1/")
    assert dash.sync.caption.full_text().startswith("rank 0 step 10.0 ms")

    dash.labels_s = 3600.0  # within the hour, frames draw the charts but not the labels
    _report(store, 2)
    dash.redraw(budget_s=1.0)
    assert dash.drawn_version == store.version and dash.labels_version < store.version
    assert dash.progress_label.text().startswith("step 1/")
    dash.redraw(budget_s=None)  # everything at once: the labels too
    assert dash.labels_version == store.version
    assert dash.progress_label.text().startswith("step 2/")

    dash.labels_s = 0.05  # on the timer, the labels catch up with the last report
    for step in range(3, 30):
        _report(store, step)
    dash.timer.start()
    qtbot.waitUntil(lambda: dash.labels_version == store.version, timeout=10_000)
    assert dash.progress_label.text().startswith("step 29/")


def test_evaluation_time_is_said_in_the_progress_line_and_the_step_breakdown(qtbot) -> None:
    dash = _dashboard(qtbot)
    store = dash.store
    _report(store, 1, ranks=1)
    dash.redraw(budget_s=None)
    assert "last eval" not in dash.progress_label.text()
    assert " eval " not in dash.sync.caption.full_text()  # no evaluation in the interval: not named
    store.add({"type": "event", "kind": "eval", "time": 2.0, "step": 2, "val_loss": 0.5,
               "eval_s": 1.25})
    rows = rank_rows(1, 3)
    rows[0]["eval_s"] = 0.004  # the evaluation's time per step of the interval it fell in
    store.add({"type": "metrics", "time": 3.0, "step": 3, "ranks": rows})
    dash.redraw(budget_s=None)
    assert dash.progress_label.text().endswith("last eval (step 2) took 1.2 s")
    store.add({"type": "event", "kind": "eval", "time": 4.0, "step": 4, "val_loss": 0.4,
               "eval_s": 0.031})
    dash.redraw(budget_s=None)
    assert dash.progress_label.text().endswith("last eval (step 4) took 31 ms")
    assert "(exposed sync 1.0 of 3.0, 67% overlapped) + opt 1.0 + eval 4.0" in \
        dash.sync.caption.full_text()


def test_a_small_window_stacks_the_panels_and_scrolls_instead_of_squeezing_them(qtbot) -> None:
    """Issue 18 item 10: at 1000x700 the charts were 80 px tall. Now a panel keeps its
    minimum height; a narrow dashboard stands the panels in one column, a wide one in two."""
    from app.dashboard import PANEL_MIN_HEIGHT, TWO_COLUMNS_MIN_WIDTH

    dash = _dashboard(qtbot)
    dash.resize(TWO_COLUMNS_MIN_WIDTH - 200, 450)  # the dashboard beside the docks at 1000x700
    qtbot.waitUntil(lambda: dash.columns == 1, timeout=2000)
    qtbot.waitUntil(lambda: all(p.height() >= PANEL_MIN_HEIGHT for p in dash.panels),
                    timeout=2000)
    assert dash.scroll.verticalScrollBar().maximum() > 0  # the rest is a scroll away
    assert dash.grid.getItemPosition(dash.grid.indexOf(dash.devices))[:2] == (3, 0)
    dash.resize(TWO_COLUMNS_MIN_WIDTH + 300, 900)
    qtbot.waitUntil(lambda: dash.columns == 2, timeout=2000)
    assert dash.grid.getItemPosition(dash.grid.indexOf(dash.devices))[:2] == (1, 1)


def test_every_step_chart_follows_the_loss_charts_x_axis(qtbot) -> None:
    dash = _dashboard(qtbot)
    for step in range(1, 40):
        _report(dash.store, step * 10)
    dash.redraw(budget_s=None)
    dash.loss.chart.view.setXRange(100.0, 200.0, padding=0)  # a zoom on the loss chart
    for chart in dash.charts[1:]:
        assert chart.x_master is dash.loss.chart
        assert chart.view.viewRange()[0] == [100.0, 200.0], chart


def _logged_run(store: MetricStore) -> list[dict]:
    """Five reports of 2 ranks, added to the store and returned: steps 10 and 20 log nothing;
    30 and 40 "acc" and "lr" on both ranks; 50 "val/acc" on rank 0 alone."""
    messages = [_report(store, step, ranks=2) for step in (10, 20)]
    for step in (30, 40):
        messages.append(_report(store, step, ranks=2, logged={
            0: {"acc": 0.5 + step / 100, "lr": 0.1}, 1: {"acc": 0.4 + step / 100, "lr": 0.1}}))
    messages.append(_report(store, 50, ranks=2, logged={0: {"val/acc": 0.9}}))
    return messages


def _curve(chart: Chart, name: str) -> tuple[list[float], list[float]]:
    x, y = chart.curves[name].getData()
    return [float(v) for v in x], [round(float(v), 6) for v in y]


def _title(chart: Chart) -> str:
    return chart.getPlotItem().titleLabel.text


def test_a_chart_per_logged_key_with_a_curve_per_rank_added_as_keys_come(qtbot) -> None:
    dash = _dashboard(qtbot)
    store = dash.store
    for step in (10, 20):
        _report(store, step, ranks=2)
    dash.redraw(budget_s=None)
    # a run that logs nothing looks as it did: four panels, six charts, no note
    assert (len(dash.panels), len(dash.charts), dash.logged) == (4, 6, {})
    assert dash.unavailable.isHidden() and dash.grid.count() == 4
    assert dash.grid.getItemPosition(dash.grid.indexOf(dash.devices)) == (1, 1, 1, 1)

    dash.reset()
    _logged_run(store)
    dash.redraw(budget_s=None)
    assert list(dash.logged) == ["acc", "lr", "val/acc"]
    assert [_title(p.chart).split(":")[0] for p in dash.logged.values()] == ["acc", "lr", "val/acc"]
    assert len(dash.charts) == 9 and dash.drawn_version == store.version
    acc = dash.logged["acc"].chart
    assert _curve(acc, "rank 0") == ([30.0, 40.0], [0.8, 0.9])
    assert _curve(acc, "rank 1") == ([30.0, 40.0], [0.7, 0.8])
    assert _curve(dash.logged["lr"].chart, "rank 1") == ([30.0, 40.0], [0.1, 0.1])
    assert list(dash.logged["val/acc"].chart.curves) == ["rank 0"]  # rank 1 never logged it
    # in the same grid, after the built-in panels (two columns at this width)
    assert dash.columns == 2
    # (row, column, rows, columns): the last, alone in its row, takes the row's width
    assert [dash.grid.getItemPosition(dash.grid.indexOf(p))
            for p in dash.logged.values()] == [(2, 0, 1, 1), (2, 1, 1, 1), (3, 0, 1, 2)]
    # on the step charts' x axis
    dash.loss.chart.view.setXRange(30.0, 40.0, padding=0)
    assert all(p.chart.view.viewRange()[0] == [30.0, 40.0] for p in dash.logged.values())

    _report(store, 60, ranks=2, logged={0: {"acc": 1.0}, 1: {"acc": 0.9, "grad/norm": 2.0}})
    dash.redraw(budget_s=None)
    assert list(dash.logged) == ["acc", "lr", "val/acc", "grad/norm"]
    assert dash.grid.getItemPosition(dash.grid.indexOf(dash.logged["val/acc"])) == (3, 0, 1, 1)
    assert _curve(acc, "rank 1")[1] == [0.7, 0.8, 0.9]
    assert _curve(dash.logged["grad/norm"].chart, "rank 1") == ([60.0], [2.0])

    dash.reset()  # the next run starts without the last one's keys
    assert (len(dash.panels), len(dash.charts), dash.logged) == (4, 6, {})
    assert dash.grid.count() == 4 and dash.loss.chart.view.viewRange()
    _report(store, 10, ranks=2, logged={0: {"lr": 0.3}})
    dash.redraw(budget_s=None)
    assert list(dash.logged) == ["lr"] and dash.grid.count() == 5
    assert _curve(dash.logged["lr"].chart, "rank 0") == ([10.0], [0.3])


def test_a_replayed_run_shows_the_same_logged_charts(qtbot, tmp_path) -> None:
    live = _dashboard(qtbot)
    messages = _logged_run(live.store)
    live.redraw(budget_s=None)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in messages))
    replay = _dashboard(qtbot)
    replay.store.load_run(tmp_path)
    replay.redraw(budget_s=None)
    assert list(replay.logged) == list(live.logged) == ["acc", "lr", "val/acc"]
    for key, panel in live.logged.items():
        assert list(panel.chart.curves) == list(replay.logged[key].chart.curves)
        for name in panel.chart.curves:
            assert _curve(panel.chart, name) == _curve(replay.logged[key].chart, name)


def test_what_a_script_run_cannot_show_is_said_above_the_charts_and_over_each_empty_one(
        qtbot) -> None:
    dash = _dashboard(qtbot)
    store = dash.store
    store.add({"type": "event", "kind": "run_start", "time": 0.0, "total_steps": None,
               "steps_per_epoch": None, "world_size": 2, "start_step": 0,
               "source": "script", "script": "/home/u/train.py"})
    hook = ("the script registered DDP's built-in comm hook FP16_COMPRESS, which cannot be "
            "timed from Python")
    store.add({"type": "event", "kind": "unavailable", "step": 10,
               "items": {"sync": hook, "loss": "no one-element tensor was passed to backward()"}})
    for step in (10, 120):
        rows = rank_rows(2, step)
        for row in rows:
            row["sync_time_s"] = row["sync_exposed_s"] = row["loss"] = None
        store.add({"type": "metrics", "time": float(step), "step": step, "epoch": 0,
                   "total_steps": None, "ranks": rows})
    dash.redraw(budget_s=None)
    assert not dash.unavailable.isHidden()
    assert dash.unavailable.text() == (
        f"Not measured for train.py: gradient sync timing ({hook}); the loss (no one-element "
        "tensor was passed to backward())")
    assert dash.sync.sync.note() == dash.sync.share.note() == (
        f"Not measured for this script: {hook}")
    assert dash.loss.chart.note() == ("Not measured for this script: no one-element tensor "
                                      "was passed to backward()")
    assert dash.throughput.chart.note() == dash.devices.util.note() == ""
    note = dash.sync.sync._note
    assert note is not None and note.isVisible()
    view = dash.sync.sync.view.rect()  # the note lies inside the plot, across its width
    assert 0 <= note.y() and note.y() + note.boundingRect().height() <= view.height() + 1
    assert note.boundingRect().width() <= view.width()
    # the length is unknown: the step alone, no ETA, an empty bar that says why
    assert dash.progress_label.text() == "step 120  (length unknown: no ETA)"
    assert (dash.progress.value(), dash.progress.text()) == (0, "length unknown")

    store.add({"type": "event", "kind": "unavailable", "step": 130, "items": {}})
    dash.redraw(budget_s=None)
    assert dash.unavailable.isHidden() and dash.unavailable.text() == ""
    assert dash.sync.sync.note() == dash.loss.chart.note() == ""
    store.add({"type": "event", "kind": "unavailable", "step": 140, "items": {"loss": "gone"}})
    dash.reset()
    dash.redraw(budget_s=None)
    assert dash.unavailable.isHidden() and dash.loss.chart.note() == ""
    assert dash.progress_label.text() == "no report yet"


def test_gpus_are_named_as_nvidia_smi_names_them(qtbot) -> None:
    """A rank's GPU by its NVML index (the telemetry's ``device``), not its CUDA number."""
    dash = _dashboard(qtbot)
    _report(dash.store, 1, ranks=2)
    dash.redraw(budget_s=None)
    names = set(dash.devices.util.curves)
    assert names == {f"GPU {gpu_index(r)} (rank {r})" for r in range(2)} == {
        "GPU 7 (rank 0)", "GPU 6 (rank 1)"}
    assert dash.devices._device_caption(dash.store).startswith("GPU 7 (rank 0): ")


def test_the_sync_bandwidth_is_shown_against_what_doctor_measured(qtbot, tmp_path) -> None:
    from ddp_engine.common.doctor_result import DoctorResult, SizeResult, write_doctor

    dash = _dashboard(qtbot)
    run_dir = tmp_path / "runs" / "mlp-synthetic-1"
    run_dir.mkdir(parents=True)
    dash.run_dir = run_dir
    rows = rank_rows(2, 5)
    for row in rows:  # 4 MB in 3 ms a step: 1.33 GB/s, and 2(n-1)/n = 1 for two ranks
        row["sync_bytes"], row["sync_time_s"] = 4_000_000, 0.003
    dash.store.add({"type": "metrics", "time": 5.0, "step": 5, "epoch": 0, "total_steps": 100,
                    "ranks": rows})
    dash.redraw(budget_s=None)
    assert dash.sync.caption.full_text().endswith(
        "sync bus bandwidth 1.33 GB/s (this machine's is not measured: Check devices...)")
    write_doctor(tmp_path / "runs", DoctorResult(
        time=1.0, device="cpu", backend="gloo", world_size=2, gpus=[],
        sizes=[SizeResult(2**20, 10, 0.001, 1.05, 1.05), SizeResult(2**24, 5, 0.0063, 2.67, 2.67)]))
    dash.run_dir = run_dir  # a run opened: its runs folder's measurement is read
    dash.redraw(budget_s=None)
    assert dash.sync.caption.full_text().endswith(
        "sync bus bandwidth 1.33 GB/s = 50% of the 2.67 GB/s doctor measured (gloo, 2 processes)")


def test_a_profile_gives_a_script_without_ddp_its_communication_marked_as_sampled(
        qtbot) -> None:
    """FSDP2 and other scripts without DDP have no live sync timing: the latest profile's
    communication is written over the empty sync charts, as a sample of its steps."""
    from ddp_engine.common.profile_summary import summarize

    dash = _dashboard(qtbot)
    dash.store.add({"type": "event", "kind": "run_start", "time": 0.0, "total_steps": None,
                    "steps_per_epoch": None, "world_size": 2, "start_step": 0,
                    "source": "script", "script": "/home/u/fsdp.py"})
    why = "the script built no DistributedDataParallel"
    dash.store.add({"type": "event", "kind": "unavailable", "step": 10, "items": {"sync": why}})
    dash.redraw(budget_s=None)
    assert dash.sync.sync.note() == f"Not measured for this script: {why}"
    summary = summarize(Path(__file__).parents[1] / "fixtures" / "profiles" / "ddp-2rank")
    dash.profile.show_summary(summary)
    sampled = dash.sync.sync.note().splitlines()[1]
    assert sampled.startswith("Sampled by the profile of 5 steps: communication ")
    comm = sum(r["comm_ms"] for r in summary["per_rank"]) / 2
    assert f"communication {comm:.2f} ms of {summary['step_time_ms']:.2f} ms a step" in sampled
    assert dash.sync.share.note() == dash.sync.sync.note()
    assert dash.throughput.chart.note() == ""  # only sync is replaced by a sample
