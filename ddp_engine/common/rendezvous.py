"""Several nodes meeting (issue 32), torch-free: node 0 hosts torchrun's rendezvous store, so
before it starts its endpoint is checked against this machine (an address it has, a port that
is free), and a rendezvous that fails is said in words that name the node and what to check."""

from __future__ import annotations

import errno
import socket

from ddp_engine.common.config import ConfigError, RunConfig


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as (host, port); RunConfig has checked its form."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def check_host_endpoint(cfg: RunConfig) -> None:
    """Node 0 is about to host the rendezvous store at ``rdzv_endpoint``: the address must be
    one of this machine's, and the port free.

    Raises:
        ConfigError: naming rdzv_endpoint, the value and the fix.
    """
    if not cfg.multi_node or cfg.node_rank != 0 or not cfg.rdzv_endpoint:
        return
    host, port = split_endpoint(cfg.rdzv_endpoint)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise ConfigError(f"rdzv_endpoint: {host!r} does not resolve here ({e.strerror or e}): "
                          "give node 0's address or a host name this machine resolves"
                          ) from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(address[:2])
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(
                    f"rdzv_endpoint: {host} is not an address of this machine, and node 0 "
                    f"(this one) hosts the rendezvous there: give node 0's own address, the "
                    f"one the other nodes reach it at (here: {', '.join(local_addresses())})"
                ) from None
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"rdzv_endpoint: port {port} on {host} is in use: another node of this "
                    "run given --node-rank 0 too, or another program. Give every node its own "
                    "--node-rank (0 for one node only), or choose a free port") from None
            raise


def local_addresses() -> list[str]:
    """This machine's IPv4 addresses, as far as the standard library can tell."""
    found = {"127.0.0.1"}
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(str(info[4][0]))
    except OSError:
        pass
    try:
        import fcntl
        import struct

        for _, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:
                    packed = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                         struct.pack("256s", name[:15].encode()))
                    found.add(socket.inet_ntoa(packed[20:24]))
                except OSError:
                    continue
    except (ImportError, OSError):
        pass
    return sorted(found)


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
