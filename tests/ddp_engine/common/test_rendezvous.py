"""Node 0's rendezvous endpoint checked before it starts, and a failed rendezvous in words
(issue 32)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest
from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousTimeoutError,
)

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.rendezvous import (
    check_host_endpoint,
    check_local_addr,
    check_monitor_address,
    local_addresses,
    rendezvous_reason,
    socket_interface_env,
    wait_for_host,
)


def _node(rank: int, endpoint: str, nnodes: int = 2) -> RunConfig:
    return RunConfig(nnodes=nnodes, node_rank=rank, rdzv_endpoint=endpoint,
                     dist_timeout_s=30.0)


@contextlib.contextmanager
def _port_taken(host: str) -> Iterator[int]:
    """A port some other socket listens on, on `host`, while the block runs."""
    with socket.socket() as taken:
        taken.bind((host, 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_node_0_needs_its_own_address_and_a_free_port() -> None:
    with _port_taken("127.0.0.1") as port:
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


def test_rank_0s_telemetry_address_is_one_of_node_0s_and_its_port_free() -> None:
    """--monitor-host (issue 32): other machines may attach to rank 0 with the token; the
    address is checked on node 0 before anything starts."""
    for host in ("127.0.0.1", "0.0.0.0"):
        check_monitor_address(RunConfig(monitor_host=host))
    with pytest.raises(ConfigError, match=r"^monitor_host: 10\.251\.9\.9 is not an address of "
                       r"this machine \(node 0, where rank 0 serves telemetry\): give 127\.0\.0\.1 "
                       r"\(this machine only\), one of its addresses \(here: .*127\.0\.0\.1.*\) "
                       r"or 0\.0\.0\.0 \(all of them\)$"):
        check_monitor_address(RunConfig(monitor_host="10.251.9.9"))
    with pytest.raises(ConfigError, match=r"^monitor_host: no-such-host\.invalid is not an"):
        check_monitor_address(RunConfig(monitor_host="no-such-host.invalid"))
    # node 1 has no rank 0; a run without telemetry serves nothing
    check_monitor_address(RunConfig(monitor_host="10.251.9.9", nnodes=2, node_rank=1,
                                    rdzv_endpoint="10.251.9.8:29400"))
    check_monitor_address(RunConfig(monitor_host="10.251.9.9", telemetry=False))
    with _port_taken("0.0.0.0") as port:
        with pytest.raises(ConfigError, match=rf"^monitor_port: port {port} on 127\.0\.0\.1 is "
                           r"not free \(Address already in use\); choose another, or 0"):
            check_monitor_address(RunConfig(monitor_port=port))


def test_local_addr_is_an_address_of_this_machine_and_picks_the_interface(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--local-addr: refused before starting when this machine does not have it; else gloo's
    (and on GPUs NCCL's) interface is the one holding it, unless the environment names one."""
    with pytest.raises(ConfigError, match=r"^local_addr: 10\.251\.9\.9 is not an address of "
                       r"this machine \(node 1\): give this node's own address, the one the "
                       r"other nodes reach it at \(here: .*127\.0\.0\.1"):
        check_local_addr(RunConfig(nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29400",
                                   local_addr="10.251.9.9"))
    near = RunConfig(nnodes=2, node_rank=1, rdzv_endpoint="127.0.0.1:29400",
                     local_addr="127.0.0.1")
    check_local_addr(near)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    assert socket_interface_env(near, "cpu") == {"GLOO_SOCKET_IFNAME": "lo"}
    assert socket_interface_env(near, "cuda") == {"GLOO_SOCKET_IFNAME": "lo",
                                                  "NCCL_SOCKET_IFNAME": "lo"}
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # the user's choice stays
    assert socket_interface_env(near, "cpu") == {}
    assert socket_interface_env(RunConfig(local_addr="127.0.0.1"), "cpu") == {}  # one node


def test_node_k_says_at_once_that_node_0_does_not_answer_and_fails_at_its_timeout() -> None:
    said: list[str] = []
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]  # bound, not listening: refused
        cfg = _node(1, f"127.0.0.1:{port}")
        started = time.monotonic()
        reason = wait_for_host(cfg, said.append, lambda: False, timeout_s=1.0, retry_s=0.1)
        assert time.monotonic() - started < 10
        assert said == [f"node 0's rendezvous store at 127.0.0.1:{port} is not up yet "
                        "(Connection refused): node 0 not started yet?; waiting up to 1 s "
                        "(--dist-timeout-s)"]  # once, not at every retry
        assert reason == (f"rendezvous: node 1 could not reach node 0's rendezvous store at "
                          f"127.0.0.1:{port} within 1 s (--dist-timeout-s; last: Connection "
                          "refused): check that node 0 is started (--node-rank 0), that "
                          f"127.0.0.1:{port} is node 0's address as seen from this machine, "
                          "and that the port is open in the firewall")
        assert wait_for_host(cfg, said.append, lambda: True) is None  # a stop: no verdict
        spare.listen()
        assert wait_for_host(cfg, said.append, lambda: False) is None
        assert len(said) == 1  # answering at once: nothing to say
    assert wait_for_host(_node(0, "127.0.0.1:1"), said.append, lambda: False) is None


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
