"""Node 0's rendezvous endpoint checked before it starts, and a failed rendezvous in words
(issue 32)."""

from __future__ import annotations

import socket

import pytest
from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousTimeoutError,
)

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.rendezvous import (
    check_host_endpoint,
    local_addresses,
    rendezvous_reason,
)


def _node(rank: int, endpoint: str, nnodes: int = 2) -> RunConfig:
    return RunConfig(nnodes=nnodes, node_rank=rank, rdzv_endpoint=endpoint,
                     dist_timeout_s=30.0)


def test_node_0_needs_its_own_address_and_a_free_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^rdzv_endpoint: port {port} on 127.0.0.1 is "
                           r"in use: another node of this run given --node-rank 0 too"):
            check_host_endpoint(_node(0, f"127.0.0.1:{port}"))
        check_host_endpoint(_node(1, f"127.0.0.1:{port}"))  # node 1 only connects to it
    check_host_endpoint(_node(0, f"127.0.0.1:{port}"))  # free again
    with pytest.raises(ConfigError, match=r"^rdzv_endpoint: 10\.251\.9\.9 is not an address of "
                       r"this machine, and node 0 \(this one\) hosts the rendezvous there: give "
                       r"node 0's own address, .*\(here: .*127\.0\.0\.1"):
        check_host_endpoint(_node(0, "10.251.9.9:29400"))
    with pytest.raises(ConfigError, match=r"^rdzv_endpoint: 'no-such-host\.invalid' does not "
                       "resolve here"):
        check_host_endpoint(_node(0, "no-such-host.invalid:29400"))
    assert "127.0.0.1" in local_addresses()


def test_a_failed_rendezvous_names_the_node_and_what_to_check() -> None:
    late = rendezvous_reason(RendezvousTimeoutError("timed out"), _node(0, "10.0.0.1:29400"))
    assert late == ("rendezvous: node 1 did not join within 30 s (--dist-timeout-s) at "
                    "10.0.0.1:29400: check that it was started with --nnodes 2 and its own "
                    "--node-rank, that it reaches 10.0.0.1:29400 (the address as seen from "
                    "there, the port open in the firewall) and, for node 0, --local-addr")
    assert rendezvous_reason(RendezvousTimeoutError("x"), _node(1, "10.0.0.1:29400")) \
        .startswith("rendezvous: node 0 did not join within 30 s")
    assert "3 other node(s)" in rendezvous_reason(RendezvousTimeoutError("x"),
                                                  _node(0, "10.0.0.1:29400", nnodes=4))
    host = rendezvous_reason(RendezvousConnectionError("x"), _node(0, "10.0.0.1:29400"))
    assert host.startswith("rendezvous: node 0 could not host the rendezvous store at "
                           "10.0.0.1:29400 (its port taken: another node also given "
                           "--node-rank 0, or another program?)")
    reach = rendezvous_reason(RendezvousConnectionError("x"), _node(1, "10.0.0.1:29400"))
    assert reach.startswith("rendezvous: node 1 could not reach node 0's rendezvous store at "
                            "10.0.0.1:29400: check that node 0 is started")
    assert rendezvous_reason(ValueError("x"), _node(0, "10.0.0.1:29400")) is None
    assert rendezvous_reason(RendezvousTimeoutError("x"), RunConfig()) is None  # one node
