"""NCCL's flight-recorder dumps read into one verdict (ddp_engine/common/flight_recorder.py).

The dumps here are written by the test in the format PyTorch's ProcessGroupNCCL writes (and
torch.distributed.flight_recorder reads): a pickled dict whose ``entries`` are the ring buffer's
records. A real one, from a GPU, is read back by ``make gpu-check`` (its flight-recorder part)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from ddp_engine.common.flight_recorder import DUMP_PREFIX, read_dumps, recorder_env, verdict

NOW_NS = 1_700_000_000 * 10**9


def entry(seq: int, state: str = "completed", op: str = "all_reduce",
          started_s_ago: float = 0.0, group: str = "0") -> dict:
    return {"record_id": seq, "pg_id": 0, "process_group": (group, "default_pg"),
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": f"nccl:{op}", "time_created_ns": NOW_NS - int(started_s_ago * 1e9),
            "time_discovered_started_ns": (NOW_NS - int(started_s_ago * 1e9)
                                           if state != "scheduled" else None),
            "state": state, "input_sizes": [[1024]], "output_sizes": [[1024]],
            "input_dtypes": ["Float"], "output_dtypes": ["Float"], "is_p2p": False,
            "timeout_ms": 600000, "frames": []}


def write(run_dir: Path, rank: int, entries: list[dict]) -> None:
    path = run_dir / "ranks" / f"{DUMP_PREFIX}{rank}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({"version": "2.4", "pg_config": {}, "entries": entries}))
    os.utime(path, (NOW_NS / 1e9, NOW_NS / 1e9))  # dumped "now"


def test_a_rank_that_never_joined_the_collective_is_named_with_how_long_the_others_waited(
        tmp_path: Path) -> None:
    done = [entry(s) for s in range(409, 412)]
    for rank in (0, 2, 3):
        write(tmp_path, rank, [*done, entry(412, "started", started_s_ago=120)])
    write(tmp_path, 1, done)  # rank 1 never called #412
    assert verdict(read_dumps(tmp_path)) == (
        "rank 1 never joined all_reduce #412; ranks 0, 2, 3 waited in it for 120 s")


def test_ranks_in_different_collectives_at_one_number_are_a_mismatch(tmp_path: Path) -> None:
    write(tmp_path, 0, [entry(7), entry(8, "started", "all_reduce", 30)])
    write(tmp_path, 1, [entry(7), entry(8, "started", "broadcast", 30)])
    assert verdict(read_dumps(tmp_path)) == (
        "the ranks disagree on collective #8: rank 0 in all_reduce; rank 1 in broadcast (their "
        "code took different paths: each waits for a collective the others never call)")


def test_every_rank_inside_an_unfinished_collective_points_at_the_links(tmp_path: Path) -> None:
    for rank in (0, 1):
        write(tmp_path, rank, [entry(3), entry(4, "started", started_s_ago=600)])
    text = verdict(read_dumps(tmp_path))
    assert text is not None and text.startswith(
        "every rank is in all_reduce #4 for 600 s and it never completed")


def test_a_rank_without_a_dump_is_named(tmp_path: Path) -> None:
    write(tmp_path, 0, [entry(4, "started", started_s_ago=90)])
    write(tmp_path, 2, [entry(4, "started", started_s_ago=95)])
    assert verdict(read_dumps(tmp_path)) == (
        "ranks 0, 2 waited in all_reduce #4 for 95 s; no dump from rank 1 (that process died "
        "or hung before its watchdog wrote)")


def test_nothing_unfinished_or_nothing_readable_is_no_verdict(tmp_path: Path) -> None:
    assert verdict(read_dumps(tmp_path)) is None  # no dumps at all
    write(tmp_path, 0, [entry(1), entry(2)])
    write(tmp_path, 1, [entry(1), entry(2), entry(9, "started", group="5")])  # another group
    assert verdict(read_dumps(tmp_path)) is None
    (tmp_path / "ranks" / f"{DUMP_PREFIX}2").write_bytes(b"not a pickle")
    (tmp_path / "ranks" / f"{DUMP_PREFIX}3").write_bytes(pickle.dumps(Path("/")))  # a class
    assert sorted(read_dumps(tmp_path)) == [0, 1]


def test_the_recorder_is_turned_on_into_the_run_folder_unless_the_user_set_it(
        tmp_path: Path) -> None:
    env = recorder_env(tmp_path, environ={})
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "ranks" / DUMP_PREFIX)
    mine = recorder_env(tmp_path, environ={"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"})
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in mine and "TORCH_FR_BUFFER_SIZE" in mine
