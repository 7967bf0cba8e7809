"""Nodes that hear from each other (issue 32): in a run of several nodes, every launcher
beats once a second through the rendezvous store that node 0 hosts (torch's public TCPStore,
one counter per node), so that a node cut off by the network is named, and a node whose
torchrun agent hangs on a store that has gone away still ends.

Node 0 reads every other node's counter from its own store (never across the network); a node
counts as heard while its counter moves. Another node hears node 0 while its own beats go
through. A node heard once and silent for :data:`LOST_S` is *lost*: a failure after that names
it, and a node whose ranks have all ended while node 0 is lost ends without waiting for its
agent (torch's agent blocks in a store read that never returns once the link is down: 7
minutes and counting, seen in the partition test). A node that ended normally says so in the
store first, so that it is not taken for lost.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psutil

from ddp_engine.common.config import RunConfig
from ddp_engine.common.config_values import split_endpoint
from ddp_engine.common.processes import alive, tree

BEAT_S = 1.0
"""Seconds between two beats (a store operation of a few bytes each)."""
LOST_S = 5.0
"""A node heard once and silent this long is lost."""
OP_TIMEOUT_S = 3.0
"""Timeout of each store operation of the watch."""
STUCK_S = 2.0
"""How long this node's ranks have all been gone, with node 0 lost, before the launcher ends
without its agent (the agent returns within a second when it can reach node 0)."""


class NodeWatch(threading.Thread):
    """The beats of this node, and (on node 0) what it heard from the others.

    Args:
        cfg: the run's config (nnodes > 1): node rank, rendezvous endpoint and id.
        address: this node's address as the others reach it, to name it in their reasons
            (``--local-addr``); None: the address this machine reaches node 0's store from,
            found at the first beat (the host name where no route to it is known).
    """

    def __init__(self, cfg: RunConfig, address: str | None, beat_s: float = BEAT_S) -> None:
        super().__init__(name="rankscope-node-watch", daemon=True)
        self.node = cfg.node_rank
        self.nnodes = cfg.nnodes
        self.endpoint = str(cfg.rdzv_endpoint)
        self.host, self.port = split_endpoint("rdzv_endpoint", self.endpoint)
        self.key = f"rankscope.{cfg.rendezvous_id()}.node"
        self.address = address
        self.beat_s = beat_s
        self.heard: dict[int, float] = {}
        """time.monotonic() a node was last heard (node 0 on another node: the last beat that
        went through)."""
        self.addresses: dict[int, str] = {0: self.host}
        self.ended: dict[int, str] = {}
        """Nodes that said they ended, with their final state."""
        self._counts: dict[int, int] = {}
        self._store: Any = None
        self._final_state: str | None = None
        self._stopping = threading.Event()
        self._gone_since: float | None = None
        self._frozen: float | None = None

    # -------------------------------------------------------------------- the watch thread
    def run(self) -> None:
        while not self._stopping.wait(self.beat_s):
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 - the store is not up yet, or gone: retried
                self._store = None
        self._finish()

    def _finish(self) -> None:
        """Say this node ended (when it did), and close the store client. Here, not at the
        interpreter's exit: left to that, torch's TCPStore aborted the process ("terminate
        called without an active exception")."""
        store, self._store = self._store, None
        if store is not None and self._final_state is not None and self.node != 0:
            with contextlib.suppress(Exception):
                store.set(f"{self.key}{self.node}.end", self._final_state)
        del store

    def poll_once(self) -> None:
        """One beat (another node) or one read of every node's counter (node 0)."""
        store = self._connect()
        if self.node != 0:
            store.add(f"{self.key}{self.node}", 1)
            self.heard[0] = time.monotonic()
            return
        for k in range(1, self.nnodes):
            count = int(store.add(f"{self.key}{k}", 0))
            if count and count != self._counts.get(k):
                self._counts[k] = count
                self.heard[k] = time.monotonic()
                if k not in self.addresses and store.check([f"{self.key}{k}.addr"]):
                    self.addresses[k] = store.get(f"{self.key}{k}.addr").decode()
            if k not in self.ended and store.check([f"{self.key}{k}.end"]):
                self.ended[k] = store.get(f"{self.key}{k}.end").decode()

    def _connect(self) -> Any:
        if self._store is None:
            from torch.distributed import TCPStore

            store = TCPStore(self.host, self.port, is_master=False,
                             timeout=timedelta(seconds=OP_TIMEOUT_S))
            if self.node != 0:
                if self.address is None:
                    self.address = route_address(self.host, self.port) or socket.gethostname()
                store.set(f"{self.key}{self.node}.addr", self.address)
            self._store = store
        return self._store

    def close(self, state: str | None = None, wait: bool = True) -> None:
        """Stop beating; with ``state``, tell node 0 this node ended. With ``wait``, waits for
        the thread at most :data:`OP_TIMEOUT_S` and a beat (a store that has gone away may hang
        it; left to the interpreter's exit, a store call in flight aborts the process). Without:
        the caller ends the process with os._exit."""
        self._final_state = state
        self._stopping.set()
        if self.ident is None:  # never started: polled by hand (tests)
            self._finish()
        elif wait and self.is_alive():
            self.join(OP_TIMEOUT_S + self.beat_s)

    def freeze(self) -> None:
        """Verdicts from now on as they are now: called as the agent returns, after which node
        0's store goes away at the end of a run and silence no longer means a lost node."""
        self._frozen = self._frozen or time.monotonic()

    # ----------------------------------------------------------------------------- verdicts
    def lost(self, now: float | None = None) -> dict[int, float]:
        """Nodes heard once, silent for :data:`LOST_S` or more and not ended: node -> seconds."""
        now = time.monotonic() if now is None else now
        now = min(now, self._frozen) if self._frozen else now
        return {k: now - t for k, t in sorted(self.heard.items())
                if now - t >= LOST_S and k not in self.ended}

    def lost_text(self, now: float | None = None) -> str | None:
        """The lost nodes in words (None: none)."""
        parts = []
        for k, silent_s in self.lost(now).items():
            if k == 0 and self.node != 0:
                parts.append(f"lost node 0 ({self.host}): its rendezvous store at "
                             f"{self.endpoint} has not answered for {silent_s:.0f} s")
            else:
                parts.append(f"lost node {k} ({self.addresses.get(k, 'address unknown')}): not "
                             f"heard from for {silent_s:.0f} s")
        if not parts:
            return None
        return "; ".join(parts) + " (the network between the nodes, or that machine)"

    def cut_off(self, now: float | None = None,
                children: Callable[[], list[psutil.Process]] | None = None) -> str | None:
        """This node's reason to end without its agent, or None: node 0 is lost (on node 0:
        never) and every process this launcher started has been gone for :data:`STUCK_S`."""
        now = time.monotonic() if now is None else now
        if self.node == 0 or 0 not in self.lost(now):
            self._gone_since = None
            return None
        started = children() if children is not None else tree(os.getpid())[1:]
        if alive(started):
            self._gone_since = None
            return None
        self._gone_since = self._gone_since or now
        if now - self._gone_since < STUCK_S:
            return None
        return self.lost_text(now)


def route_address(host: str, port: int) -> str | None:
    """This machine's IPv4 address on the route to ``host``: the one the kernel sends from
    (a UDP socket's connect picks the route and sends nothing). None where there is none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return str(s.getsockname()[0])
    except OSError:
        return None
