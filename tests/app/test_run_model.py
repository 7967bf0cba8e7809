"""What the window says about a run (app/run_model.py), driven without a window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.run_model import (
    failure_text,
    finished_text,
    parse_remote,
    plural,
    progress_text,
    restored_form,
    resume_config,
    save_form,
    steps_text,
    stop_by,
    unavailable_text,
    warning_text,
)
from ddp_engine.common.config import RunConfig


def test_a_finished_run_says_how_it_ended_and_what_is_left() -> None:
    # the state label beside it says "completed": the line does not say it again
    assert finished_text({"state": "completed", "step": 300}) == (
        "at step 300 | no process of the run is left")
    text = finished_text({"state": "stopped", "step": 12, "reason": "stopped by SIGTERM",
                          "leftover_pids": [11, 12], "gpu_leftovers": [{"pid": 11, "gpu": 3}]})
    assert text == ("at step 12: stopped by SIGTERM | 2 processes of the run could not "
                    "be ended: [11, 12] | NVML still lists pid 11 on GPU 3")
    mine = finished_text({"state": "stopped", "step": 5,
                          "reason": f"stop requested (stop command from {stop_by()}); all "
                                    "ranks stopped after step 5"})
    assert mine == ("at step 5: stop requested (stopped from this window); all ranks stopped "
                    "after step 5 | no process of the run is left")
    other = finished_text({"state": "stopped", "step": 5,
                           "reason": "stop command from python -m ddp_engine stop (pid 1 on h)"})
    assert "stopped from this window" not in other
    assert "not checked from here" in finished_text({"state": "completed", "remote": "h:1"})


def test_a_failure_names_each_rank_and_shows_the_log_tail() -> None:
    text = failure_text({"reason": "rank 1 failed: boom", "log_rank": 1,
                         "log_tail": ["Traceback", "RuntimeError: boom"],
                         "ranks": {"1": {"exit_code": 1}, "0": {"signal": "SIGKILL"}}})
    assert text == ("rank 1 failed: boom\n\nrank 0: signal SIGKILL, rank 1: exit code 1\n\n"
                    "Last lines of rank 1's log:\nTraceback\nRuntimeError: boom")
    assert "on rank 0's machine (h:1)" in failure_text({"remote": "h:1", "exit_codes": {"0": 1}})


def test_resume_needs_a_config_and_a_checkpoint_and_says_to_raise_max_steps(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ValueError, match="cannot resume run: it has no config.json and "
                                         "checkpoints/last.pt"):
        resume_config(run, tmp_path / "runs")
    (run / "config.json").write_text(json.dumps(RunConfig(max_steps=300).to_dict()))
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.pt").write_bytes(b"")
    (run / "status.json").write_text(json.dumps({"state": "completed", "step": 300}))
    cfg, text = resume_config(run, tmp_path / "runs")
    assert cfg.resume == str(run / "checkpoints" / "last.pt") and cfg.run_dir is None
    assert cfg.runs_dir == str(tmp_path / "runs")
    assert text.endswith("then Start (F5); raise Max steps above 300 to train further")
    (run / "config.json").write_text(json.dumps({"batch_size": 0}))
    with pytest.raises(ValueError, match="cannot resume run: batch_size must be >= 1, got 0"):
        resume_config(run, tmp_path / "runs")


def test_the_attach_fields_name_what_is_wrong() -> None:
    assert parse_remote(" node0 ", "29600", " tok ") == ("node0", 29600, "tok")
    with pytest.raises(ValueError, match="port must be a whole number between 1 and 65535, "
                                         "got 'x'"):
        parse_remote("node0", "x", "tok")


class _Settings:
    """QSettings' value/setValue/sync, in a dict."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def value(self, key: str) -> Any:
        return self.values.get(key)

    def setValue(self, key: str, value: Any) -> None:  # noqa: N802 (QSettings' name)
        self.values[key] = value

    def sync(self) -> None:
        pass


def test_the_last_form_is_remembered_without_its_resume() -> None:
    settings = _Settings()
    assert restored_form(settings) is None
    save_form(settings, RunConfig(batch_size=16, resume="old/last.pt"))
    restored = restored_form(settings)
    assert restored is not None and restored.batch_size == 16 and restored.resume is None
    settings.values["last_form"] = '{"batch_size": "many"}'  # an older version's settings
    assert restored_form(settings) is None


def test_counts_have_proper_plurals() -> None:
    assert (plural(1, "run folder"), plural(3, "run folder"), plural(0, "device")) == (
        "1 run folder", "3 run folders", "0 devices")


def test_a_value_the_ranks_refused_is_one_line_not_a_traceback() -> None:
    text = failure_text({"reason": "ranks 0, 1 failed: ConfigError: batch_size: 64 x grad_accum "
                                   "1 x nproc 2 samples per step exceed the 100 training samples",
                         "log_rank": 0, "log_tail": ["Traceback (most recent call last):"]})
    assert text.startswith("ranks 0, 1 failed: batch_size: 64 x grad_accum 1 x nproc 2")
    assert "Traceback" not in text and "nothing was trained" in text


def test_a_run_of_unknown_length_says_its_step_and_no_eta() -> None:
    assert steps_text(120, 500) == "step 120/500"
    assert steps_text(120, None) == "step 120" and steps_text(120, 0) == "step 120"
    assert steps_text(None, None) == "no step yet"
    assert progress_text(120, 500, 1, "0:42") == "step 120/500  epoch 1  ETA 0:42"
    assert progress_text(120, None, 0, "?") == "step 120  (length unknown: no ETA)"
    assert progress_text(120, None, 3, "?") == "step 120  epoch 3  (length unknown: no ETA)"
    assert progress_text(600, 600, 27, "0:00", ended="completed") == \
        "step 600/600  epoch 27  completed"
    assert progress_text(3840, None, 0, "?", ended="stopped") == "step 3840  stopped"
    assert "None" not in progress_text(0, None, 0, "?")


def test_what_a_script_run_cannot_show_is_said_in_words() -> None:
    assert unavailable_text({}) == ""
    text = unavailable_text({"sync": "the script registered DDP's built-in comm hook "
                                     "FP16_COMPRESS, which cannot be timed from Python",
                             "loss": "no one-element tensor was passed to backward()",
                             "new_thing": "why"}, "/home/u/train.py")
    assert text == ("Not measured for train.py: gradient sync timing (the script registered "
                    "DDP's built-in comm hook FP16_COMPRESS, which cannot be timed from Python)"
                    "; the loss (no one-element tensor was passed to backward()); new_thing "
                    "(why)")
    assert unavailable_text({"samples": "no DDP"}).startswith(
        "Not measured for this script: throughput (samples/s) and forward time (no DDP)")


def test_the_latest_warning_says_how_many_came_before() -> None:
    assert warning_text(None, 0) is None
    assert warning_text({"message": "loss spike at step 40"}, 1) == "warning: loss spike at step 40"
    assert warning_text({}, 3) == "warning: no message (2 earlier warnings)"
