"""Scaling sweep: the throughput math, the plan's checks, and real sweeps of 1 and 2 gloo
processes (completed, stopped by a signal, killed, failed)."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.run_dir import iter_metrics, read_status
from ddp_engine.common.sweep_plan import (
    GROUP_FILE,
    efficiencies,
    is_group,
    line_step_time,
    line_throughput,
    parse_counts,
    plan_sweep,
    read_group,
    result_rows,
    run_throughput,
    steady_median,
)
from ddp_engine.launch import sweep
from ddp_engine.launch.sweep import Sweep
from tests.conftest import processes_mentioning, run_engine, start_engine, wait_for


def _line(*rates: float | None, step_time: float | None = 0.01) -> dict:
    return {"type": "metrics", "step": 5,
            "ranks": [{"rank": r, "samples_per_s": v, "step_time_s": step_time}
                      for r, v in enumerate(rates)]}


def _group(path: Path) -> dict:
    data = read_group(path)
    assert data is not None
    return data


# ------------------------------------------------------------------------------------- math
def test_line_throughput_sums_the_ranks_and_skips_missing_values() -> None:
    assert line_throughput(_line(100.0, 150.0)) == 250.0
    assert line_throughput(_line(100.0, None)) == 100.0
    assert line_throughput(_line(None, None)) is None
    assert line_throughput({"type": "metrics", "ranks": []}) is None


def test_line_step_time_is_the_slowest_ranks() -> None:
    line = _line(1.0, 1.0)
    line["ranks"][1]["step_time_s"] = 0.03
    assert line_step_time(line) == 0.03
    assert line_step_time(_line(1.0, step_time=None)) is None


def test_steady_median_drops_the_warm_up_report_from_three_on() -> None:
    assert steady_median([1.0, 10.0, 20.0, 30.0]) == 20.0
    assert steady_median([1.0, 10.0, 20.0]) == 15.0
    assert steady_median([1.0, 3.0]) == 2.0  # too few reports to spare one
    assert steady_median([5.0]) == 5.0
    assert steady_median([]) is None
    assert steady_median([1.0, None, 4.0]) == 4.0  # a report without a number still counts
    assert steady_median([None, None]) is None


def test_run_throughput_reads_only_metrics_lines() -> None:
    lines = [{"type": "event", "kind": "run_start"}, _line(10.0, 10.0), _line(50.0, 50.0),
             _line(60.0, 60.0), {"type": "event", "kind": "completed"}, _line(70.0, 70.0)]
    assert run_throughput(lines) == (120.0, 0.01)
    assert run_throughput([{"type": "event", "kind": "failed"}]) == (None, None)


def test_efficiency_is_against_the_smallest_count_with_a_throughput() -> None:
    assert efficiencies({1: 100.0, 2: 180.0, 4: 400.0}) == {1: 1.0, 2: 0.9, 4: 1.0}
    assert efficiencies({1: None, 2: 200.0, 4: 300.0}) == {1: None, 2: 1.0, 4: 0.75}
    assert efficiencies({1: None, 2: None}) == {1: None, 2: None}
    assert efficiencies({}) == {}


def test_result_rows_have_per_device_throughput_and_efficiency() -> None:
    rows = result_rows([(1, "completed", 100.0, 0.01, 5), (2, "completed", 150.0, 0.02, 5),
                        (4, "failed", None, None, 0)])
    assert rows[1] == {"nproc": 2, "run": "nproc-2", "state": "completed",
                       "samples_per_s": 150.0, "samples_per_s_per_device": 75.0,
                       "efficiency": 0.75, "step_time_s": 0.02, "reports": 5, "warning": None}
    assert rows[2]["samples_per_s_per_device"] is None and rows[2]["efficiency"] is None
    assert rows[2]["warning"] is None  # nothing measured: its state says why


def test_a_count_with_too_few_reports_or_better_than_linear_scaling_is_flagged() -> None:
    """Issue 30: a sweep reported efficiency 4.07 from two usable reports, without a word."""
    rows = result_rows([(1, "completed", 3843.0, 0.01, 2), (2, "completed", 31309.0, 0.02, 4),
                        (3, "completed", 3000.0, 0.03, 4)])
    assert rows[0]["warning"] == ("only 2 reports: the throughput includes the warm-up; raise "
                                  "--steps (at least 3 reports)")
    assert rows[1]["efficiency"] == pytest.approx(4.07, abs=0.01)
    assert rows[1]["warning"].startswith("efficiency 4.07 is above 1.1, better than linear")
    assert rows[2]["warning"] is None  # 0.26: poor scaling is a result, not a doubt
    assert result_rows([(1, "completed", 10.0, 0.1, 1)])[0]["warning"].startswith(
        "only 1 report: ")


# ------------------------------------------------------------------------------------- plan
def test_default_counts_follow_the_devices() -> None:
    cfg = RunConfig()
    assert plan_sweep(cfg, gpu_count=0, cpu_count=2).counts == [1, 2]
    assert plan_sweep(cfg, gpu_count=0, cpu_count=32).counts == list(range(1, 9))
    assert plan_sweep(RunConfig(nproc=3), gpu_count=0, cpu_count=8).counts == [1, 2, 3]
    on_gpus = plan_sweep(cfg, gpu_count=4, cpu_count=8)
    assert (on_gpus.device, on_gpus.counts, on_gpus.gpus) == ("cuda", [1, 2, 3, 4], [0, 1, 2, 3])
    assert plan_sweep(cfg, [4, 1, 2, 2], gpu_count=0, cpu_count=4).counts == [1, 2, 4]


def test_each_count_gets_its_own_launch_config(tmp_path: Path) -> None:
    cfg = RunConfig(gpus=[1, 3], max_steps=100_000, epochs=3, name="exp", dry_run=True)
    plan = plan_sweep(cfg, steps=7, gpu_count=4, cpu_count=8)
    assert plan.counts == [1, 2]
    sub = plan.subrun_config(2, tmp_path)
    assert (sub.nproc, sub.gpus, sub.device) == (2, [1, 3], "cuda")
    assert (sub.max_steps, sub.epochs, sub.dry_run) == (7, None, False)
    assert sub.run_dir == str(tmp_path / "nproc-2") and sub.name == "exp-nproc-2"
    assert plan.subrun_config(1, tmp_path).gpus == [1]
    # every 10 steps, not paced by time: a count's throughput is a median over its reports
    assert sub.log_every == 10 and cfg.log_every == 0
    given = plan_sweep(RunConfig(log_every=5), [1], gpu_count=0, cpu_count=2)
    assert given.subrun_config(1, tmp_path).log_every == 5
    cpu = plan_sweep(RunConfig(name="n" * 64), gpu_count=0, cpu_count=2)
    name = cpu.subrun_config(1, tmp_path).name
    assert name is not None and len(name) == 64 and name.endswith("-nproc-1")


def test_a_scripts_counts_run_in_the_callers_folder_named_in_each_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "scripts" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)  # where the sweep is started
    plan = plan_sweep(RunConfig(script="../scripts/train.py"), [1], gpu_count=0, cpu_count=2)
    sub = plan.subrun_config(1, tmp_path)
    assert (sub.script, sub.script_cwd) == (str(script), str(project))
    given = plan_sweep(RunConfig(script=str(script), script_cwd=str(tmp_path)), [1],
                       gpu_count=0, cpu_count=2)
    assert given.subrun_config(1, tmp_path).script_cwd == str(tmp_path)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"counts": [0, 1]}, r"^counts: 0 is not allowed; each count must be >= 1$"),
    ({"counts": [1, 3]}, r"^counts: 3 is more than the 2 CPU cores of this machine; allowed: "
                         r"1\.\.2$"),
    ({"cfg": RunConfig(nproc=4)}, r"^nproc: 4 is more than the 2 CPU cores"),
    ({"steps": 0}, r"^steps must be >= 1, got 0$"),
    ({"cfg": RunConfig(resume="x.pt")}, r"^resume: a sweep trains every count from scratch"),
    ({"cfg": RunConfig(device="cuda")}, r"^device: 'cuda' asked for but no GPU is visible"),
    ({"cfg": RunConfig(model="nope.py:f")}, r"^model: plugin file 'nope.py' of 'nope.py:f' "
                                            r"does not exist"),
])
def test_bad_input_is_refused_before_anything_is_written(tmp_path: Path, kwargs: dict,
                                                         message: str) -> None:
    cfg = kwargs.pop("cfg", RunConfig(runs_dir=str(tmp_path / "runs")))
    with pytest.raises(ConfigError, match=message):
        plan_sweep(cfg, gpu_count=0, cpu_count=2, **kwargs)
    assert not (tmp_path / "runs").exists()


def test_counts_above_the_chosen_gpus_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^counts: 3 is more than the 2 GPUs chosen; "
                                          r"allowed: 1\.\.2$"):
        plan_sweep(RunConfig(gpus=[0, 1]), [1, 3], gpu_count=4, cpu_count=8)


def test_a_folder_that_holds_a_sweep_is_not_reused(tmp_path: Path) -> None:
    (tmp_path / GROUP_FILE).write_text("{}")
    with pytest.raises(ConfigError, match=r"^run_dir: '.*' already holds a sweep"):
        plan_sweep(RunConfig(run_dir=str(tmp_path)), gpu_count=0, cpu_count=2)


def test_parse_counts() -> None:
    assert parse_counts("1,2, 4") == [1, 2, 4]
    with pytest.raises(Exception, match=r"counts must be comma-separated process counts such "
                                        r"as 1,2,4; got '1,x'"):
        parse_counts("1,x")
    with pytest.raises(Exception, match=r"counts must list at least one process count"):
        parse_counts(",")


@pytest.mark.parametrize(("args", "message"), [
    (["--counts", "0,1"], "error: counts: 0 is not allowed; each count must be >= 1"),
    (["--counts", "1,4096"], "error: counts: 4096 is more than the"),
    (["--steps", "0"], "error: steps must be >= 1, got 0"),
    (["--counts", "one"], "counts must be comma-separated process counts such as 1,2,4; got "
                          "'one'"),
])
def test_cli_bad_input_exits_2_with_one_error_line(tmp_path: Path, args: list[str],
                                                   message: str) -> None:
    proc = run_engine("sweep", "--runs-dir", str(tmp_path / "runs"), *args, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if "error" in line]) == 1
    assert not (tmp_path / "runs").exists()


def test_read_group_and_is_group(tmp_path: Path) -> None:
    assert not is_group(tmp_path) and read_group(tmp_path) is None
    (tmp_path / GROUP_FILE).write_text('{"kind": "something else"}')
    assert is_group(tmp_path) and read_group(tmp_path) is None
    (tmp_path / GROUP_FILE).write_text('{"kind": "scaling_sweep", "state": "running"}')
    assert read_group(tmp_path) == {"kind": "scaling_sweep", "state": "running"}

# --------------------------------------------------------------------------------- stopping
_STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_launcher_that_ignores_the_stop_is_forced_then_killed_with_its_children(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "FORCE_AFTER_S", 0.0)
    monkeypatch.setattr(sweep, "KILL_AFTER_S", 0.0)
    plan = plan_sweep(RunConfig(run_dir=str(tmp_path / "group"), shutdown_timeout_s=1), [1],
                      gpu_count=0, cpu_count=2)
    out = io.StringIO()
    run = Sweep(plan, out=out)
    run.open()
    (tmp_path / "group" / "nproc-1").mkdir()
    stubborn = subprocess.Popen([sys.executable, "-c", _STUBBORN], stdout=subprocess.PIPE)
    try:
        assert stubborn.stdout is not None
        grandchild = psutil.Process(int(stubborn.stdout.readline()))
        run.child, run.child_nproc, run.pending = stubborn, 1, []  # as if _start had run
        run.signals.append("SIGTERM")
        wait_for(lambda: not run.poll_once(), 30, "the sweep to give up on its launcher")
    finally:
        stubborn.kill()
    assert stubborn.wait(timeout=10) == -signal.SIGKILL
    assert not grandchild.is_running() or grandchild.status() == psutil.STATUS_ZOMBIE
    assert (run.state, run.exit_code()) == ("stopped", 130)
    group = _group(tmp_path / "group")
    assert group["state"] == "stopped"
    assert group["reason"] == ("stop requested (SIGTERM) during nproc-1 (forced: the run did "
                               "not stop in time)")
    assert group["results"][0]["state"] == "failed"  # it never wrote a final state
    assert "did not stop in time: forcing" in out.getvalue()


# -------------------------------------------------------------------------------- real sweeps
def _trained(run: Path) -> bool:
    return any(m.get("type") == "metrics" for m in iter_metrics(run))


@pytest.mark.slow
def test_a_sweep_of_one_and_two_processes_completes(tmp_path: Path) -> None:
    proc = run_engine("sweep", "--model", "mlp", "--dataset", "synthetic", "--counts", "1,2",
                      "--steps", "20", "--log-every", "5", "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (group_dir,) = (tmp_path / "runs").iterdir()
    assert group_dir.name.startswith("mlp-synthetic-sweep-")
    group = _group(group_dir)
    assert group["state"] == "completed" and group["reason"] is None
    assert (group["counts"], group["steps"], group["device"]) == ([1, 2], 20, "cpu")
    assert group["current"] is None and group["ended"] >= group["started"]
    assert group["config"]["model"] == "mlp" and group["config"]["max_steps"] is None
    assert [r["run"] for r in group["results"]] == ["nproc-1", "nproc-2"]
    for row in group["results"]:
        n = row["nproc"]
        run = group_dir / row["run"]
        assert row["state"] == "completed"
        assert row["samples_per_s"] > 0 and row["step_time_s"] > 0
        assert row["samples_per_s_per_device"] == pytest.approx(row["samples_per_s"] / n)
        status = read_status(run)
        assert status is not None and status["state"] == "completed" and status["step"] == 20
        config = json.loads((run / "config.json").read_text())
        assert (config["nproc"], config["max_steps"], config["run_dir"]) == (n, 20, str(run))
        assert (run / "launch.toml").is_file() and (run / "checkpoints" / "last.pt").is_file()
        assert "completed at step 20" in (run / "launcher.log").read_text()
        assert sorted(p.name for p in (run / "ranks").glob("rank-*.json")) == [
            f"rank-{r}.json" for r in range(n)]
    first, second = group["results"]
    assert first["reports"] == second["reports"] == 4  # --log-every 5 of 20 steps
    assert first["warning"] is None
    assert second["warning"] is None or second["efficiency"] > 1.1
    assert first["efficiency"] == 1.0
    assert second["efficiency"] == pytest.approx(
        second["samples_per_s"] / (2 * first["samples_per_s"]))
    assert "nproc 2: " in proc.stdout and "samples/s" in proc.stdout
    assert f"efficiency {second['efficiency']:.2f}" in proc.stdout
    assert str(group_dir) in proc.stdout
    assert not processes_mentioning(str(tmp_path))


def _endless_sweep(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    group_dir = tmp_path / "group"
    proc = start_engine("sweep", "--counts", "1,2", "--steps", "1000000", "--log-every", "5",
                        "--run-dir", str(group_dir), *extra, log=tmp_path / "out.log")
    wait_for(lambda: _trained(group_dir / "nproc-1"), 120, "count 1 to report")
    return proc, group_dir


@pytest.mark.slow
def test_sigterm_stops_the_current_count_and_starts_no_other(tmp_path: Path) -> None:
    proc, group_dir = _endless_sweep(tmp_path)
    try:
        assert _group(group_dir)["current"] == "nproc-1"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=90)
    finally:
        proc.kill()
    out = (tmp_path / "out.log").read_text()
    assert code == 0, out
    group = _group(group_dir)
    assert group["state"] == "stopped", group
    assert group["reason"] == ("stop requested (SIGTERM) during nproc-1; counts not run: 2")
    assert group["current"] is None and group["ended"] is not None
    (row,) = group["results"]
    assert row["nproc"] == 1 and row["state"] == "stopped" and row["samples_per_s"] > 0
    status = read_status(group_dir / "nproc-1")
    assert status is not None and status["state"] == "stopped"
    assert "stop requested" in status["reason"]  # the launcher's agreed stop, not a kill
    assert not (group_dir / "nproc-2").exists()
    assert not processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_a_killed_sweep_takes_its_launcher_along(tmp_path: Path) -> None:
    proc, group_dir = _endless_sweep(tmp_path)
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: not processes_mentioning(str(tmp_path)), 90,
                 "the launcher and its ranks to exit")
    finally:
        for p in processes_mentioning(str(tmp_path)):
            p.kill()
    status = read_status(group_dir / "nproc-1")
    assert status is not None and status["state"] == "stopped", status  # parent-death SIGTERM
    assert not (group_dir / "nproc-2").exists()


@pytest.mark.slow
def test_a_failed_count_fails_the_sweep_and_ends_it(tmp_path: Path) -> None:
    plugin = tmp_path / "broken.py"
    plugin.write_text("def loss(output, target):\n"
                      "    raise RuntimeError('boom from the sweep test')\n")
    group_dir = tmp_path / "group"
    proc = run_engine("sweep", "--counts", "1,2", "--steps", "20", "--loss", f"{plugin}:loss",
                      "--run-dir", str(group_dir))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    group = _group(group_dir)
    assert group["state"] == "failed"
    assert group["reason"].startswith("count 1 (nproc-1) failed: rank 0 ")
    assert "boom from the sweep test" in group["reason"]
    assert [(r["nproc"], r["state"], r["samples_per_s"]) for r in group["results"]] == [
        (1, "failed", None)]
    assert not (group_dir / "nproc-2").exists()
    assert not processes_mentioning(str(tmp_path))

