"""Two hosts for real (issue 32): network namespaces joined by a veth pair (tests/netns.py),
one launcher and one CPU rank on each; a node lost before the run starts, and during it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch

from ddp_engine.common.run_dir import read_rank_files, read_status
from tests.conftest import wait_for
from tests.ddp_engine.launch.test_launcher import metrics
from tests.ddp_engine.launch.test_two_hosts import PORT, launch_on, logs
from tests.faults.conftest import fault_case
from tests.netns import ADDRESSES, two_hosts

pytestmark = pytest.mark.slow


@fault_case("Two hosts (network namespaces); node 1 never started",
            "node 0 waits for it --dist-timeout-s (10 s here) at the rendezvous, then fails "
            "naming node 1 and what to check (address, port, firewall); nothing left")
def test_a_node_that_never_arrives_fails_node_0_naming_it(tmp_path: Path,
                                                          observed: list[str]) -> None:
    run_dir = tmp_path / "run"
    with two_hosts() as hosts:
        started = time.monotonic()
        proc = launch_on(hosts[0], 0, run_dir, tmp_path / "node-0.log", "--max-steps", "30",
                         "--dist-timeout-s", "10")
        try:
            code = proc.wait(timeout=120)
        finally:
            proc.kill()
        took = time.monotonic() - started
        assert code == 1, logs(tmp_path)
        assert hosts[0].pids() == []
    status = read_status(run_dir)
    assert status["state"] == "failed"
    assert status["reason"].startswith(
        f"rendezvous: node 1 did not join within 10 s (--dist-timeout-s) at "
        f"{ADDRESSES[0]}:{PORT}: check that it was started with --nnodes 2"), status
    assert 10 <= took < 60, took
    observed.append(f"failed {took:.1f} s after node 0's launcher started: {status['reason']}")


@fault_case("Two hosts (network namespaces, 1 rank each); node 1's launcher SIGKILLed mid-run",
            "node 1's rank notices (parent-death signal); both ranks agree to stop at one "
            "step; node 0 ends failed naming node 1's launcher; the checkpoint loads; nothing "
            "left in either host")
def test_killing_node_1s_launcher_on_its_host_fails_the_run(tmp_path: Path,
                                                            observed: list[str]) -> None:
    run_dir = tmp_path / "run"
    with two_hosts() as hosts:
        procs = [launch_on(h, k, run_dir, tmp_path / f"node-{k}.log", "--max-steps",
                           "1000000") for k, h in enumerate(hosts)]
        try:
            wait_for(lambda: len(metrics(run_dir)) >= 2 or any(p.poll() is not None
                                                                 for p in procs),
                     180, "both hosts to train")
            assert all(p.poll() is None for p in procs), logs(tmp_path)
            killed = time.monotonic()
            procs[1].send_signal(signal.SIGKILL)
            assert procs[0].wait(timeout=90) == 1, logs(tmp_path)
            wait_for(lambda: not hosts[0].pids() and not hosts[1].pids(), 30,
                     "nothing left in either host")
            took = time.monotonic() - killed
        finally:
            for p in procs:
                p.kill()
    ranks = {**read_rank_files(run_dir), **read_rank_files(run_dir / "node-1")}
    assert {d["state"] for d in ranks.values()} == {"failed"}, ranks
    step = ranks[0]["step"]
    assert {d["step"] for d in ranks.values()} == {step}
    status = read_status(run_dir)
    assert status["reason"] == (f"the launcher of node 1 died; every rank stopped after step "
                                f"{step}"), status["reason"]
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == step
    observed.append(f"node 0 failed and nothing was left in either host {took:.1f} s after "
                    f"the kill: {status['reason']}")
