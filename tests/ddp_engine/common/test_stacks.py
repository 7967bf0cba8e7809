"""Reading stack dumps and grouping ranks by where they stand (captured dumps), and taking the
stacks of real 2-process gloo runs: a rank stuck in Python, ranks waiting in a collective."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from ddp_engine.common.run_dir import read_rank_files, read_status
from ddp_engine.common.stack_dumps import STACK_SIGNAL, catches_signal
from ddp_engine.common.stack_text import (
    PACKAGE_DIRS,
    RANKSCOPE,
    USER,
    Frame,
    frames_text,
    group,
    is_rankscope_file,
    main_thread,
    parse_faulthandler,
    parse_py_spy,
    place_of,
    summary_line,
    verdict,
)
from ddp_engine.common.stacks import NotARunFolder, StackReport, take_stacks
from tests.conftest import FAULTY, REPO, start_engine, wait_for

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
# A rank waiting in DDP's backward (captured from a real run, paths shortened).
RANK0 = f"""\
Thread 0x00007f67e9ffb6c0 (most recent call first):
  File "{STDLIB}/threading.py", line 331 in wait
  File "/work/ddp_engine/common/heartbeat.py", line 127 in _loop
  File "{STDLIB}/threading.py", line 1045 in _bootstrap_inner
  File "{STDLIB}/threading.py", line 1002 in _bootstrap

Current thread 0x00007f68112acb80 (most recent call first):
  File "{SITE}/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "{SITE}/torch/autograd/__init__.py", line 395 in backward
  File "{SITE}/torch/_tensor.py", line 623 in backward
  File "/work/ddp_engine/rank/trainer.py", line 274 in _train_step
  File "/work/ddp_engine/rank/worker.py", line 147 in main
  File "<frozen runpy>", line 198 in _run_module_as_main
"""
RANK1 = f"""\
Thread 0x00007ff6d12236c0 (most recent call first):
  File "{STDLIB}/threading.py", line 629 in wait
  File "{STDLIB}/threading.py", line 1002 in _bootstrap

Current thread 0x00007ff6f3a99b80 (most recent call first):
  File "/home/me/my_dataset.py", line 57 in __getitem__
  File "{SITE}/torch/utils/data/_utils/fetch.py", line 52 in fetch
  File "{SITE}/torch/utils/data/dataloader.py", line 673 in _next_data
  File "/work/ddp_engine/rank/trainer.py", line 250 in _train_step
  File "<frozen runpy>", line 198 in _run_module_as_main
"""
IN_ALL_REDUCE = f"""\
Current thread 0x00007f0000000001 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "{SITE}/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/home/me/train.py", line 210 in main
  File "/home/me/train.py", line 230 in <module>
"""
# py-spy dump --native --full-filenames of a rank waiting in DDP's backward (captured here).
PY_SPY = f"""\
Process 8859: /venv/bin/python -u -m ddp_engine.worker --config /tmp/run2/config.json
Python v3.11.7 (/usr/bin/python3.11)

Thread 8859 (idle): "MainThread"
    0x7fe104ca3f16 (/usr/lib/x86_64-linux-gnu/libc.so.6)
    pthread_cond_wait (/usr/lib/x86_64-linux-gnu/libc.so.6)
    std::condition_variable::wait (/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30)
    c10d::Reducer::finalize_backward ({SITE}/torch/lib/libtorch_cpu.so)
    torch::autograd::Engine::execute ({SITE}/torch/lib/libtorch_cpu.so)
    THPEngine_run_backward ({SITE}/torch/lib/libtorch_python.so)
    _engine_run_backward ({SITE}/torch/autograd/graph.py:979)
    backward ({SITE}/torch/autograd/__init__.py:395)
    Tensor.backward ({SITE}/torch/_tensor.py:623)
    Trainer._train_step (/work/ddp_engine/rank/trainer.py:281)
    main (/work/ddp_engine/rank/worker.py:147)
    _run_module_as_main (<frozen runpy>:198)
    0x7fe104c4524a (/usr/lib/x86_64-linux-gnu/libc.so.6)
Thread 8877 (idle): "rankscope-telemetry"
    epoll_wait (/usr/lib/x86_64-linux-gnu/libc.so.6)
    select_epoll_poll_impl (/tmp/python-build/Python-3.11.7/Modules/selectmodule.c:1598)
    EpollSelector.select ({STDLIB}/selectors.py:468)
    Telemetry._serve (/work/ddp_engine/rank/telemetry.py:230)
    Thread._bootstrap ({STDLIB}/threading.py:1002)
"""

# A user's script under Rankscope (ddp_train.py, line 73: loss.backward()), its rank 0 caught
# inside Rankscope's timing comm hook as it hands a bucket to gloo (paths shortened), ...
SCRIPT_IN_HOOK = f"""\
Current thread 0x00007f0000000002 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "{SITE}/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/work/ddp_engine/rank/sync_timing.py", line 110 in hook
  File "{SITE}/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "{SITE}/torch/autograd/__init__.py", line 395 in backward
  File "/work/ddp_engine/rank/script_watch.py", line 185 in backward
  File "{SITE}/torch/_tensor.py", line 623 in backward
  File "/home/me/ddp_train.py", line 73 in train
  File "/home/me/ddp_train.py", line 90 in <module>
  File "<frozen runpy>", line 291 in run_path
  File "/work/ddp_engine/rank/script_run.py", line 95 in _run_main
  File "/work/ddp_engine/rank/script_run.py", line 63 in run_script
  File "/work/ddp_engine/rank/worker.py", line 71 in main
  File "{SITE}/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367 in wrapper
  File "/work/ddp_engine/worker.py", line 11 in <module>
  File "<frozen runpy>", line 198 in _run_module_as_main
"""
# ... and in Rankscope's agreed-stop round, which the script's optimizer.step() (line 75) runs.
SCRIPT_IN_STOP_ROUND = f"""\
Current thread 0x00007f0000000003 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 4400 in wait
  File "/work/ddp_engine/rank/distributed.py", line 391 in _finish
  File "/work/ddp_engine/rank/distributed.py", line 346 in after_step
  File "/work/ddp_engine/rank/script_watch.py", line 330 in _end_step
  File "/work/ddp_engine/rank/script_watch.py", line 315 in _after_opt_step
  File "{SITE}/torch/optim/optimizer.py", line 520 in wrapper
  File "/home/me/ddp_train.py", line 75 in train
  File "/home/me/ddp_train.py", line 90 in <module>
  File "<frozen runpy>", line 291 in run_path
  File "/work/ddp_engine/rank/script_run.py", line 95 in _run_main
"""


def test_a_faulthandler_dump_is_read_thread_by_thread() -> None:
    threads = parse_faulthandler(RANK0)
    assert [t.ident for t in threads] == ["0x00007f67e9ffb6c0", "0x00007f68112acb80"]
    assert [t.current for t in threads] == [False, True]
    assert threads[1].frames[3] == Frame("/work/ddp_engine/rank/trainer.py", 274, "_train_step")
    assert len(threads[1].frames) == 6


def test_the_main_thread_is_found_by_its_ident_else_by_not_being_a_threading_thread() -> None:
    threads = parse_faulthandler(RANK0)
    assert main_thread(threads, 0x00007F67E9FFB6C0) is threads[0]  # the rank file's word wins
    assert main_thread(threads, None) is threads[1]
    assert main_thread(list(reversed(threads)), None) is threads[1]


def test_ranks_are_grouped_by_where_they_stand_with_the_waiting_named() -> None:
    rank0 = place_of(parse_faulthandler(RANK0)[1].frames)
    rank1 = place_of(parse_faulthandler(RANK1)[1].frames)
    waiting = place_of(parse_faulthandler(IN_ALL_REDUCE)[0].frames)
    assert waiting.text() == "all_reduce in train.py:210 (waiting for the other ranks)"
    assert rank1.text() == "data loading in my_dataset.py:57, __getitem__"
    groups = group({0: waiting, 2: waiting, 3: waiting, 1: rank1})
    assert summary_line(groups) == ("ranks 0, 2, 3: all_reduce in train.py:210 (waiting for "
                                    "the other ranks); rank 1: data loading in "
                                    "my_dataset.py:57, __getitem__")
    assert verdict(groups) == ("rank 1 is outside any collective while the others wait: look "
                               "there first")
    # DDP's backward: waiting for sure only while another rank is outside any collective.
    assert "waiting for the other ranks in DDP's gradient all-reduce" in summary_line(
        group({0: rank0, 1: rank1}))
    alone = summary_line(group({0: rank0, 1: rank0}))
    assert alone.startswith("ranks 0, 1: backward in trainer.py:274 (computing, or waiting")
    assert verdict(group({0: rank0, 1: rank0})) is None


def test_a_py_spy_dump_with_native_frames_is_read_too() -> None:
    threads = parse_py_spy(PY_SPY)
    assert [t.name for t in threads] == ["MainThread", "rankscope-telemetry"]
    main = main_thread(threads, None)
    assert main is threads[0]
    assert main.frames[9] == Frame("/work/ddp_engine/rank/trainer.py", 281, "Trainer._train_step")
    assert not main.frames[3].python and threads[1].frames[1].python is False  # C, with a line
    # The native frames say for sure what the Python ones cannot: it waits, in DDP's reducer.
    assert place_of(main.frames).text() == ("backward in trainer.py:281 (waiting for the "
                                            "other ranks in DDP's gradient all-reduce)")
    in_gloo = [Frame("libtorch_cpu.so", None, "gloo::transport::tcp::UnboundBuffer::waitRecv"),
               *parse_faulthandler(IN_ALL_REDUCE)[0].frames[2:]]
    assert place_of(in_gloo).text() == "collective in train.py:210 (waiting for the other ranks)"


def test_a_script_run_names_the_users_innermost_frame_not_rankscopes() -> None:
    """Rankscope's hooks sit between the user's line and the collective: the summary names the
    user's line and what it waits in; the stack text folds Rankscope's frames."""
    in_hook = parse_faulthandler(SCRIPT_IN_HOOK)[0].frames
    assert place_of(in_hook).text() == ("backward in ddp_train.py:73 (waiting for the other "
                                        "ranks in DDP's gradient all-reduce)")
    in_round = parse_faulthandler(SCRIPT_IN_STOP_ROUND)[0].frames
    assert place_of(in_round).text() == ("wait in ddp_train.py:75 (waiting for the other "
                                         "ranks, in Rankscope's _finish (distributed.py:391))")
    text = frames_text(in_hook, fold=True)
    assert "sync_timing.py" not in text and "script_watch.py" not in text
    assert text.splitlines()[2:4] == ["  ... 1 Rankscope frame ...",
                                      f'  File "{SITE}/torch/autograd/graph.py", line 979 in '
                                      "_engine_run_backward"]
    assert "  ... 3 Rankscope frames ..." in text.splitlines()
    assert text.count("Rankscope frame") == 4 and len(text.splitlines()) == 14
    # Unfolded (a built-in run's text, and the saved dumps), every frame is there.
    assert frames_text(in_hook).count("/work/ddp_engine/") == 6


def test_rankscope_frames_are_told_by_path_not_by_a_folder_name() -> None:
    engine, front = PACKAGE_DIRS[0], PACKAGE_DIRS[1]
    assert engine == REPO / "ddp_engine" and front.name == "rankscope"
    assert is_rankscope_file(str(engine / "rank" / "script_watch.py"))
    assert is_rankscope_file(str(front / "__init__.py"))
    # Another copy of Rankscope (a dump from elsewhere): its modules are this install's.
    assert is_rankscope_file("/opt/other/ddp_engine/rank/trainer.py")
    assert is_rankscope_file("ddp_engine/common/heartbeat.py")  # py-spy's short names
    # The user's files in folders that happen to be named so are the user's.
    assert not is_rankscope_file(str(REPO / "tests" / "ddp_engine" / "rank" / "scripts" /
                                     "stuck.py"))
    assert not is_rankscope_file("/home/me/rankscope/train.py")
    assert not is_rankscope_file("/home/me/ddp_engine/rank/my_trainer.py")
    assert Frame("/home/me/ddp_engine/train.py", 3, "main").origin == USER
    assert Frame(str(REPO / "ddp_engine" / "worker.py"), 11, "<module>").origin == RANKSCOPE
    assert not Frame(f"{SITE}/torch/_tensor.py", 623, "backward").is_user_code()


def test_a_folder_that_is_not_a_run_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotARunFolder, match="is not a folder"):
        take_stacks(tmp_path / "missing")
    with pytest.raises(NotARunFolder, match="is not a run folder"):
        take_stacks(tmp_path)


def test_a_process_that_does_not_catch_the_signal_is_never_sent_it(tmp_path: Path) -> None:
    """A rank file whose pid does not catch STACK_SIGNAL (here: this test's own process):
    signalling it would end it. It is named, not signalled."""
    assert catches_signal(os.getpid()) is False
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank-0.json").write_text(
        f'{{"rank": 0, "pid": {os.getpid()}, "state": "running", "time": 4e9}}')
    report = take_stacks(tmp_path, timeout_s=1)
    assert not report.ranks and report.path is None
    assert "does not answer stack requests" in report.notes[0]


def _stacks_when(run_dir: Path, ok: Callable[[StackReport], bool], what: str) -> StackReport:
    found: list[StackReport] = []

    def take() -> bool:
        if not (run_dir / "ranks").is_dir():  # the launcher has not made it yet
            return False
        report = take_stacks(run_dir, timeout_s=10)
        found.append(report)
        return ok(report)

    wait_for(take, 120, what, interval=0.5)
    return found[-1]


@pytest.mark.slow
def test_a_script_rank_stuck_in_python_and_one_waiting_in_all_reduce(tmp_path: Path) -> None:
    """A user's own script: rank 1 stays in a Python function, rank 0 waits for it in
    dist.all_reduce (a gloo collective: blocked in C)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import time\nimport torch\nimport torch.distributed as dist\n\n\n"
        "def stuck_here():\n    while True:\n        time.sleep(0.2)\n\n\n"
        "dist.init_process_group('gloo')\nt = torch.ones(1)\ndist.all_reduce(t)\n"
        "if dist.get_rank() == 1:\n    stuck_here()\n"
        "dist.all_reduce(t)  # rank 0 waits here\n")
    run_dir = tmp_path / "run"
    proc = start_engine("launch", "--script", str(script), "--nproc", "2", "--run-dir",
                        str(run_dir), log=tmp_path / "out.log")
    try:
        report = _stacks_when(run_dir, lambda r: len(r.groups) == 2, "two ranks apart")
    finally:
        proc.kill()
    assert report.summary == ("rank 0: all_reduce in train.py:16 (waiting for the other "
                              "ranks); rank 1: stuck_here in train.py:8")
    assert report.mechanism in ("faulthandler", "py-spy")


def _line_of(path: Path, marker: str) -> int:
    """The line of ``path`` that holds ``marker`` (1-based)."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if marker in line)


@pytest.mark.slow
def test_a_ddp_script_stuck_in_its_own_loop_is_named_by_its_own_lines(tmp_path: Path) -> None:
    """A DDP script (tests/ddp_engine/rank/scripts/stuck.py): rank 1 loops in spin(), rank 0
    waits for it in DDP's backward, under Rankscope's watch and timing hook. The summary names
    the script's own lines; the grouped text folds Rankscope's frames; the saved file keeps
    them."""
    script = REPO / "tests" / "ddp_engine" / "rank" / "scripts" / "stuck.py"
    run_dir = tmp_path / "run"
    proc = start_engine("launch", "--script", str(script), "--nproc", "2", "--run-dir",
                        str(run_dir), log=tmp_path / "out.log")
    try:
        report = _stacks_when(run_dir, lambda r: "rank 1: spin" in r.summary and "rank 0: "
                              "backward" in r.summary, "rank 1 in spin(), rank 0 in backward")
    finally:
        proc.kill()
    assert report.script
    assert report.summary == (
        f"rank 0: backward in stuck.py:{_line_of(script, '# rank 0 waits here')} (waiting for "
        "the other ranks in DDP's gradient all-reduce); rank 1: spin in "
        f"stuck.py:{_line_of(script, '# rank 1 stands here')}")
    grouped = report.text
    assert "Rankscope frame" in grouped
    assert not any(name in grouped for name in ("script_watch.py", "script_run.py",
                                                "ddp_engine/worker.py"))
    assert report.path is not None
    assert "script_run.py" in report.path.read_text()  # every frame, in the saved dumps


@pytest.mark.slow
def test_sampling_a_run_five_times_leaves_it_training_to_completion(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_engine("launch", "--nproc", "2", "--max-steps", "150", "--log-every", "5",
                        "--loss", f"{FAULTY}:slow", "--run-dir", str(run_dir),
                        log=tmp_path / "out.log")
    try:
        wait_for(lambda: len(read_rank_files(run_dir)) == 2, 120, "both ranks running")
        taken = []
        for _ in range(5):
            report = take_stacks(run_dir, timeout_s=10)
            if len(report.ranks) < 2:
                break  # it completed already: the samples taken still count below
            taken.append(report)
        assert proc.wait(timeout=180) == 0, (tmp_path / "out.log").read_text()[-2000:]
    finally:
        proc.kill()
    assert len(taken) >= 3, "the run ended before it was sampled"
    assert (read_status(run_dir) or {}).get("state") == "completed"
    assert all(r.ranks[0].place is not None for r in taken)
    assert len({r.path for r in taken}) == len(taken)  # a file each


def test_stack_signal_is_none_the_ranks_use_for_anything_else() -> None:
    from ddp_engine.common.lifeline import PARENT_DEATH_SIGNAL

    assert STACK_SIGNAL not in (PARENT_DEATH_SIGNAL, signal.SIGUSR2, signal.SIGTERM,
                                signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
