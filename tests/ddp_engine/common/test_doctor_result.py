"""doctor.json (ddp_engine/common/doctor_result.py): the bus-bandwidth formula, the round trip,
and a reader that gives None, never an exception, for anything it cannot use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_engine.common.doctor_result import (
    DOCTOR_FILE,
    DoctorResult,
    GpuRef,
    SizeResult,
    bandwidths_gbs,
    busbw_factor,
    load_doctor,
    write_doctor,
)


def result() -> DoctorResult:
    sizes = [SizeResult(2**20, 40, 1e-3, *bandwidths_gbs(2**20, 1e-3, 4)),
             SizeResult(2**24, 10, 4e-3, *bandwidths_gbs(2**24, 4e-3, 4))]
    return DoctorResult(time=1_790_000_000.5, device="cuda", backend="nccl", world_size=4,
                        gpus=[GpuRef(2, "GPU-2c2c", "NVIDIA GeForce RTX 4090"),
                              GpuRef(0, "GPU-0a0a", "NVIDIA RTX 6000 Ada Generation")],
                        sizes=sizes, link_allows_gbs=31.5,
                        versions={"torch": "2.13.0", "nccl": "2.21.5", "driver": None})


def test_bus_bandwidth_is_nccl_tests_all_reduce_formula() -> None:
    assert [busbw_factor(n) for n in (1, 2, 4, 8)] == [0.0, 1.0, 1.5, 1.75]
    algbw, busbw = bandwidths_gbs(2 * 10**9, 0.5, 4)  # 2 GB in 0.5 s
    assert (algbw, busbw) == (4.0, 6.0)


def test_a_result_is_kept_in_the_runs_folder_and_read_back(tmp_path: Path) -> None:
    runs = tmp_path / "runs" / "not-yet"
    path = write_doctor(runs, result())
    assert path == runs / DOCTOR_FILE
    data = json.loads(path.read_text())
    assert data["schema"] == 1 and data["world_size"] == 4
    assert data["gpus"][0] == {"index": 2, "uuid": "GPU-2c2c", "name": "NVIDIA GeForce RTX 4090"}
    assert data["best_busbw_gbs"] == pytest.approx(2**24 / 4e-3 / 1e9 * 1.5)
    loaded = load_doctor(runs)
    assert loaded == result()
    assert loaded is not None and loaded.best_busbw_gbs == data["best_busbw_gbs"]
    assert [p.name for p in runs.iterdir()] == [DOCTOR_FILE]  # replaced whole: no temp file


def test_there_is_nothing_to_read_where_nothing_usable_was_kept(tmp_path: Path) -> None:
    assert load_doctor(tmp_path / "missing") is None
    (tmp_path / DOCTOR_FILE).write_text("{not json")
    assert load_doctor(tmp_path) is None
    for change in ({"schema": 2}, {"backend": "mpi"}, {"world_size": 0},
                   {"sizes": [{"size_bytes": 1}]}):
        write_doctor(tmp_path, result())
        data = json.loads((tmp_path / DOCTOR_FILE).read_text())
        (tmp_path / DOCTOR_FILE).write_text(json.dumps({**data, **change}))
        assert load_doctor(tmp_path) is None, change


@pytest.mark.parametrize(("change", "message"), [
    ({"schema": 7}, "schema: doctor.json schema 7 is not supported; allowed: 1"),
    ({"device": "tpu"}, "device: 'tpu' is not allowed; allowed: cuda, cpu"),
    ({"world_size": 1.5}, r"world_size must be an integer >= 1, got 1.5"),
    ({"gpus": [{"index": -1, "uuid": "GPU-x", "name": "x"}]},
     r"gpus\[0\].index must be an integer >= 0, got -1"),
    ({"sizes": [{"size_bytes": 1024, "iterations": 3, "time_s": 1e-4, "algbw_gbs": 1.0,
                 "busbw_gbs": "fast"}]},
     r"sizes\[0\].busbw_gbs must be a finite number >= 0, got 'fast'"),
    ({"link_allows_gbs": float("nan")}, "link_allows_gbs must be a finite number >= 0"),
])
def test_a_bad_value_is_named_with_what_is_allowed(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DoctorResult.from_dict({**result().to_dict(), **change})
