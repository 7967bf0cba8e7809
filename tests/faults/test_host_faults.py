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
from tests.ddp_engine.launch.test_two_hosts import (
    PORT,
    launch_on,
    logs,
    training_on_two_hosts,
)
from tests.faults.conftest import fault_case
from tests.netns import ADDRESSES, link, two_hosts

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
    with training_on_two_hosts(tmp_path) as (hosts, procs, run_dir):
        killed = time.monotonic()
        procs[1].send_signal(signal.SIGKILL)
        assert procs[0].wait(timeout=90) == 1, logs(tmp_path)
        wait_for(lambda: not hosts[0].pids() and not hosts[1].pids(), 30,
                 "nothing left in either host")
        took = time.monotonic() - killed
    ranks = {**read_rank_files(run_dir), **read_rank_files(run_dir / "node-1")}
    assert sorted(ranks) == [0, 1] and {d["state"] for d in ranks.values()} == {"failed"}, ranks
    step = ranks[0]["step"]
    assert {d["step"] for d in ranks.values()} == {step}
    status = read_status(run_dir)
    assert status["reason"] == (f"the launcher of node 1 died; every rank stopped after step "
                                f"{step}"), status["reason"]
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == step
    observed.append(f"node 0 failed and nothing was left in either host {took:.1f} s after "
                    f"the kill: {status['reason']}")


@fault_case("Two hosts (network namespaces, 1 rank each); the link between them cut mid-run",
            "each node's rank fails in its collective after --dist-timeout-s (10 s here); "
            "each launcher ends failed naming the other node as lost (node 1's without "
            "waiting for torchrun's agent, which hangs on node 0's store); the last "
            "checkpoint loads; nothing left in either host")
def test_a_partition_fails_both_nodes_naming_the_lost_one(tmp_path: Path,
                                                          observed: list[str]) -> None:
    # Node 1 without --local-addr (gloo's interface set by hand): node 0 still names it by
    # its address, the one node 1 reaches node 0 from.
    with training_on_two_hosts(tmp_path, "--dist-timeout-s", "10", "--checkpoint-every",
                               "5", node1_local_addr=False) as (hosts, procs, run_dir):
        cut = time.monotonic()
        link(hosts, up=False)
        took: dict[int, float] = {}

        def ended() -> bool:
            for k, p in enumerate(procs):
                if k not in took and p.poll() is not None:
                    took[k] = time.monotonic() - cut
            return len(took) == 2

        wait_for(ended, 150, "both nodes to end")
        assert [p.returncode for p in procs] == [1, 1], logs(tmp_path)
        assert [h.pids() for h in hosts] == [[], []]
    reasons = [read_status(folder)["reason"] for folder in (run_dir, run_dir / "node-1")]
    assert reasons[0].startswith(f"lost node 1 ({ADDRESSES[1]}): not heard from for "), reasons
    assert "; rank 0 failed: " in reasons[0]
    assert reasons[1].startswith(f"lost node 0 ({ADDRESSES[0]}): its rendezvous store at "
                                 f"{ADDRESSES[0]}:{PORT} has not answered for "), reasons
    assert "; rank 1 raised " in reasons[1]
    assert [read_status(f)["state"] for f in (run_dir, run_dir / "node-1")] == ["failed"] * 2
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert saved["step"] >= 5 and saved["step"] % 5 == 0
    assert all(10 <= t < 90 for t in took.values()), took
    observed.append(f"node 0 failed {took[0]:.1f} s after the cut: {reasons[0]}")
    observed.append(f"node 1 failed {took[1]:.1f} s after the cut: {reasons[1]}")
