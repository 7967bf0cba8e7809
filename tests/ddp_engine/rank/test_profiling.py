"""On-demand profiles (issue 31), on real 2-rank gloo runs: the built-in engine, the example
script and an FSDP2 script, each asked through ``python -m ddp_engine profile RUN_DIR --wait``
as a user asks it, while it trains."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.profiler._trace_validator as torch_reader

from ddp_engine.common.profile_files import PROFILES_DIR, SUMMARY_FILE, profile_folders, traces
from ddp_engine.common.profile_trace import read_rank
from ddp_engine.common.protocol import MONITOR_FILE
from ddp_engine.common.run_dir import read_status
from ddp_engine.rank.profile_ask import ProfileAsk, answer
from ddp_engine.rank.profiling import RankProfiler
from tests.conftest import REPO, run_engine, start_engine, wait_for
from tests.ddp_engine.launch.test_launcher import assert_no_process_left, events, metrics
from tests.ddp_engine.rank.script_matrix import SCRIPTS, logged_losses, rankscope, reference

__all__ = ["reference"]  # the module-scoped fixture of script_matrix
SLOW_RANK = Path(__file__).parent / "plugins" / "slow_rank.py"
pytestmark = pytest.mark.slow


def _live(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    run_dir = tmp_path / "run"
    proc = start_engine("launch", "--nproc", "2", "--device", "cpu", "--run-dir", str(run_dir),
                        *args, log=tmp_path / "out.log")
    try:
        wait_for(lambda: (run_dir / MONITOR_FILE).exists() and metrics(run_dir)
                 or proc.poll() is not None, 120, "the run to train")
        assert proc.poll() is None, (tmp_path / "out.log").read_text()
    except BaseException:
        proc.kill()
        raise
    return proc, run_dir


def _profile_then_stop(proc: subprocess.Popen[bytes], run_dir: Path, *args: str,
                       steps: int = 4) -> tuple[str, dict[str, Any], Path]:
    """``profile RUN_DIR --wait`` as a user types it, then ``stop``; the CLI's output, the
    summary and the profile's folder."""
    try:
        got = run_engine("profile", str(run_dir), "--steps", str(steps), "--wait", *args,
                         timeout=240)
        assert got.returncode == 0, got.stdout + got.stderr
    finally:
        run_engine("stop", str(run_dir), timeout=120)
        proc.wait(60)
    assert_no_process_left(run_dir)
    folder = profile_folders(run_dir)[-1]
    return got.stdout, json.loads((folder / SUMMARY_FILE).read_text()), folder


def assert_profile(folder: Path, summary: dict[str, Any], steps: int, world: int = 2) -> None:
    """Every rank recorded the same ``steps`` steps; its trace loads in torch's own reader;
    each rank's parts add up to its step time within 10%."""
    found = traces(folder)
    assert sorted(found) == list(range(world)), sorted(folder.iterdir())
    firsts = set()
    for rank, path in found.items():
        loaded = torch_reader._load_events(str(path))  # torch's own reader of its traces
        assert any(e.get("name", "").startswith("ProfilerStep#") for e in loaded)
        with gzip.open(path, "rt") as f:
            trace = json.load(f)
        assert trace["distributedInfo"]["rank"] == rank
        marks = [e for e in trace["traceEvents"] if e.get("ph") == "X"
                 and e.get("name", "").startswith("ProfilerStep#")]
        assert len(marks) == steps, (rank, [m["name"] for m in marks])
        firsts.add(trace["rankscope"]["first_step"])
    assert len(firsts) == 1, f"the ranks started their profiles at different steps: {firsts}"
    assert summary["first_step"] == firsts.pop() and summary["steps"] == steps
    for r in summary["per_rank"]:
        parts = sum(r["parts_ms"].values())
        assert parts == pytest.approx(r["step_time_ms"], rel=0.10), r
        assert all(v >= 0 for v in r["parts_ms"].values()), r


def test_a_built_in_run_profiles_the_same_steps_and_names_the_rank_slowed_in_forward(
        tmp_path: Path) -> None:
    """Rank 1's forward sleeps three times as long as it takes (plugins/slow_rank.py, about
    12 ms a step more than rank 0's): rank 1 is the rank most often last to arrive at the
    gradient all-reduce, and rank 0 waits for it there. (Most often, not always: in CI the two
    ranks share two cores with another test's, and a step of rank 0 can be late too.)"""
    proc, run_dir = _live(tmp_path, "--max-steps", "100000", "--eval-every", "0",
                          "--model", f"{SLOW_RANK}:slow_forward_on_rank1",
                          "--model-arg", "slower=3")
    out, summary, folder = _profile_then_stop(proc, run_dir, steps=5)
    assert_profile(folder, summary, steps=5)
    last = summary["last_to_arrive"]
    assert last["rank"] == 1 and last["kind"] == "all_reduce", last
    assert last["share"] > 0.5, last
    grads = next(c for c in summary["collectives"] if c["kind"] == "all_reduce"
                 and c["group"] != "rankscope")
    assert grads["last_rank_counts"].get("1", 0) > 0.5 * sum(grads["last_rank_counts"].values())
    waited = {r["rank"]: r["parts_ms"]["comm_exposed"] for r in summary["per_rank"]}
    assert waited[0] > waited[1], summary["per_rank"]
    assert "Last to arrive: rank 1" in out and str(folder) in out
    # the app and the CLI see the profile on the run's stream, and it ended as asked
    said = events(run_dir, "profile")
    assert [e["state"] for e in said] == ["started", "written"], said
    assert read_status(run_dir)["state"] == "stopped"


def test_the_example_script_is_profiled_at_its_optimizer_steps(tmp_path: Path) -> None:
    proc, run_dir = _live(tmp_path, "--script", str(REPO / "examples" / "ddp_train.py"), "--",
                          "--epochs", "1000", "--checkpoint", str(tmp_path / "ck.pt"))
    _, summary, folder = _profile_then_stop(proc, run_dir, "--shapes", steps=3)
    assert_profile(folder, summary, steps=3)
    grads = [c for c in summary["collectives"] if c["kind"] == "all_reduce"
             and c["group"] != "rankscope"]
    assert grads and grads[0]["bytes"], summary["collectives"]  # --shapes: sizes known
    assert grads[0]["calls_per_step"] >= 1


def test_an_fsdp2_script_on_a_2d_mesh_gets_its_collectives_in_the_profile(
        tmp_path: Path, reference) -> None:
    """fully_shard over a 2-D (replicate x shard) mesh (HSDP; a 1-D mesh is its shard
    dimension alone): its all-gathers and reduce-scatters are in the summary, as are the
    steps, and it trains as under plain torchrun, to the same losses."""
    script, mesh = SCRIPTS / "fsdp2_train.py", "2d"
    plain = reference(script, "--steps", "6", "--mesh", mesh)
    watched = tmp_path / "watched"
    done = rankscope(tmp_path / "done", script, "--out", str(watched), "--steps", "6",
                     "--mesh", mesh)
    assert done.returncode == 0, done.stdout + done.stderr
    assert logged_losses(watched) == pytest.approx(logged_losses(plain), rel=1e-6)
    proc, run_dir = _live(tmp_path, "--script", str(script), "--", "--steps", "100000",
                          "--mesh", mesh)
    _, summary, folder = _profile_then_stop(proc, run_dir, steps=3)
    assert_profile(folder, summary, steps=3)
    kinds = {c["kind"] for c in summary["collectives"] if c["group"] != "rankscope"}
    assert {"all_gather", "reduce_scatter"} <= kinds, summary["collectives"]
    for c in summary["collectives"]:
        assert c["matched"], c  # every rank made the same calls: the skew is known


# ---------------------------------------------------------------- one rank, in this process
def _training(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    loss = model(torch.randn(16, 8)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


@pytest.fixture
def one_rank(tmp_path: Path) -> tuple[RankProfiler, list[tuple[str, dict[str, Any]]]]:
    said: list[tuple[str, dict[str, Any]]] = []
    profiler = RankProfiler(tmp_path, 0, range(1), torch.device("cpu"), ProfileAsk(),
                            lambda kind, **fields: said.append((kind, fields)))
    return profiler, said


def _agree(profiler: RankProfiler, steps: int) -> None:
    """What a round carrying rank 0's ask does on every rank."""
    reply = answer(profiler.ask, profiler.run_dir, {"type": "profile", "steps": steps})
    assert reply["type"] == "ack", reply
    profiler.ask.read([list(profiler.ask.row())])


def test_a_profile_records_the_agreed_steps_after_one_warm_up_step(one_rank) -> None:
    profiler, said = one_rank
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 12):
        if step == 5:
            _agree(profiler, 3)
        _training(model, opt)
        profiler.after_step(step)
        assert profiler.active == (5 <= step < 9), step
    for thread in profiler.summaries:
        thread.join(30)
    [folder] = profile_folders(profiler.run_dir)
    assert folder.name.endswith("-step5")
    summary = json.loads((folder / SUMMARY_FILE).read_text())
    assert (summary["first_step"], summary["steps"], summary["ranks"]) == (7, 3, [0])
    assert [(k, f["state"]) for k, f in said] == [("profile", "started"),
                                                  ("profile", "written")]
    assert said[0][1]["first_step"] == 7 and said[1][1]["summary"].endswith(SUMMARY_FILE)


def test_a_run_that_ends_mid_profile_writes_what_it_recorded(one_rank) -> None:
    profiler, _ = one_rank
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _agree(profiler, 10)
    for step in range(1, 5):  # step 1 agreed it, 2 warms up, 3 and 4 are recorded
        _training(model, opt)
        profiler.after_step(step)
    profiler.close(4)
    assert not profiler.active
    [folder] = profile_folders(profiler.run_dir)
    assert len(read_rank(traces(folder)[0], 0).steps) == 2
    # ended while warming up: nothing recorded, and the folder says why
    _agree(profiler, 10)
    profiler.after_step(5)
    profiler.after_step(6)
    profiler.close(6)
    newest = profile_folders(profiler.run_dir)[-1]
    assert "before the profile's first recorded step" in (newest / "rank-0.error.txt").read_text()


def test_a_script_profiling_itself_keeps_its_profiler_and_this_rank_says_so(one_rank) -> None:
    profiler, said = one_rank
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile() as own:  # the script's own, as the tutorials write it
        _agree(profiler, 2)
        for step in range(1, 5):
            _training(model, opt)
            profiler.after_step(step)
    assert any(e.key == "aten::addmm" for e in own.key_averages())  # its profile is whole
    [folder] = profile_folders(profiler.run_dir)
    assert "the script's own torch.profiler was running" in \
        (folder / "rank-0.error.txt").read_text()
    assert not profiler.active


@pytest.fixture
def watching(one_rank):  # noqa: ANN001, ANN201
    """``one_rank`` with the script's profilers watched, as in a script run."""
    profiler, said = one_rank
    profiler.own.install()
    yield profiler, said
    profiler.own.uninstall()


def test_a_script_profiler_waiting_or_warming_up_is_left_alone(watching) -> None:
    """The tutorials' scheduled profiler is live from ``start()`` through its waiting and
    warm-up steps, when torch itself says no profiler is enabled yet: ours does not start."""
    profiler, _ = watching
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    every = torch.profiler.schedule(wait=1, warmup=2, active=2, repeat=1)
    with torch.profiler.profile(schedule=every,
                                on_trace_ready=lambda p: seen.append(p.key_averages())) as own:
        _agree(profiler, 3)
        for step in range(1, 8):
            _training(model, opt)
            profiler.after_step(step)
            own.step()  # the script's own: no "Profiler is already enabled"
    assert seen and any(e.key == "aten::addmm" for e in seen[0])
    [folder] = profile_folders(profiler.run_dir)
    assert "the script's own torch.profiler was running" in \
        (folder / "rank-0.error.txt").read_text()


def test_a_script_starting_its_profiler_during_ours_takes_over_without_a_crash(
        watching) -> None:
    profiler, _ = watching
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _agree(profiler, 5)
    for step in range(1, 4):
        _training(model, opt)
        profiler.after_step(step)
    assert profiler.active
    with torch.profiler.profile() as own:  # two at once would abort the process
        _training(model, opt)
    assert not profiler.active and any(e.key == "aten::addmm" for e in own.key_averages())
    for step in range(4, 12):  # training goes on; ours stays off
        _training(model, opt)
        profiler.after_step(step)
    [folder] = profile_folders(profiler.run_dir)
    assert not traces(folder)
    assert "started its own torch.profiler during this profile" in \
        (folder / "rank-0.error.txt").read_text()


def test_asks_are_checked_and_one_at_a_time(one_rank) -> None:
    profiler, _ = one_rank
    for bad in (0, 51, "5", 2.5, True):
        reply = answer(profiler.ask, profiler.run_dir, {"type": "profile", "steps": bad})
        assert reply["type"] == "error", bad
        assert reply["message"] == f"steps must be a whole number between 1 and 50, got {bad!r}"
    assert answer(profiler.ask, profiler.run_dir, {"type": "profile", "steps": 2})["type"] \
        == "ack"
    again = answer(profiler.ask, profiler.run_dir, {"type": "profile"})
    assert again["type"] == "error" and "waits for the ranks' next agreement round" \
        in again["message"]
    profiler.ask.read([list(profiler.ask.row())])
    profiler.after_step(1)
    again = answer(profiler.ask, profiler.run_dir, {"type": "profile"})
    assert again["type"] == "error" and "already being taken" in again["message"]


def test_a_profile_that_cannot_be_written_turns_itself_off_and_training_goes_on(
        one_rank) -> None:
    profiler, said = one_rank
    (profiler.run_dir / PROFILES_DIR).write_text("a file where the folder should be")
    _agree(profiler, 2)
    profiler.after_step(1)  # no exception: training goes on
    assert not profiler.active
    [(kind, fields)] = said
    assert kind == "warning" and fields["cause"] == "profile"
    assert "profiling failed on rank 0" in fields["message"]
