"""Two hosts for real (issue 32): the launcher on each of two network namespaces joined by a
veth pair (tests/netns.py), with their own addresses and loopbacks, started as users start
them on two machines: ``launch --nnodes 2 --node-rank K --rdzv-endpoint NODE0:PORT
--local-addr ADDRESS`` (which puts gloo on the veth)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ddp_engine.common.cluster import node_script
from ddp_engine.common.config import RunConfig
from ddp_engine.common.protocol import read_monitor_file
from ddp_engine.common.run_dir import rank_log_files, read_rank_files, read_status
from tests.conftest import engine_env, wait_for
from tests.ddp_engine.launch.test_launcher import events, metrics
from tests.netns import ADDRESSES, Host, two_hosts

pytestmark = pytest.mark.slow
PORT = 29400
"""The rendezvous port on node0's address (each namespace has its own ports)."""
MONITOR_PORT = 29600
"""Rank 0's telemetry port, where the other host attaches."""


def launch_on(host: Host, node: int, run_dir: Path, log: Path, *extra: str,
              endpoint: str = f"{ADDRESSES[0]}:{PORT}", nproc: int = 1,
              local_addr: bool = True) -> subprocess.Popen[bytes]:
    """The launcher of node ``node`` in ``host``, given --local-addr, or without it gloo's
    interface set by hand (GLOO_SOCKET_IFNAME), as a user without --local-addr does."""
    where = (["--local-addr", host.address] if local_addr else [])
    env = engine_env() if local_addr else {**engine_env(), "GLOO_SOCKET_IFNAME": host.interface}
    return host.popen([sys.executable, "-m", "ddp_engine", "launch", "--device", "cpu",
                       "--nproc", str(nproc), "--nnodes", "2", "--node-rank", str(node),
                       "--rdzv-endpoint", endpoint, *where, "--run-dir", str(run_dir),
                       "--log-every", "5", *extra], log, env)


def logs(tmp_path: Path) -> str:
    return "\n".join(f"--- node {k}\n" + (tmp_path / f"node-{k}.log").read_text()
                     for k in (0, 1) if (tmp_path / f"node-{k}.log").exists())


def test_two_hosts_train_as_one_run_with_node_0_hosting_the_rendezvous(tmp_path: Path) -> None:
    """Node 0's host name does not resolve to 10.251.7.1: torchrun alone would let no node host
    the rendezvous store and both would fail to connect; the launcher says node 0 hosts it.
    Node 0 is started with the launcher, node 1 with the script `cluster` exports for it (in
    a folder of its own, RANKSCOPE_PYTHON pointing at Rankscope, given --local-addr as its
    comment says for a host with several interfaces: gloo's interface follows from it). Two
    ranks on each node: node 1's are ranks 2 and 3."""
    run_dir = tmp_path / "run"
    cfg = RunConfig(device="cpu", nproc=2, nnodes=2, rdzv_endpoint=f"{ADDRESSES[0]}:{PORT}",
                    max_steps=30, log_every=5)
    node1_dir = tmp_path / "node1"
    node1_dir.mkdir()
    (node1_dir / "node-1.sh").write_text(node_script(cfg, 1))
    with two_hosts() as hosts:
        procs = [launch_on(hosts[0], 0, run_dir, tmp_path / "node-0.log", "--max-steps", "30",
                           nproc=2),
                 hosts[1].popen(["bash", "-c", f"cd {node1_dir} && bash node-1.sh "
                                 f"--local-addr {hosts[1].address}"], tmp_path / "node-1.log",
                                {**engine_env(), "RANKSCOPE_PYTHON": sys.executable})]
        try:
            codes = [p.wait(timeout=240) for p in procs]
        finally:
            for p in procs:
                p.kill()
        assert codes == [0, 0], logs(tmp_path)
        assert [h.pids() for h in hosts] == [[], []]  # nothing left in either host
    (node1,) = (node1_dir / "runs").glob("mlp-synthetic-node-1-*")
    assert read_status(run_dir)["state"] == read_status(node1)["state"] == "completed"
    assert sorted(read_rank_files(run_dir)) == [0, 1]
    assert sorted(read_rank_files(node1)) == [2, 3]
    assert {d["local_rank"] for d in read_rank_files(node1).values()} == {0, 1}
    assert sorted(rank_log_files(node1)) == [2, 3]  # torchrun's logs, by local rank
    start = events(run_dir, "run_start")[0]
    assert start["world_size"] == 4 and start["nnodes"] == 2
    # Global rank 0 writes the metrics, of every rank of both nodes, and the checkpoint.
    last = metrics(run_dir)[-1]
    assert last["step"] == 30
    assert [(r["rank"], r["node"], r["local_rank"]) for r in last["ranks"]] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert all(r["host"] for r in last["ranks"])
    assert not (node1 / "metrics.jsonl").exists()
    assert list((node1 / "checkpoints").iterdir()) == []
    assert "node 1: ranks 2, 3 at step" in (tmp_path / "node-1.log").read_text()
    assert "is_host=1" in read_status(run_dir)["command"]
    assert "is_host=0" in read_status(node1)["command"]
    assert f"--local-addr {ADDRESSES[1]}" in read_status(node1)["command"]
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == 30


@contextlib.contextmanager
def training_on_two_hosts(tmp_path: Path, *extra: str, node1_local_addr: bool = True,
                          ) -> Iterator[tuple[tuple[Host, Host], list[subprocess.Popen[bytes]],
                                              Path]]:
    """Both hosts' launchers started (open-ended runs) and training: (hosts, launchers, run
    folder); node 1's without --local-addr where ``node1_local_addr`` is False. Both launchers
    killed on the way out, whatever happened."""
    run_dir = tmp_path / "run"
    with two_hosts() as hosts:
        procs = [launch_on(h, k, run_dir, tmp_path / f"node-{k}.log", "--max-steps", "1000000",
                           *extra, local_addr=k == 0 or node1_local_addr)
                 for k, h in enumerate(hosts)]
        try:
            wait_for(lambda: len(metrics(run_dir)) >= 2 or any(p.poll() is not None
                                                                 for p in procs),
                     180, "both hosts to train")
            assert all(p.poll() is None for p in procs), logs(tmp_path)
            yield hosts, procs, run_dir
        finally:
            for p in procs:
                p.kill()


def stopped_at_one_step(run_dir: Path) -> int:
    """Every rank of both nodes stopped after the same step, rank 0's checkpoint at it: the
    step."""
    ranks = {**read_rank_files(run_dir), **read_rank_files(run_dir / "node-1")}
    assert {d["state"] for d in ranks.values()} == {"stopped"}, ranks
    assert len({d["step"] for d in ranks.values()}) == 1, ranks
    step = int(ranks[0]["step"])
    for folder in (run_dir, run_dir / "node-1"):
        assert read_status(folder)["state"] == "stopped"
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == step
    return step


@pytest.mark.parametrize("how", ["ddp_engine stop", "Ctrl+C"])
def test_a_stop_on_node_1_stops_both_hosts_at_one_step(tmp_path: Path, how: str) -> None:
    """As a user on the second machine types it: ``ddp_engine stop`` (node 1's folder has no
    telemetry: the command signals node 1's launcher, as scancel or docker stop would), or
    Ctrl+C in node 1's terminal (SIGINT to its launcher). Every rank on both hosts stops after
    the same step, rank 0 (on node 0) saves, nothing is left in either; each node's reason
    says who asked."""
    with training_on_two_hosts(tmp_path) as (hosts, procs, run_dir):
        if how == "Ctrl+C":
            procs[1].send_signal(signal.SIGINT)
        else:
            got = hosts[1].run([sys.executable, "-m", "ddp_engine", "stop",
                                str(run_dir / "node-1")], engine_env())
        codes = [p.wait(timeout=120) for p in procs]
        assert codes == [0, 0], logs(tmp_path)
        assert [h.pids() for h in hosts] == [[], []]
    step = stopped_at_one_step(run_dir)
    if how == "Ctrl+C":
        for folder, asker in ((run_dir, "a stop signal to"), (run_dir / "node-1", "SIGINT to")):
            assert read_status(folder)["reason"] == (
                f"stop requested ({asker} node 1's launcher); all ranks stopped at step {step}")
    else:
        assert got.returncode == 0 and got.stdout.startswith(f"stopped at step {step}"), got


def test_the_app_on_node_1_attaches_to_rank_0_on_node_0_and_stops_the_run(
        tmp_path: Path) -> None:
    """Rank 0's telemetry opened to the other machine (--monitor-host, node 0's address): the
    app's remote attach from node 1 with the run's token (a wrong token refused), its charts'
    reports, and its Stop: both hosts stop at one step."""
    with training_on_two_hosts(tmp_path, "--monitor-host", ADDRESSES[0], "--monitor-port",
                               str(MONITOR_PORT)) as (hosts, procs, run_dir):
        monitor = read_monitor_file(run_dir)
        assert (monitor["host"], monitor["listen"], monitor["port"]) == (
            ADDRESSES[0], ADDRESSES[0], MONITOR_PORT)
        shown = hosts[0].run([sys.executable, "-m", "ddp_engine", "status", str(run_dir)],
                             engine_env())
        assert (f"from another machine: in the app, Attach to remote rank 0, {ADDRESSES[0]}, "
                f"{MONITOR_PORT}, the token") in shown.stdout, shown
        got = hosts[1].run([sys.executable, "-m", "tests.ddp_engine.launch.remote_viewer",
                            ADDRESSES[0], str(MONITOR_PORT), monitor["token"]],
                           {**engine_env(), "QT_QPA_PLATFORM": "offscreen"}, timeout=200)
        assert got.returncode == 0, got.stdout + got.stderr
        codes = [p.wait(timeout=120) for p in procs]
        assert codes == [0, 0], logs(tmp_path)
        assert [h.pids() for h in hosts] == [[], []]
    seen = json.loads(got.stdout.splitlines()[-1])
    refused, _box = seen["refused"]
    assert refused.startswith(f"the server at {ADDRESSES[0]}:{MONITOR_PORT} closed the "
                              "connection instead of welcoming us (wrong token"), refused
    assert seen["taken"] is None and seen["world_size"] == 2 and len(seen["steps"]) >= 2
    step = stopped_at_one_step(run_dir)
    assert seen["finished"]["state"] == "stopped" and seen["finished"]["step"] == step, seen
    assert seen["finished"]["remote"] == f"{ADDRESSES[0]}:{MONITOR_PORT}"
    assert "the Rankscope window" in read_status(run_dir)["reason"]


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


def test_node_1_with_a_wrong_address_is_told_before_or_at_once(tmp_path: Path) -> None:
    """--local-addr that is node 0's: exit 2 before starting, naming the field. An endpoint no
    node has: said within seconds (torchrun alone says nothing for two minutes), and the
    node fails at its --dist-timeout-s naming what to check."""
    with two_hosts() as hosts:
        wrong = hosts[1].run([sys.executable, "-m", "ddp_engine", "launch", "--device", "cpu",
                              "--nproc", "1", "--nnodes", "2", "--node-rank", "1",
                              "--rdzv-endpoint", f"{ADDRESSES[0]}:{PORT}", "--local-addr",
                              ADDRESSES[0], "--run-dir", str(tmp_path / "a")], engine_env())
        assert wrong.returncode == 2, wrong
        assert wrong.stderr.startswith(f"error: local_addr: {ADDRESSES[0]} is not an address of "
                                       "this machine (node 1): give this node's own address")
        assert ADDRESSES[1] in wrong.stderr and not (tmp_path / "a").exists()
        nobody = "10.251.7.9"
        started = time.monotonic()
        proc = launch_on(hosts[1], 1, tmp_path / "b", tmp_path / "node-1.log",
                         "--dist-timeout-s", "5", endpoint=f"{nobody}:{PORT}")
        try:
            code = proc.wait(timeout=60)
        finally:
            proc.kill()
        took = time.monotonic() - started
        assert hosts[1].pids() == []
    out = (tmp_path / "node-1.log").read_text()
    assert code == 1, out
    assert re.search(rf"node 0's rendezvous store at {nobody}:{PORT} cannot be reached from "
                     r"here \((No route to host|TimeoutError)\): check the address, the "
                     r"network and the firewall; waiting up to 5 s", out), out
    reason = read_status(tmp_path / "b" / "node-1")["reason"]
    assert reason.startswith(f"rendezvous: node 1 could not reach node 0's rendezvous store at "
                             f"{nobody}:{PORT} within 5 s"), reason
    assert took < 30, took
