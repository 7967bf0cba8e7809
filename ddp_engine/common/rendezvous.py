"""Several nodes meeting (issue 32), torch-free: node 0 hosts torchrun's rendezvous store, so
before it starts its endpoint is checked against this machine (an address it has, a port that
is free), and a rendezvous that fails is said in words that name the node and what to check."""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Callable

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_values import split_endpoint


def bind_error(host: str, port: int) -> OSError | None:
    """Why nothing could listen on ``host``:``port`` on this machine now (None: it could).
    ``errno`` EADDRNOTAVAIL: not an address of this machine; EADDRINUSE: the port is taken;
    a ``socket.gaierror``: the name does not resolve."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind(address[:2])
    except OSError as e:
        return e
    return None


def _not_here(e: OSError | None) -> bool:
    """Whether :func:`bind_error` says the address is not one of this machine's (or does not
    resolve)."""
    return isinstance(e, socket.gaierror) or (e is not None and e.errno == errno.EADDRNOTAVAIL)


def check_host_endpoint(cfg: RunConfig) -> None:
    """Node 0 is about to host the rendezvous store at ``rdzv_endpoint``: the address must be
    one of this machine's, and the port free.

    Raises:
        ConfigError: naming rdzv_endpoint, the value and the fix.
    """
    if not cfg.multi_node or cfg.node_rank != 0 or not cfg.rdzv_endpoint:
        return
    host, port = split_endpoint("rdzv_endpoint", cfg.rdzv_endpoint)
    e = bind_error(host, port)
    if isinstance(e, socket.gaierror):
        raise ConfigError(f"rdzv_endpoint: {host!r} does not resolve here ({e.strerror or e}): "
                          "give node 0's address or a host name this machine resolves")
    if e is not None and e.errno == errno.EADDRNOTAVAIL:
        raise ConfigError(
            f"rdzv_endpoint: {host} is not an address of this machine, and node 0 (this one) "
            f"hosts the rendezvous there: give node 0's own address, the one the other nodes "
            f"reach it at (here: {', '.join(local_addresses())})")
    if e is not None and e.errno == errno.EADDRINUSE:
        raise ConfigError(
            f"rdzv_endpoint: port {port} on {host} is in use: another node of this run given "
            "--node-rank 0 too, or another program. Give every node its own --node-rank (0 "
            "for one node only), or choose a free port")
    if e is not None:
        raise e


def check_monitor_address(cfg: RunConfig) -> None:
    """Node 0, where rank 0 serves telemetry: ``monitor_host`` is an address of this machine
    and ``monitor_port`` (when not 0) is free there.

    Raises:
        ConfigError: naming monitor_host or monitor_port, the value and the fix.
    """
    if not cfg.telemetry or cfg.node_rank != 0:
        return
    host, port = cfg.monitor_host, cfg.monitor_port
    e = bind_error(host, port)
    if _not_here(e):
        raise ConfigError(
            f"monitor_host: {host} is not an address of this machine (node 0, where rank 0 "
            f"serves telemetry): give 127.0.0.1 (this machine only), one of its addresses "
            f"(here: {', '.join(local_addresses())}) or 0.0.0.0 (all of them)")
    if e is not None:
        raise ConfigError(f"monitor_port: port {port} on {host} is not free "
                          f"({e.strerror or e}); choose another, or 0 for a free one")


def local_addresses() -> list[str]:
    """This machine's IPv4 addresses, as far as the standard library can tell."""
    found = {"127.0.0.1", *interface_addresses()}
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(str(info[4][0]))
    except OSError:
        pass
    return sorted(found)


def interface_addresses() -> dict[str, str]:
    """This machine's IPv4 addresses by network interface: {address: interface name} (Linux;
    empty where the interfaces cannot be read)."""
    found: dict[str, str] = {}
    try:
        import fcntl
        import struct

        for _, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:
                    packed = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                         struct.pack("256s", name[:15].encode()))
                    found.setdefault(socket.inet_ntoa(packed[20:24]), name)
                except OSError:
                    continue
    except (ImportError, OSError):
        pass
    return found


def check_local_addr(cfg: RunConfig) -> None:
    """``local_addr``, where the other nodes reach this one, is an address of this machine.

    Raises:
        ConfigError: naming local_addr, the value and the addresses there are.
    """
    if not cfg.multi_node or not cfg.local_addr:
        return
    e = bind_error(cfg.local_addr.strip(), 0)
    if _not_here(e):
        raise ConfigError(
            f"local_addr: {cfg.local_addr} is not an address of this machine (node "
            f"{cfg.node_rank}): give this node's own address, the one the other nodes reach "
            f"it at (here: {', '.join(local_addresses())})")


def socket_interface_env(cfg: RunConfig, device: str) -> dict[str, str]:
    """gloo's (and on GPUs NCCL's) socket interface: the one holding ``local_addr``, unless
    the environment names one already; {} when there is none to choose."""
    name = interface_addresses().get((cfg.local_addr or "").strip())
    if not cfg.multi_node or name is None:
        return {}
    keys = ["GLOO_SOCKET_IFNAME"] + (["NCCL_SOCKET_IFNAME"] if device == "cuda" else [])
    return {k: name for k in keys if k not in os.environ}


def wait_for_host(cfg: RunConfig, say: Callable[[str], None], stopped: Callable[[], bool],
                  timeout_s: float | None = None, retry_s: float = 1.0) -> str | None:
    """Node K > 0, before its agent: wait for node 0's rendezvous store to take a connection,
    saying at once when it does not (refused: node 0 not started yet; unreachable: the
    address or the network), for ``timeout_s`` (default ``dist_timeout_s``). Returns None when
    it answers (or ``stopped()``), else the run's failure reason."""
    if not cfg.multi_node or cfg.node_rank == 0 or not cfg.rdzv_endpoint:
        return None
    host, port = split_endpoint("rdzv_endpoint", cfg.rdzv_endpoint)
    limit = cfg.dist_timeout_s if timeout_s is None else timeout_s
    deadline = time.monotonic() + limit
    said = None
    while not stopped():
        try:
            socket.create_connection((host, port), timeout=min(3.0, limit)).close()
            if said is not None:
                say(f"node 0's rendezvous store at {cfg.rdzv_endpoint} answers")
            return None
        except OSError as e:
            why = e.strerror or type(e).__name__
            refused = isinstance(e, ConnectionRefusedError)
            if said != why:
                said = why
                say(f"node 0's rendezvous store at {cfg.rdzv_endpoint} "
                    + (f"is not up yet ({why}): node 0 not started yet?" if refused else
                       f"cannot be reached from here ({why}): check the address, the "
                       "network and the firewall") + f"; waiting up to {limit:g} s "
                    "(--dist-timeout-s)")
        if time.monotonic() >= deadline:
            return (f"rendezvous: node {cfg.node_rank} could not reach node 0's rendezvous "
                    f"store at {cfg.rdzv_endpoint} within {limit:g} s (--dist-timeout-s; "
                    f"last: {said}): check that node 0 is started (--node-rank 0), that "
                    f"{cfg.rdzv_endpoint} is node 0's address as seen from this machine, and "
                    "that the port is open in the firewall")
        time.sleep(retry_s)
    return None


def rendezvous_reason(error: BaseException, cfg: RunConfig) -> str | None:
    """A failed rendezvous in words (None: not a rendezvous failure): which node, what
    happened, what to check."""
    kind = type(error).__name__
    if not cfg.multi_node or not kind.startswith("Rendezvous"):
        return None
    node, nodes, endpoint = cfg.node_rank, cfg.nnodes, cfg.rdzv_endpoint
    if kind == "RendezvousTimeoutError":
        missing = ("node 1" if nodes == 2 and node == 0 else "node 0" if nodes == 2
                   else f"{nodes - 1} other node(s), or some of them")
        return (f"rendezvous: {missing} did not join within {cfg.dist_timeout_s:g} s "
                f"(--dist-timeout-s) at {endpoint}: check that it was started with --nnodes "
                f"{nodes} and its own --node-rank, that it reaches {endpoint} (the address as "
                "seen from there, the port open in the firewall) and, for node 0, --local-addr")
    if kind == "RendezvousConnectionError" and node == 0:
        return (f"rendezvous: node 0 could not host the rendezvous store at {endpoint} (its "
                "port taken: another node also given --node-rank 0, or another program?); "
                f"give every node its own --node-rank, 0..{nodes - 1}, or choose a free port")
    if kind == "RendezvousConnectionError":
        return (f"rendezvous: node {node} could not reach node 0's rendezvous store at "
                f"{endpoint}: check that node 0 is started (--node-rank 0), that {endpoint} "
                "is node 0's address as seen from this machine, and that the port is open in "
                "the firewall")
    return None
