"""The reading of a profile (issue 31): tests/fixtures/profiles/ddp-2rank holds the real traces
of a 2-rank gloo DDP run (torch 2.13, record_shapes on) whose rank 1 sleeps 20 ms in every
forward; the interval arithmetic and the names on hand-made cases."""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
from pathlib import Path

import pytest

from ddp_engine.common.doctor_result import DoctorResult, SizeResult, write_doctor
from ddp_engine.common.profile_client import read_summary
from ddp_engine.common.profile_files import SUMMARY_FILE, profile_folder_name
from ddp_engine.common.profile_summary import PARTS, summarize, write_summary
from ddp_engine.common.profile_text import summary_text
from ddp_engine.common.profile_trace import (
    collective_kind,
    intersect,
    read_rank,
    short_name,
    subtract,
    union,
)

DDP_2RANK = Path(__file__).parents[2] / "fixtures" / "profiles" / "ddp-2rank"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A run's profile folder holding the fixture's traces, under RUNS/run/profiles/."""
    dest = tmp_path / "runs" / "run" / "profiles" / profile_folder_name(1.8e9, 120)
    shutil.copytree(DDP_2RANK, dest)
    return dest


def test_intervals() -> None:
    assert union([(5, 6), (1, 3), (2, 4), (7, 7)]) == [(1, 4), (5, 6)]
    assert intersect([(0, 10)], [(2, 3), (8, 12)]) == [(2, 3), (8, 10)]
    assert subtract([(0, 10), (20, 30)], [(2, 3), (8, 22)]) == [(0, 2), (3, 8), (22, 30)]
    assert subtract([(0, 1)], []) == [(0, 1)]


@pytest.mark.parametrize(("name", "kind"), [
    ("c10d::allreduce_", "all_reduce"), ("c10d::_allgather_base_", "all_gather"),
    ("c10d::_reduce_scatter_base_", "reduce_scatter"), ("c10d::broadcast_", "broadcast"),
    ("c10d::barrier", "barrier"), ("c10d::alltoall_base_", "all_to_all"),
    ("gloo:all_reduce", "all_reduce"), ("nccl:all_gather", "all_gather"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_reduce"),
    ("ncclKernel_ReduceScatter_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
     "reduce_scatter"), ("ncclDevKernel_SendRecv(x)", "send_recv"),
    ("aten::mm", None), ("c10d::reducer_thing", None), ("Optimizer.step#SGD.step", None)])
def test_collective_kinds(name: str, kind: str | None) -> None:
    assert collective_kind(name) == kind


def test_kernel_names_are_shortened() -> None:
    assert short_name("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long)") \
        == "ncclKernel_AllReduce_RING_LL_Sum_float"
    assert short_name("void k<float, (T)2>(p<float>, float*)") == "k<float, (T)2>"


def test_the_ranks_parts_add_up_to_their_steps(folder: Path) -> None:
    s = summarize(folder)
    assert s["ranks"] == [0, 1] and s["world_size"] == 2 and s["timeline"] == "cpu"
    assert s["steps"] == 5 and s["backend"] == "gloo"
    for r in s["per_rank"]:
        assert set(r["parts_ms"]) == set(PARTS)
        assert sum(r["parts_ms"].values()) == pytest.approx(r["step_time_ms"], rel=0.01)
        assert 0 <= r["comm_overlapped_share"] <= 1
        assert r["top_ops"] and r["top_ops"][0]["self_ms"] >= r["top_ops"][-1]["self_ms"]
    # rank 1 sleeps 20 ms a step outside any operator; rank 0 spends it in the all-reduce
    by = {r["rank"]: r["parts_ms"] for r in s["per_rank"]}
    assert by[1]["idle"] > 15 and by[0]["idle"] < 5, by
    assert by[0]["comm_exposed"] > 15 > by[1]["comm_exposed"], by
    # One meaning of "compute" for overlap: the collectives' exposed time per rank and step
    # is the ranks' exposed communication (the gradient all-reduce is the only collective).
    exposed = statistics.fmean(r["comm_ms"] * (1 - r["comm_overlapped_share"])
                               for r in s["per_rank"])
    assert sum(c["exposed_ms"] for c in s["collectives"]) == pytest.approx(exposed, rel=0.01)


def test_the_rank_that_sleeps_in_forward_is_last_at_every_gradient_all_reduce(
        folder: Path) -> None:
    s = summarize(folder)
    [grads] = s["collectives"]
    assert grads["kind"] == "all_reduce" and grads["group"] == ""  # gloo names no group
    assert grads["calls_per_step"] == 2 and grads["matched"]
    assert grads["last_rank_counts"] == {"1": 10}
    assert 15 < grads["skew_ms_mean"] < 40  # the 20 ms sleep, give or take the machine
    assert grads["bytes"] == 1575936  # record_shapes: the two buckets' median, 4-byte floats
    last = s["last_to_arrive"]
    assert (last["rank"], last["calls"], last["of"], last["kind"]) == (1, 10, 10, "all_reduce")
    assert last["preceding_op"]


def test_bandwidth_is_compared_with_doctors_measurement(folder: Path) -> None:
    runs = folder.parents[2]
    sizes = [SizeResult(2**20 * k, 10, 0.001 * k, k / 1.0, 1.0 * k) for k in (1, 4)]
    write_doctor(runs, DoctorResult(0.0, "cpu", "gloo", 2, [], sizes))
    [bw] = summarize(folder)["bandwidth"]
    assert bw["kind"] == "all_reduce" and bw["busbw_gbs"] > 0
    assert bw["doctor_bytes"] == 2**20  # the measured size nearest the 1.5 MiB buckets
    assert bw["of_doctor"] == pytest.approx(bw["busbw_gbs"] / 1.0, rel=0.01)


def test_write_and_read_summary_and_its_text(folder: Path) -> None:
    assert not (folder / SUMMARY_FILE).exists()
    made = read_summary(folder)  # missing: made from the traces, and kept
    assert json.loads((folder / SUMMARY_FILE).read_text()) == made == write_summary(folder)
    text = summary_text(made)
    assert "Last to arrive: rank 1" in text and "waiting" in text and str(folder) in text
    assert "ui.perfetto.dev" in text


def test_a_missing_rank_is_named_and_the_others_summarized(folder: Path) -> None:
    (folder / "rank-1.json.gz").unlink()
    (folder / "rank-1.error.txt").write_text("a profiler was already running\n")
    s = summarize(folder)
    assert s["ranks"] == [0] and s["missing"] == {"1": "a profiler was already running"}
    assert s["last_to_arrive"] is None  # one rank: nobody to arrive after
    assert "rank 1: no trace (a profiler was already running)" in summary_text(s)


def test_bad_folders_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no rank's trace in .*; rank 0: disk full"):
        (tmp_path / "rank-0.error.txt").write_text("disk full")
        summarize(tmp_path)
    with gzip.open(tmp_path / "rank-0.json.gz", "wt") as f:
        json.dump({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2}]}, f)
    with pytest.raises(ValueError, match=r"rank-0.json.gz has no ProfilerStep spans"):
        read_rank(tmp_path / "rank-0.json.gz", 0)
    (tmp_path / "rank-0.json.gz").write_bytes(gzip.compress(b"[1, 2]"))
    with pytest.raises(ValueError, match=r"is not a Chrome trace"):
        summarize(tmp_path)
