"""A collective timeout in the failure reason: SIGABRT, or NCCL's watchdog in a rank's log."""

from __future__ import annotations

import json
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from ddp_engine.launch.launcher import AFTER_ROOT_CHARS, _failure_reason
from ddp_engine.launch.timeouts import watchdog_line

WATCHDOG = ("[rank0]:[E1205 10:00:00.000000 123 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=120000) ran for 120003 milliseconds before "
            "timing out.")
"""The line ProcessGroupNCCL's watchdog logs before it aborts the rank (torch 2.x)."""


def _failure(tmp_path: Path, rank: int, exitcode: int) -> ProcessFailure:
    """torchrun's record of a rank that ended with ``exitcode`` (no error file)."""
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode,
                          error_file=str(tmp_path / f"no-error-file-{rank}.json"))


def _log(tmp_path: Path, rank: int, *lines: str) -> Path:
    path = tmp_path / "logs" / "run" / "attempt_0" / str(rank) / "stderr.log"
    path.parent.mkdir(parents=True)
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_ranks_aborted_by_nccls_watchdog_are_one_collective_timeout(tmp_path: Path) -> None:
    logs = {0: _log(tmp_path, 0, "step 5", WATCHDOG, "terminate called after throwing an "
                    "instance of 'c10::DistBackendError'"),
            2: _log(tmp_path, 2, WATCHDOG.replace("Rank 0", "Rank 2"))}
    failures = {r: _failure(tmp_path, r, -6) for r in (0, 2)}
    failures[1] = _failure(tmp_path, 1, -9)
    reason, details = _failure_reason(failures, 0, logs, 120.0)
    assert reason == (
        "ranks 0, 2 hit a collective timeout, aborted by NCCL's watchdog (SIGABRT): a "
        "collective waited longer than the process-group timeout (120 s, dist_timeout_s); the "
        "log says \"Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=120000) ran for 120003 "
        "milliseconds before timing out.\"; rank 1 was killed by signal SIGKILL")
    assert details["0"] == {"exit_code": -6, "pid": 1000, "signal": "SIGABRT",
                            "collective_timeout": True}
    assert "collective_timeout" not in details["1"]


def test_a_rank_that_exits_after_the_watchdogs_words_timed_out_too(tmp_path: Path) -> None:
    """The watchdog's error can also surface as an exception in the main thread (exit code 1,
    DistBackendError): the log still says it was a collective timeout."""
    logs = {1: _log(tmp_path, 1, "ProcessGroupNCCL's watchdog got stuck for 480 seconds "
                    "without making progress in monitoring enqueued collectives.")}
    reason, details = _failure_reason({1: _failure(tmp_path, 1, 1)}, 1, logs, 60.0)
    assert reason.startswith("rank 1 hit a collective timeout, ended by NCCL's watchdog: a "
                             "collective waited longer than the process-group timeout (60 s")
    assert details["1"]["collective_timeout"] and "signal" not in details["1"]


def test_other_deaths_are_worded_as_before(tmp_path: Path) -> None:
    logs = {0: _log(tmp_path, 0, "Traceback ...", "RuntimeError: boom")}
    reason, _ = _failure_reason({0: _failure(tmp_path, 0, -9), 1: _failure(tmp_path, 1, -15)},
                                0, logs, 120.0)
    assert reason == "rank 0 was killed by signal SIGKILL; rank 1 was killed by signal SIGTERM"
    assert watchdog_line(None) is None and watchdog_line(tmp_path / "missing.log") is None


def test_a_long_watchdog_line_is_shortened(tmp_path: Path) -> None:
    line = watchdog_line(_log(tmp_path, 0, WATCHDOG + " " + "x" * 500))
    assert line is not None and len(line) == 200 and line.endswith("…")
    assert line.startswith("Watchdog caught collective operation timeout: WorkNCCL(")


def _raised(tmp_path: Path, rank: int, message: str) -> ProcessFailure:
    """torchrun's record of a rank that raised ``message`` (its error file, as torch's
    @record writes it)."""
    path = tmp_path / f"error-{rank}.json"
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {
        "py_callstack": "Traceback ...", "timestamp": "1765000000"}}}))
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=1, error_file=str(path))


def test_after_the_root_cause_another_ranks_error_is_brief(tmp_path: Path) -> None:
    """The peer of a rank that raised fails in gloo: said after the root cause, short and
    without gloo's source place; its whole error stays in the details."""
    gloo = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
            "Read error [127.0.0.1]:13990: Connection reset by peer. This is typically caused by "
            "a remote worker hanging or bugs in the application. Check the logs of the remote "
            "worker before reporting an error. GLHF!")
    failures = {1: _raised(tmp_path, 1, "RuntimeError: rank 1 saw a bad batch"),
                0: _raised(tmp_path, 0, gloo)}
    reason, details = _failure_reason(failures, 1, {}, 60.0)
    first, second = reason.split("; ")
    assert first == "rank 1 failed: RuntimeError: rank 1 saw a bad batch"
    assert second.startswith("rank 0 failed: RuntimeError: Read error [127.0.0.1]:13990: "
                             "Connection reset by peer.") and second.endswith("…"), second
    assert len(second) == len("rank 0 failed: ") + AFTER_ROOT_CHARS
    assert details["0"]["error"].startswith("RuntimeError: [/__w/pytorch/")
