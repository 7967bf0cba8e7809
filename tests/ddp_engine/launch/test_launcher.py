"""Real 2-process gloo runs through the launcher, as a user starts them from a terminal."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ddp_engine.common.gpus import gpu_leftovers
from ddp_engine.common.run_dir import iter_metrics, rank_log_files, read_rank_files, read_status
from tests.conftest import (
    REPO,
    assert_default_report_steps,
    endless_run,
    engine_env,
    processes_mentioning,
    run_engine,
    two_nodes,
    wait_for,
)

pytestmark = pytest.mark.slow


def metrics(run_dir: Path) -> list[dict]:
    return [m for m in iter_metrics(run_dir) if m["type"] == "metrics"]


def events(run_dir: Path, kind: str) -> list[dict]:
    return [m for m in iter_metrics(run_dir) if m["type"] == "event" and m["kind"] == kind]


def assert_no_process_left(run_dir: Path) -> None:
    left = processes_mentioning(str(run_dir))
    assert not left, f"processes of the run still alive: {[p.pid for p in left]}"
    pids = list((read_status(run_dir) or {}).get("pids", {}).values())
    for pid in pids:
        assert not _alive(pid), f"rank process {pid} is still alive"
    held = gpu_leftovers(pids)  # empty at once where NVML is unavailable
    assert not held, f"NVML still lists processes of the run on a GPU: {held}"


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def mean_loss(m: dict) -> float:
    return sum(r["loss"] for r in m["ranks"]) / len(m["ranks"])


@pytest.fixture(scope="module")
def finished_run(
        tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The README's demo: mlp on synthetic data, 2 CPU processes, 200 steps."""
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    proc = run_engine("launch", "--model", "mlp", "--dataset", "synthetic", "--nproc", "2",
                      "--max-steps", "200", "--run-dir", str(run_dir))
    return run_dir, proc


def test_demo_run_completes_with_falling_loss(finished_run) -> None:
    run_dir, proc = finished_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ms = metrics(run_dir)
    assert_default_report_steps([m["step"] for m in ms], 10, 200)
    assert all(len(m["ranks"]) == 2 and {r["rank"] for r in m["ranks"]} == {0, 1} for m in ms)
    # Every rank reports its own loss, each computed on its own shard: they differ.
    assert any(m["ranks"][0]["loss"] != m["ranks"][1]["loss"] for m in ms)
    first, last = mean_loss(ms[0]), mean_loss(ms[-1])
    assert last < 0.5 * first, (first, last)
    status = read_status(run_dir)
    assert status["state"] == "completed" and status["step"] == 200
    assert status["exit_codes"] == {"0": 0, "1": 0}
    assert "step 200/200" in proc.stdout and "samples/s" in proc.stdout and "ETA" in proc.stdout
    assert_no_process_left(run_dir)


def test_run_folder_holds_config_logs_and_rank_files(finished_run) -> None:
    run_dir, _ = finished_run
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["nproc"] == 2 and cfg["device"] == "cpu" and cfg["run_dir"] == str(run_dir)
    logs = rank_log_files(run_dir)
    assert sorted(logs) == [0, 1]
    assert "rank 1/2 on cpu (backend gloo)" in logs[1].read_text()
    ranks = read_rank_files(run_dir)
    assert {r: d["state"] for r, d in ranks.items()} == {0: "completed", 1: "completed"}
    for m in iter_metrics(run_dir):
        assert isinstance(m["time"], float) and m["type"] in ("metrics", "event")


def test_checkpoint_written_once_by_rank0_and_loads_weights_only(finished_run) -> None:
    run_dir, _ = finished_run
    saved = events(run_dir, "checkpoint_saved")
    assert len(saved) == 1 and saved[0]["step"] == 200
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.pt"]
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == 200 and state["world_size"] == 2 and len(state["rng"]) == 2
    # model.module.state_dict(): no DDP "module." prefix.
    assert state["model"] and not any(k.startswith("module.") for k in state["model"])
    assert state["config"]["max_steps"] == 200


def test_resume_continues_at_the_saved_step(finished_run, tmp_path: Path) -> None:
    src_dir, _ = finished_run
    run_dir = tmp_path / "resumed"
    proc = run_engine("launch", "--nproc", "2", "--max-steps", "230", "--resume",
                      str(src_dir / "checkpoints" / "last.pt"), "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    start = events(run_dir, "run_start")[0]
    assert start["start_step"] == 200
    steps = [m["step"] for m in metrics(run_dir)]
    assert_default_report_steps(steps, 210, 230)
    # The model carried on where it was: the loss did not jump back to its untrained value.
    before = mean_loss(metrics(src_dir)[-1])
    assert mean_loss(metrics(run_dir)[0]) < 2 * before + 0.1
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == 230


def test_a_resume_with_nothing_left_to_train_is_refused(finished_run, tmp_path: Path) -> None:
    """max_steps at or below the checkpoint's step: exit 2 naming max_steps, before any rank
    (from the run folder's status.json, and for a checkpoint moved elsewhere from the file)."""
    src_dir, _ = finished_run
    moved = tmp_path / "elsewhere.pt"
    shutil.copyfile(src_dir / "checkpoints" / "last.pt", moved)
    for ckpt in (src_dir / "checkpoints" / "last.pt", moved):
        proc = run_engine("launch", "--nproc", "2", "--max-steps", "200", "--resume", str(ckpt),
                          "--run-dir", str(tmp_path / "resumed"))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.strip() == ("error: max_steps: the checkpoint is at step 200 and "
                                       "max_steps is 200, so there is nothing left to train; "
                                       "raise max_steps above 200")
        assert not (tmp_path / "resumed").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_mid_run_stops_all_ranks_at_one_step(tmp_path: Path, sig: int) -> None:
    """SIGTERM (from a script or the app) and SIGINT (Ctrl+C) both give the agreed stop."""
    with endless_run(tmp_path) as (proc, run_dir):
        wait_for(lambda: len(metrics(run_dir)) >= 2, 120, "training to report twice")
        proc.send_signal(sig)
        assert proc.wait(timeout=90) == 0, (tmp_path / "out.log").read_text()
    status = read_status(run_dir)
    assert status["state"] == "stopped", status
    ranks = read_rank_files(run_dir)
    assert {d["state"] for d in ranks.values()} == {"stopped"}
    assert len({d["step"] for d in ranks.values()}) == 1  # the same step on every rank
    step = ranks[0]["step"]
    assert status["step"] == step
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == step
    assert events(run_dir, "stopped")[0]["step"] == step
    assert_no_process_left(run_dir)


def test_stop_during_start_up_leaves_nothing(tmp_path: Path) -> None:
    with endless_run(tmp_path) as (proc, run_dir):
        wait_for(lambda: (read_status(run_dir) or {}).get("state") == "starting", 60,
                 "the launcher to write status.json")
        proc.send_signal(signal.SIGTERM)  # before any rank reported in
        assert proc.wait(timeout=90) in (0, 130), (tmp_path / "out.log").read_text()
    assert read_status(run_dir)["state"] == "stopped"
    assert_no_process_left(run_dir)


def test_worker_runs_under_plain_torchrun(tmp_path: Path) -> None:
    """The cluster path: torchrun -m ddp_engine.worker --config run.toml, no launcher."""
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'model = "mlp"\nmax_steps = 20\nruns_dir = "{tmp_path / "runs"}"\n'
                   'device = "cpu"\n[dataset]\nname = "synthetic"\nnum_samples = 512\n')
    env = engine_env()
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "ddp_engine.worker", "--config",
                           str(cfg)], capture_output=True, text=True, timeout=240, env=env,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()  # one folder, agreed on by both ranks
    assert run_dir.name.startswith("mlp-synthetic-")
    assert [m["step"] for m in metrics(run_dir)] == [10, 20]
    assert (run_dir / "checkpoints" / "last.pt").is_file()


def test_digits_convnet_grad_accum_and_periodic_checkpoints(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--model", "convnet", "--dataset", "digits", "--nproc", "2",
                      "--max-steps", "40", "--batch-size", "16", "--grad-accum", "2",
                      "--checkpoint-every", "20", "--keep-step-checkpoints", "--eval-every",
                      "20", "--lr", "0.003", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["last.pt", "step-20.pt", "step-40.pt"]
    evals = events(run_dir, "eval")
    assert [e["step"] for e in evals] == [20, 40]
    assert evals[-1]["val_accuracy"] > 0.5  # real handwritten digits, learned in 40 steps
    assert_no_process_left(run_dir)


def test_gpt_tiny_on_a_text_file(tmp_path: Path) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--model", "gpt-tiny", "--dataset", f"text:{text}", "--nproc",
                      "2", "--max-steps", "30", "--batch-size", "8", "--lr", "0.003",
                      "--dataset-arg", "block_size=32", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ms = metrics(run_dir)
    assert mean_loss(ms[-1]) < mean_loss(ms[0])


def test_input_only_the_ranks_can_check_fails_the_run_with_one_line(tmp_path: Path) -> None:
    """A model argument the model does not take is found when rank code builds the model."""
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--nproc", "2", "--max-steps", "5", "--model-arg", "width=3",
                      "--run-dir", str(run_dir))
    assert proc.returncode == 1
    reason = read_status(run_dir)["reason"]
    assert "ConfigError: model_args for mlp: " in reason and "'width'" in reason
    assert "\n" not in reason and "Traceback" not in reason
    assert_no_process_left(run_dir)


def _log(tmp_path: Path) -> str:
    return "\n".join(f"--- node {k}\n" + (tmp_path / f"node-{k}.log").read_text()
                     for k in (0, 1))


def test_a_stop_at_rank_0_stops_both_nodes_at_one_step(tmp_path: Path) -> None:
    """The app's Stop (here the CLI's, the same stop command over the telemetry socket) goes
    to global rank 0 on node 0; every rank on both nodes stops after the same step."""
    with two_nodes(tmp_path, "--log-every", "5") as (procs, run_dir):
        wait_for(lambda: len(metrics(run_dir)) >= 2, 180, "both nodes to train")
        stop = run_engine("stop", str(run_dir), "--timeout", "120")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        codes = [p.wait(timeout=120) for p in procs]
    assert codes == [0, 0], _log(tmp_path)
    ranks = {**read_rank_files(run_dir), **read_rank_files(run_dir / "node-1")}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert {d["state"] for d in ranks.values()} == {"stopped"}
    assert len({d["step"] for d in ranks.values()}) == 1, ranks
    step = ranks[0]["step"]
    for folder in (run_dir, run_dir / "node-1"):
        status = read_status(folder)
        assert status["state"] == "stopped"
        # the reason names the viewer that stopped it, the same on both nodes
        assert re.fullmatch(r"stop requested \(stop command from python -m ddp_engine stop "
                            rf"\(pid \d+ on \S+\)\); all ranks stopped at step {step}",
                            status["reason"]), status
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == step
    assert_no_process_left(run_dir)


@pytest.mark.parametrize(("node", "sig"), [(0, signal.SIGTERM)])
def test_a_signal_to_either_launcher_stops_both_nodes_at_one_step(tmp_path: Path, node: int,
                                                                  sig: int) -> None:
    """SIGTERM (the app's escalation) on node 0, 2 ranks a node: every rank stops after the
    same step and both launchers end at once (no node left waiting at torchrun's exit barrier
    for one that left on the signal). Ctrl+C on node 1: across two hosts, in
    test_two_hosts.py."""
    with two_nodes(tmp_path, "--log-every", "5") as (procs, run_dir):
        wait_for(lambda: len(metrics(run_dir)) >= 2, 180, "both nodes to train")
        procs[node].send_signal(sig)
        codes = [p.wait(timeout=90) for p in procs]
    assert codes == [0, 0], _log(tmp_path)
    ranks = {**read_rank_files(run_dir), **read_rank_files(run_dir / "node-1")}
    assert {d["state"] for d in ranks.values()} == {"stopped"}
    assert len({d["step"] for d in ranks.values()}) == 1, ranks
    name = signal.Signals(sig).name
    for n, folder in enumerate((run_dir, run_dir / "node-1")):
        # The launcher that got the signal names it; the other node says whose launcher did.
        asker = f"{name} to" if n == node else "a stop signal to"
        assert read_status(folder)["reason"] == (
            f"stop requested ({asker} node {node}'s launcher); all ranks stopped at step "
            f"{ranks[0]['step']}")
        assert read_status(folder).get("stop_signal") == (name if n == node else None)
    assert_no_process_left(run_dir)


def test_two_nodes_with_one_node_rank_fail_naming_it(tmp_path: Path) -> None:
    """Both launchers say --node-rank 0 (Start pressed in the app on both machines): node 0
    hosts the rendezvous store, so the second cannot (its port is taken: at once, exit 2,
    when it sees that before starting; else its torchrun fails, exit 1), naming --node-rank;
    the first waits for a node 1 that never comes and fails at the join timeout
    (--dist-timeout-s), naming node 1. Nothing is left."""
    from tests.conftest import free_port, start_engine

    common = ("launch", "--nproc", "2", "--max-steps", "5", "--nnodes", "2", "--node-rank", "0",
              "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--dist-timeout-s", "15")
    procs = [start_engine(*common, "--run-dir", str(tmp_path / f"run-{k}"),
                          log=tmp_path / f"node-{k}.log") for k in (0, 1)]
    try:
        codes = [p.wait(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert sorted(codes) in ([1, 1], [1, 2]), _log(tmp_path)
    logs = [(tmp_path / f"node-{k}.log").read_text() for k in (0, 1)]
    second = [log for log in logs if "also given --node-rank 0" in log
              or "another node of this run given --node-rank 0 too" in log]
    assert len(second) == 1, _log(tmp_path)
    waited = [log for log in logs if "rendezvous: node 1 did not join within 15 s" in log]
    assert len(waited) == 1, _log(tmp_path)
    for k in (0, 1):
        assert_no_process_left(tmp_path / f"run-{k}")


def test_a_failed_run_reads_nccl_flight_recorder_dumps_into_its_reason(tmp_path: Path) -> None:
    """What NCCL's watchdog dumps into ranks/ at a collective timeout (written here in its
    format: this machine has no NCCL) becomes the failed run's verdict in status.json."""
    import os
    import pickle

    from tests.conftest import FAULTY

    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    for rank, last in ((0, 5), (1, 4)):  # rank 1 never joined all_reduce #5
        entries = [{"process_group": ("0", "default_pg"), "collective_seq_id": s,
                    "profiling_name": "nccl:all_reduce", "is_p2p": False,
                    "state": "started" if s == 5 else "completed",
                    "time_created_ns": int((time.time() - 30) * 1e9),
                    "time_discovered_started_ns": int((time.time() - 30) * 1e9)}
                   for s in range(1, last + 1)]
        dump = run_dir / "ranks" / f"nccl_trace_rank_{rank}"
        dump.write_bytes(pickle.dumps({"version": "2.4", "pg_config": {}, "entries": entries}))
        os.utime(dump)
    proc = run_engine("launch", "--nproc", "2", "--max-steps", "50", "--loss",
                      f"{FAULTY}:raise_on_rank1", "--run-dir", str(run_dir))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    status = read_status(run_dir)
    assert status["state"] == "failed"
    assert re.fullmatch(r"rank 1 never joined all_reduce #5; rank 0 waited in it for \d+ s",
                        status["flight_recorder"])
    assert status["reason"].endswith("; NCCL's flight recorder: " + status["flight_recorder"])
