"""Where a step's time goes, in the sync panel's caption: how much of the all-reduce overlapped
backward's compute and how much was exposed (per rank, or the median rank's and the slowest
rank's), the achieved FLOP/s per rank and, on GPUs of a known peak, the MFU."""

from __future__ import annotations

import math
import re

import pytest

from app.charts.breakdown import flops_text, overlap_share, sync_words
from app.charts.sync_panel import SyncPanel
from app.metric_store import MetricStore
from tests.app.conftest import rank_rows


def _store(rows: list[dict], *events: dict) -> MetricStore:
    store = MetricStore()
    for e in events:
        store.add({"type": "event", "time": 0.5, **e})
    store.add({"type": "metrics", "time": 1.0, "step": 10, "epoch": 0, "ranks": rows})
    return store


def _flops(count: float, precision: str = "bf16", gpus: list | None = None) -> dict:
    return {"kind": "flops", "flops_per_step": count, "batch_size": 32, "grad_accum": 1,
            "precision": precision, "gpus": gpus if gpus is not None else ["NVIDIA H200"] * 2}


@pytest.mark.parametrize(("sync", "exposed", "share"), [
    (0.004, 0.001, 0.75), (0.004, 0.004, 0.0), (0.004, 0.0, 1.0),
    (0.004, 0.005, 0.0),  # more exposed than in flight (rounding): none overlapped
    (0.004, None, None), (None, 0.001, None), (math.nan, 0.001, None),
    (0.004, math.inf, None), (0.0, 0.0, None),  # no all-reduce measured: no share of it
])
def test_overlap_is_the_share_of_sync_time_not_exposed(sync, exposed, share) -> None:
    got = overlap_share(sync, exposed)
    assert got == (pytest.approx(share) if share is not None else None)


def test_the_sync_part_says_exposed_whole_and_overlapped() -> None:
    assert sync_words(0.001, 0.004, 0.75) == "exposed sync 1.0 of 4.0, 75% overlapped"
    assert sync_words(0.001, math.nan, None) == "exposed sync 1.0"
    assert sync_words(None, 0.004, None) is None


def test_each_ranks_breakdown_says_its_overlap_and_exposed_sync(qtbot) -> None:
    rows = rank_rows(4, 10)
    rows[0].update(sync_time_s=0.004, sync_exposed_s=0.001)
    rows[1].update(sync_time_s=0.004, sync_exposed_s=None)  # CUDA events not read yet
    rows[2].update(sync_time_s=math.nan, sync_exposed_s=0.002)
    rows[3].update(sync_time_s=0.004, sync_exposed_s=0.004)  # gloo on CPU: all exposed
    panel = SyncPanel()
    qtbot.addWidget(panel)
    panel.redraw_caption(_store(rows))
    lines = panel.caption.full_text().splitlines()
    assert len(lines) == 4
    # The parts add up to the step (the rest is "other"); the exposed sync is inside bwd and
    # is said in brackets after it, not counted beside it.
    assert lines[0] == ("rank 0 step 10.0 ms = data 0.4 + fwd 2.0 + bwd 5.0 (exposed sync 1.0 of "
                        "4.0, 75% overlapped) + opt 1.0 + other 1.6")
    for line in lines:
        total, parts = line.split(" ms = ")
        summed = sum(float(re.sub(r" \(.*\)", "", part).split()[-1])
                     for part in parts.split(" + "))
        assert summed == pytest.approx(float(total.split()[-1]), abs=0.15), line
    assert "sync" not in lines[1] and lines[1].endswith("bwd 5.0 + opt 1.0 + other 2.6")
    assert "+ bwd 5.0 (exposed sync 2.0) + opt" in lines[2]
    assert "+ bwd 5.0 (exposed sync 4.0 of 4.0, 0% overlapped) + opt" in lines[3]


def test_many_ranks_the_median_ranks_overlap_and_the_slowest_ranks(qtbot) -> None:
    rows = rank_rows(64, 10)
    for r, row in enumerate(rows):  # rank r: r/64 of a 4 ms all-reduce exposed
        row.update(sync_time_s=0.004, sync_exposed_s=0.004 * r / 64)
    panel = SyncPanel()
    qtbot.addWidget(panel)
    panel.redraw_caption(_store(rows))
    median, slowest = panel.caption.full_text().splitlines()
    # The median of the ranks' shares (1 - r/64 for r = 0..63) is 1 - 31.5/64 = 50.8%.
    assert "of 4.0, 51% overlapped)" in median and median.startswith("median step")
    assert slowest.startswith("slowest, rank 63 step 73.0 ms")
    assert "exposed sync 3.9 of 4.0, 2% overlapped" in slowest


def test_mfu_on_h200s_in_bf16_against_their_dense_peak(qtbot) -> None:
    """4 TFLOP a step: rank 0's 10 ms step is 400 TFLOP/s (40.4% of 989.4), rank 1's 11 ms
    step 364 TFLOP/s (36.8%); the median rank's is their mean (2 ranks)."""
    store = _store(rank_rows(2, 10), _flops(4e12))
    assert flops_text(store, _flops(4e12)) == (
        "model FLOPs 4 TFLOP a step: 382 TFLOP/s per rank (median; slowest, rank 1: 364 "
        "TFLOP/s), MFU 39% (median; slowest 37%) of 989 TFLOP/s (H200 SXM, bf16 dense)")
    one = _store(rank_rows(1, 10), _flops(4e12))
    assert flops_text(one, _flops(4e12)) == (
        "model FLOPs 4 TFLOP a step: rank 0 400 TFLOP/s, MFU 40% of 989 TFLOP/s (H200 SXM, "
        "bf16 dense)")
    panel = SyncPanel()
    qtbot.addWidget(panel)
    rows = rank_rows(2, 10)
    for row in rows:  # 4 MB in 3 ms a step: the bandwidth line comes last
        row["sync_bytes"] = 4_000_000
    panel.redraw_caption(_store(rows, {"kind": "run_start", "world_size": 2}, _flops(4e12)))
    lines = panel.caption.full_text().splitlines()
    assert [line.split(" ")[0] for line in lines] == ["rank", "rank", "model", "sync"]
    assert "MFU 39% (median; slowest 37%)" in lines[2]


@pytest.mark.parametrize(("event", "says"), [
    (_flops(4e12, gpus=["NVIDIA Imaginary X1"] * 2), "; peak unknown for NVIDIA Imaginary X1"),
    (_flops(4e12, gpus=["Tesla V100-SXM2-16GB"] * 2),
     "; peak unknown for Tesla V100-SXM2-16GB in bf16"),
    (_flops(4e12, gpus=[None, None]), "; peak unknown for GPU 7 (no GPU name)"),
    (_flops(4e12, precision="int4"), "; peak unknown for precision 'int4'"),
])
def test_no_mfu_where_the_peak_is_unknown_and_the_caption_says_why(event, says) -> None:
    text = flops_text(_store(rank_rows(2, 10), event), event)
    assert text is not None and text.endswith(says) and "MFU" not in text
    assert "382 TFLOP/s per rank" in text  # the achieved rate is still said


def test_on_cpu_the_achieved_rate_without_a_peak() -> None:
    rows = [{"rank": r, "step_time_s": 0.002 * (r + 1), "device": "cpu"} for r in range(2)]
    event = _flops(3_915_776, precision="fp32", gpus=[None, None])
    assert flops_text(_store(rows, event), event) == (
        "model FLOPs 3.92 MFLOP a step: 1.47 GFLOP/s per rank (median; slowest, rank 1: 979 "
        "MFLOP/s); CPU: no peak")


@pytest.mark.parametrize("count", [None, 0, -5, math.nan, "many", True])
def test_no_flops_line_without_a_usable_count(qtbot, count) -> None:
    """A script run has no flops event; a bad one is ignored; no step time, no rate."""
    panel = SyncPanel()
    qtbot.addWidget(panel)
    event = {**_flops(4e12), "flops_per_step": count}
    store = _store(rank_rows(2, 10), event)
    panel.redraw_caption(store)
    assert "FLOP" not in panel.caption.full_text()
    rows = rank_rows(2, 10)
    for row in rows:
        row["step_time_s"] = None
    assert flops_text(_store(rows), _flops(4e12)) is None


def test_the_latest_flops_event_counts_and_a_cleared_store_forgets_it(qtbot) -> None:
    """A resumed run appends a second flops event; a new run (store cleared) has none until
    its own comes."""
    panel = SyncPanel()
    qtbot.addWidget(panel)
    store = _store(rank_rows(2, 10), _flops(4e12))
    panel.redraw_caption(store)
    assert "model FLOPs 4 TFLOP a step" in panel.caption.full_text()
    store.add({"type": "event", "time": 2.0, **_flops(2e12)})
    panel.redraw_caption(store)
    assert "model FLOPs 2 TFLOP a step" in panel.caption.full_text()
    store.clear()
    store.add({"type": "metrics", "time": 3.0, "step": 1, "ranks": rank_rows(2, 1)})
    panel.redraw_caption(store)
    assert "FLOP" not in panel.caption.full_text()


@pytest.mark.parametrize(("timing", "says"), [
    ("reducer", "sync: DDP's own timers (CPU ranks: the interval's mean; GPUs: the latest "
                "sampled iteration, 1 in 10)"),
    ("hook", "sync: Rankscope's comm hook, every step (--sync-timing hook)"),
    (None, None),  # telemetry off, or a run from before issue 29: nothing claimed
])
def test_the_caption_says_where_the_sync_times_come_from(qtbot, timing, says) -> None:
    rows = rank_rows(2, 10)
    start = {"kind": "run_start", "total_steps": 100, "world_size": 2, "sync_timing": timing}
    panel = SyncPanel()
    qtbot.addWidget(panel)
    panel.redraw_caption(_store(rows, start))
    lines = panel.caption.full_text().splitlines()
    if says is None:
        assert not any(line.startswith("sync:") for line in lines)
    else:
        assert lines[-1] == says
