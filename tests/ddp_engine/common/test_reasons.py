"""A failure's reason on one line: real exception texts of gloo, pybind11, c10 and Python."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_engine.common.reasons import REASON_CHARS, error_reason, is_one_line, one_line

# Rank 0's error (its rank file's "error") when rank 1 died while DDP's timing hook of rank 0
# waited in gloo: pybind11's "At:" dump of the Python frames under the callback.
GLOO_CALLBACK = (
    "RuntimeError: Got the following error when running the callback: RuntimeError: "
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:53893. This is typically caused by a remote worker crashing. Check "
    "the logs of the remote worker before reporting an error. GLHF! 🏖️\n\nAt:\n"
    "  /work/main/ddp_engine/rank/sync_timing.py(108): done\n")
# The same with a deeper stack under the callback, as a user's own hook gives (5 KB).
GLOO_DEEP = GLOO_CALLBACK + "".join(
    f"  /home/me/project/hooks.py({i}): reduce_bucket_{i}\n" for i in range(100, 200))
# c10's error with TORCH_SHOW_CPP_STACKTRACES=1 (torch 2.13, shortened after frame #5).
C10 = ("RuntimeError: shape '[3]' is invalid for input of size 2\nException raised from "
       "infer_size_impl at /__w/pytorch/pytorch/aten/src/ATen/InferSize.h:99 (most recent call "
       "first):\nC++ CapturedTraceback:\n#4 std::_Function_handler<...>::_M_invoke(std::_Any_"
       "data const&) from Logging.cpp:0\n#5 c10::Error::Error(c10::SourceLocation, std::string)"
       " from ??:0\n")
TRACEBACK = """\
Traceback (most recent call last):
  File "/home/me/train.py", line 12, in <module>
    main()
  File "/home/me/train.py", line 9, in main
    raise ValueError("bad batch at step 5")
ValueError: bad batch at step 5
"""


GLOO_LINE = GLOO_CALLBACK.splitlines()[0].replace(
    "RuntimeError: Got the following error when running the callback: ", "")


def test_gloo_frames_are_left_out_and_the_first_line_kept() -> None:
    line = one_line(GLOO_DEEP)
    assert line == GLOO_LINE  # the error inside torch's "when running the callback" wrapper
    assert line.startswith("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/")
    assert "\n" not in line and "At:" not in line and "hooks.py" not in line
    assert len(GLOO_DEEP) > 5000 and len(line) <= REASON_CHARS
    assert one_line(C10) == "RuntimeError: shape '[3]' is invalid for input of size 2"


def test_a_long_line_is_cut_with_an_ellipsis() -> None:
    text = "RuntimeError: " + "x" * 1000
    assert one_line(text) == text[:REASON_CHARS - 1] + "…"
    assert len(one_line(text)) == REASON_CHARS
    assert one_line(text, 40) == "RuntimeError: " + "x" * 25 + "…"
    assert one_line("a   b\tc") == "a b c"  # whitespace collapsed


def test_the_exception_line_of_a_traceback_and_a_message_on_the_next_line() -> None:
    assert one_line(TRACEBACK) == "ValueError: bad batch at step 5"
    assert one_line("RuntimeError: \n\n  the loader died\nAt:\n  x.py(1): f\n") == (
        "RuntimeError: the loader died")
    assert one_line("") == one_line(None) == one_line("\n \n") == ""


def test_the_log_is_named_only_when_something_was_left_out(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    assert error_reason("ValueError: bad batch at step 5", log) == (
        "ValueError: bad batch at step 5")
    assert is_one_line("ValueError: bad batch at step 5")
    assert not is_one_line(GLOO_CALLBACK) and not is_one_line("E: " + "x" * 400)
    assert error_reason(GLOO_CALLBACK, log) == (
        f"{GLOO_LINE} (the whole text is in {log})")
    assert error_reason(GLOO_CALLBACK) == GLOO_LINE  # no log known
    assert error_reason("") == "no error text"


@pytest.mark.parametrize("limit", [1, 2])
def test_a_tiny_limit_still_gives_a_line_of_that_length(limit: int) -> None:
    assert len(one_line("ValueError: bad", limit)) == limit
