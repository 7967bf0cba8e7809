"""Two hosts on one machine (issue 32): network namespaces "node0" and "node1", each with its own
loopback, joined by a veth pair with private addresses that exist only inside them. Needs root
(CAP_NET_ADMIN) and ``ip``; tests that use it skip, with the reason, where namespaces cannot be
made. Everything made is removed on the way out, also when the test fails or is interrupted;
namespaces left by a process that died are removed the next time."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

PREFIX = "rsn"
"""Our namespaces are named rsn<pid>-<n>: the pid tells a stale one from a live test's."""
ADDRESSES = ("10.251.7.1", "10.251.7.2")
"""node0's and node1's: a private range, inside the namespaces only."""


@dataclass(frozen=True)
class Host:
    """One namespace: its name, its address and its end of the veth pair."""

    netns: str
    address: str
    interface: str

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside this host."""
        return ["ip", "netns", "exec", self.netns, *command]

    def popen(self, command: Sequence[str], log: Path, env: dict[str, str],
              ) -> subprocess.Popen[bytes]:
        """Start ``command`` in this host, its output in ``log``, in its own session (as the
        app starts a launcher). No GLOO_SOCKET_IFNAME: the launcher picks the interface of
        --local-addr, as it does for a user."""
        with open(log, "wb") as out:
            return subprocess.Popen(self.argv(command), stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)

    def run(self, command: Sequence[str], env: dict[str, str], timeout: float = 120,
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(command), capture_output=True, text=True, env=env,
                              timeout=timeout)

    def pids(self) -> list[int]:
        """The processes running in this host."""
        got = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True,
                             text=True)
        return [int(p) for p in got.stdout.split()]


def _ip(*args: str) -> None:
    got = subprocess.run(["ip", *args], capture_output=True, text=True)
    if got.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {got.stderr.strip() or got.returncode}")


def _remove(netns: str) -> None:
    """Kill what runs in ``netns``, then remove it (its end of the veth pair goes with it)."""
    got = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    for pid in got.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def _remove_stale() -> None:
    """Namespaces of ours whose test process is gone (it was killed before its clean-up)."""
    got = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in got.stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX) and "-" in name:
            pid = name[len(PREFIX):].split("-", 1)[0]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                _remove(name)


def link(hosts: Sequence[Host], up: bool) -> None:
    """Set both ends of the veth pair up or down (a partition, and its end)."""
    for h in hosts:
        _ip("-n", h.netns, "link", "set", h.interface, "up" if up else "down")


REQUIRED_ENV = "RANKSCOPE_NETNS_REQUIRED"
"""Set (to 1) where namespaces must work (.ci/run: CI runs as root): a host that cannot be
made fails the test instead of skipping it, so that a broken set-up is not a silent skip."""


def _cannot(why: str) -> None:
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{why}; {REQUIRED_ENV}=1 says they must work here")
    pytest.skip(why)


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """node0 and node1, joined; removed afterwards whatever happens. Skips the test (naming
    why) where namespaces cannot be made: not root, no ``ip``, a kernel without them."""
    if shutil.which("ip") is None:
        _cannot("two hosts need the ip command (iproute2)")
    _remove_stale()
    tag = f"{PREFIX}{os.getpid()}"
    hosts = tuple(Host(f"{tag}-{k}", ADDRESSES[k], f"rv{os.getpid() % 100000}{'ab'[k]}")
                  for k in (0, 1))
    made: list[str] = []
    try:
        try:
            for h in hosts:
                _ip("netns", "add", h.netns)
                made.append(h.netns)
            _ip("link", "add", hosts[0].interface, "type", "veth", "peer", "name",
                hosts[1].interface)
            for h in hosts:
                _ip("link", "set", h.interface, "netns", h.netns)
                _ip("-n", h.netns, "addr", "add", f"{h.address}/24", "dev", h.interface)
                _ip("-n", h.netns, "link", "set", "lo", "up")
                _ip("-n", h.netns, "link", "set", h.interface, "up")
        except OSError as e:
            _cannot(f"cannot make network namespaces here ({e})")
        yield hosts  # type: ignore[misc]
    finally:
        for name in made:
            _remove(name)
        with contextlib.suppress(OSError):  # if it was never moved into a namespace
            _ip("link", "del", hosts[0].interface)
