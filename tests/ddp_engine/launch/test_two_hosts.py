"""Two hosts for real (issue 32): the launcher on each of two network namespaces joined by a
veth pair (tests/netns.py), with their own addresses and loopbacks, started as users start
them on two machines: ``launch --nnodes 2 --node-rank K --rdzv-endpoint NODE0:PORT
--local-addr ADDRESS`` (gloo on the veth: GLOO_SOCKET_IFNAME)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_engine.common.run_dir import read_rank_files, read_status
from tests.conftest import engine_env, wait_for
from tests.ddp_engine.launch.test_launcher import events, metrics
from tests.netns import ADDRESSES, Host, two_hosts

pytestmark = pytest.mark.slow
PORT = 29400
"""The rendezvous port on node0's address (each namespace has its own ports)."""


def launch_on(host: Host, node: int, run_dir: Path, log: Path, *extra: str,
            ) -> subprocess.Popen[bytes]:
    return host.popen([sys.executable, "-m", "ddp_engine", "launch", "--device", "cpu",
                       "--nproc", "1", "--nnodes", "2", "--node-rank", str(node),
                       "--rdzv-endpoint", f"{ADDRESSES[0]}:{PORT}", "--local-addr",
                       host.address, "--run-dir", str(run_dir), "--log-every", "5", *extra],
                      log, engine_env())


def logs(tmp_path: Path) -> str:
    return "\n".join(f"--- node {k}\n" + (tmp_path / f"node-{k}.log").read_text()
                     for k in (0, 1) if (tmp_path / f"node-{k}.log").exists())


def test_two_hosts_train_as_one_run_with_node_0_hosting_the_rendezvous(tmp_path: Path) -> None:
    """Node 0's host name does not resolve to 10.251.7.1: torchrun alone would let no node host
    the rendezvous store and both would fail to connect; the launcher says node 0 hosts it."""
    run_dir = tmp_path / "run"
    with two_hosts() as hosts:
        procs = [launch_on(h, k, run_dir, tmp_path / f"node-{k}.log", "--max-steps", "30")
                 for k, h in enumerate(hosts)]
        try:
            codes = [p.wait(timeout=240) for p in procs]
        finally:
            for p in procs:
                p.kill()
        assert codes == [0, 0], logs(tmp_path)
        assert [h.pids() for h in hosts] == [[], []]  # nothing left in either host
    node1 = run_dir / "node-1"
    assert read_status(run_dir)["state"] == read_status(node1)["state"] == "completed"
    assert sorted(read_rank_files(run_dir)) == [0] and sorted(read_rank_files(node1)) == [1]
    start = events(run_dir, "run_start")[0]
    assert start["world_size"] == 2 and start["nnodes"] == 2
    last = metrics(run_dir)[-1]
    assert last["step"] == 30 and [r["node"] for r in last["ranks"]] == [0, 1]
    assert "is_host=1" in read_status(run_dir)["command"]
    assert "is_host=0" in read_status(node1)["command"]
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == 30


def test_sigterm_to_node_1s_launcher_stops_both_hosts_at_one_step(tmp_path: Path) -> None:
    """As scancel or docker stop on the second machine: every rank on both hosts stops after
    the same step, rank 0 (on node 0) saves, and nothing is left in either host."""
    run_dir = tmp_path / "run"
    with two_hosts() as hosts:
        procs = [launch_on(h, k, run_dir, tmp_path / f"node-{k}.log", "--max-steps", "1000000")
                 for k, h in enumerate(hosts)]
        try:
            wait_for(lambda: len(metrics(run_dir)) >= 2 or any(p.poll() is not None
                                                                 for p in procs),
                     180, "both hosts to train")
            assert all(p.poll() is None for p in procs), logs(tmp_path)
            procs[1].send_signal(signal.SIGTERM)
            codes = [p.wait(timeout=120) for p in procs]
        finally:
            for p in procs:
                p.kill()
        assert codes == [0, 0], logs(tmp_path)
        assert [h.pids() for h in hosts] == [[], []]
    ranks = {**read_rank_files(run_dir), **read_rank_files(run_dir / "node-1")}
    assert {d["state"] for d in ranks.values()} == {"stopped"}
    assert len({d["step"] for d in ranks.values()}) == 1, ranks
    step = ranks[0]["step"]
    for folder in (run_dir, run_dir / "node-1"):
        assert read_status(folder)["state"] == "stopped"
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == step


def test_node_0_given_an_address_it_does_not_have_is_told_before_starting(
        tmp_path: Path) -> None:
    """--rdzv-endpoint naming node 1's address on node 0: one line naming the field and the
    fix, exit 2, nothing started."""
    with two_hosts() as hosts:
        got = hosts[0].run([sys.executable, "-m", "ddp_engine", "launch", "--device", "cpu",
                            "--nproc", "1", "--nnodes", "2", "--node-rank", "0",
                            "--rdzv-endpoint", f"{ADDRESSES[1]}:{PORT}", "--run-dir",
                            str(tmp_path / "run")], engine_env())
    assert got.returncode == 2, got.stdout + got.stderr
    assert (f"rdzv_endpoint: {ADDRESSES[1]} is not an address of this machine, and node 0 "
            "(this one) hosts the rendezvous there: give node 0's own address") in got.stderr
    assert ADDRESSES[0] in got.stderr  # the addresses it has, to choose from
    assert not (tmp_path / "run").exists()
