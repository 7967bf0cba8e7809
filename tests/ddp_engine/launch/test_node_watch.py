"""The nodes' beats through a real TCPStore on loopback (as node 0's rendezvous store): who is
heard, who is lost and how it is said, a node that ended not taken for lost, and when a node
cut off from node 0 ends without its agent. The two-host runs are in test_two_hosts.py and
tests/faults/test_host_faults.py."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta

import psutil
import pytest
from torch.distributed import TCPStore

from ddp_engine.common.config import RunConfig
from ddp_engine.launch.node_watch import LOST_S, STUCK_S, NodeWatch
from tests.conftest import free_port


@pytest.fixture
def endpoint() -> Iterator[str]:
    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10),
                      wait_for_workers=False)
    yield f"127.0.0.1:{port}"
    del server


def _watch(endpoint: str, node: int, nnodes: int = 3) -> NodeWatch:
    return NodeWatch(RunConfig(nnodes=nnodes, node_rank=node, rdzv_endpoint=endpoint),
                     f"10.0.0.{node + 1}")


def test_node_0_hears_the_others_and_names_the_silent_one(endpoint: str) -> None:
    node0, node1, node2 = (_watch(endpoint, k) for k in range(3))
    node0.poll_once()
    assert node0.heard == {} and node0.lost() == {}  # nobody heard yet: nobody lost
    node1.poll_once()
    node2.poll_once()
    node0.poll_once()
    assert sorted(node0.heard) == [1, 2] and node0.addresses[1] == "10.0.0.2"
    assert node1.heard.keys() == {0}  # its beat went through: node 0's store answers
    heard = dict(node0.heard)
    node0.poll_once()  # no beat since: the count did not move, the time heard stays
    assert node0.heard == heard
    later = node0.heard[1] + LOST_S + 1  # as if a few seconds had passed:
    node0.heard[2] = later - 1  # node 2 beat again meanwhile, node 1 did not
    assert list(node0.lost(later)) == [1]
    assert node0.lost_text(later) == (
        f"lost node 1 (10.0.0.2): not heard from for {later - node0.heard[1]:.0f} s (the "
        "network between the nodes, or that machine)")
    node1.close("completed")  # it ended: no longer taken for lost
    node0.poll_once()
    assert node0.ended == {1: "completed"} and node0.lost(later) == {}


def test_a_node_without_local_addr_is_named_by_its_address_on_the_route_to_node_0(
        endpoint: str) -> None:
    """No --local-addr: node 1 names itself by the address it reaches node 0's store from (here
    loopback's), not by its host name, which on a cluster rarely says which link was lost."""
    node0 = _watch(endpoint, 0, nnodes=2)
    node1 = NodeWatch(RunConfig(nnodes=2, node_rank=1, rdzv_endpoint=endpoint), None)
    node1.poll_once()
    node0.poll_once()
    assert node1.address == node0.addresses[1] == "127.0.0.1"


def test_a_node_cut_off_from_node_0_ends_once_its_ranks_are_gone(endpoint: str) -> None:
    node1 = _watch(endpoint, 1, nnodes=2)
    node1.poll_once()
    beat = node1.heard[0]
    assert node1.lost(beat + 1) == {} and node1.cut_off(beat + 1, children=list) is None
    lost_at = beat + LOST_S
    assert node1.lost_text(lost_at) == (
        f"lost node 0 (127.0.0.1): its rendezvous store at {endpoint} has not answered for "
        f"{LOST_S:.0f} s (the network between the nodes, or that machine)")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    rank = psutil.Process(child.pid)
    try:  # a rank still running: its collective's timeout will end it, not us
        assert node1.cut_off(lost_at, children=lambda: [rank]) is None
        assert node1.cut_off(lost_at + STUCK_S, children=lambda: [rank]) is None
    finally:
        child.kill()
        child.wait()
    assert node1.cut_off(lost_at, children=lambda: [rank]) is None  # gone: from now
    assert node1.cut_off(lost_at + STUCK_S - 0.1, children=list) is None  # gone, not long yet
    assert node1.cut_off(lost_at + STUCK_S, children=list) == node1.lost_text(
        lost_at + STUCK_S)


def test_node_0_never_ends_early_and_the_thread_beats(endpoint: str) -> None:
    node0, node1 = _watch(endpoint, 0, nnodes=2), _watch(endpoint, 1, nnodes=2)
    node0.heard[1] = time.monotonic() - 60
    assert node0.cut_off(time.monotonic() + 60, children=list) is None
    node1.beat_s = node0.beat_s = 0.05
    for w in (node0, node1):
        w.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
                node0.heard.get(1, 0) > time.monotonic() - 1 and 0 in node1.heard):
            time.sleep(0.05)
        assert node0.lost() == {} and node1.lost() == {}
    finally:
        node0.close()
        node1.close()


def test_a_store_that_is_not_there_is_retried_quietly() -> None:
    watch = _watch(f"127.0.0.1:{free_port()}", 1, nnodes=2)
    with pytest.raises(Exception, match="(?i)connect|timed? ?out"):
        watch.poll_once()
    assert watch.heard == {} and watch.lost() == {}


def test_verdicts_stay_as_they_were_when_the_agent_returned(endpoint: str) -> None:
    """At the end of a run node 0's store goes away: a node failing slowly after that must not
    name node 0 lost for the silence that follows (the launcher freezes the watch as its agent
    returns)."""
    node1 = _watch(endpoint, 1, nnodes=2)
    node1.poll_once()
    node1.freeze()
    assert node1.lost() == {} and node1.lost_text(time.monotonic() + 60) is None
    node0 = _watch(endpoint, 0, nnodes=2)
    node0.poll_once()
    node0.heard[1] = time.monotonic() - LOST_S - 1  # lost before the agent returned: said
    node0.freeze()
    assert list(node0.lost(time.monotonic() + 60)) == [1]
    assert node0.lost_text(time.monotonic() + 60) is not None
