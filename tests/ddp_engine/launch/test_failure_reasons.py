"""A real 2-rank run whose rank 1 raises a 5 KB, many-line RuntimeError: the reason in
status.json and the launcher's last line is one line; the whole text is in rank 1's log."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from ddp_engine.common.reasons import REASON_CHARS
from ddp_engine.common.run_dir import atomic_write_json, rank_file, read_status
from ddp_engine.launch.launcher import AFTER_ROOT_CHARS, _rank_error
from tests.conftest import REPO, run_engine

SCRIPT = REPO / "tests" / "ddp_engine" / "rank" / "scripts" / "long_error.py"


def _script_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("long_error", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_long_many_line_exception_is_one_line_naming_the_log_that_holds_it(
        tmp_path: Path) -> None:
    script = _script_module()
    message = script.long_message(3)
    assert len(message) > 5000 and message.count("\n") > 100
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--script", str(SCRIPT), "--nproc", "2", "--run-dir",
                      str(run_dir), "--", "--fail-at", "3")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = read_status(run_dir) or {}
    reason = status["reason"]
    assert status["state"] == "failed" and status["root_rank"] == 1
    assert "\n" not in reason and "At:" not in reason and "model.py(" not in reason
    m = re.search(r"rank 1 failed: (RuntimeError: .*?) \(the whole text is in (\S+)\)", reason)
    assert m, reason
    quoted, log = m[1], Path(m[2])
    assert quoted.startswith("RuntimeError: rank 1 saw a bad batch at step 3: sample 0 is NaN")
    assert len(quoted) == REASON_CHARS and quoted.endswith("…")
    # Then what rank 0 did, briefly: SIGTERMed by torchrun, or (first under load) failed in
    # gloo for the peer that went away, its error cut to AFTER_ROOT_CHARS.
    rest = reason[m.end():]
    assert reason.startswith(m[0]) and (rest == "" or rest.startswith("; rank 0 ")), reason
    assert len(rest) <= len("; rank 0 failed: ") + AFTER_ROOT_CHARS, rest
    assert status["ranks"]["1"]["error"] == f"{quoted} (the whole text is in {log})"
    # The whole text, every line of it, is in rank 1's log.
    assert log.parent.name == "1" and log.is_relative_to(run_dir / "logs")
    logged = log.read_text()
    for line in message.splitlines():
        assert line in logged, line
    # The launcher's last line of the run is the same one line.
    ended = [line for line in proc.stdout.splitlines() if line.startswith("[rankscope] failed")]
    assert ended == [f"[rankscope] failed at step {status['step']}: {reason}"]


def test_a_rank_files_error_is_one_line_too(tmp_path: Path) -> None:
    """The reason taken from a rank file's "error" (torchrun saw no failure): the same line."""
    message = _script_module().long_message(7)
    log = tmp_path / "logs" / "abc" / "attempt_0" / "1" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text(message)
    (tmp_path / "ranks").mkdir()
    atomic_write_json(rank_file(tmp_path, 0), {"rank": 0, "state": "stopped"})
    atomic_write_json(rank_file(tmp_path, 1), {"rank": 1, "state": "failed",
                                               "error": f"RuntimeError: {message}"})
    reason = _rank_error(tmp_path)
    assert reason is not None and "\n" not in reason
    assert reason.startswith("rank 1 raised RuntimeError: rank 1 saw a bad batch at step 7")
    assert reason.endswith(f"… (the whole text is in {log})")
    atomic_write_json(rank_file(tmp_path, 1), {"rank": 1, "state": "failed",
                                               "error": "ValueError: bad batch"})
    assert _rank_error(tmp_path) == "rank 1 raised ValueError: bad batch"
