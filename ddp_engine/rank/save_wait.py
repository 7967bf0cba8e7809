"""Waiting for rank 0's checkpoint write, without tripping a timeout meant for dead peers.

Rank 0 alone writes a checkpoint; the others would otherwise go on to the next collective and
wait for it there, on the main process group, whose timeout (``dist_timeout_s``, about two
minutes) is for a dead peer, not for a big model on a slow disk: on NCCL its watchdog would
abort them mid-save. A barrier cannot wait longer than its group's timeout either (gloo's
monitored_barrier takes a timeout, but its send still waits the group's), so rank 0 keeps
talking instead: while it writes, a thread of its own broadcasts "still writing" on the CPU
side group every :data:`KEEPALIVE_S` (well inside the group's timeout), and "written" when the
write returned; the others wait for that word. A rank 0 that dies while it writes closes its
connections, and the others' broadcast fails at once; one whose write hangs keeps them waiting,
and the heartbeats name it (phase ``save``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from ddp_engine.rank.distributed import StopFlag

KEEPALIVE_S = 2.0
"""How often rank 0 tells the others it is still writing (at most a quarter of the group's
timeout)."""
WRITING, WRITTEN = 0.0, 1.0


def while_rank0_writes(group: dist.ProcessGroup | None, rank: int, write: Callable[[], None],
                       group_timeout_s: float, stop: StopFlag | None = None) -> None:
    """Every rank at the same point: rank 0 runs ``write`` (the others do not) and every rank
    returns once it has returned. ``group_timeout_s`` is the side ``group``'s timeout. The
    ``stop``'s watchdog is held meanwhile (see :meth:`StopFlag.hold`).

    Raises:
        whatever ``write`` raises (rank 0; the others' wait then fails when rank 0 exits), or
        the error of a broadcast to a peer that died meanwhile.
    """
    if stop is not None:
        stop.hold(True)
    try:
        _wait_or_write(group, rank, write, group_timeout_s)
    finally:
        if stop is not None:
            stop.hold(False)


def _wait_or_write(group: dist.ProcessGroup | None, rank: int, write: Callable[[], None],
                   group_timeout_s: float) -> None:
    if group is None or dist.get_world_size(group) == 1:
        if rank == 0:
            write()
        return
    if rank != 0:
        word = torch.tensor([WRITING])
        while word.item() != WRITTEN:
            dist.broadcast(word, src=0, group=group)
        return
    every_s = min(KEEPALIVE_S, group_timeout_s / 4)
    done = threading.Event()
    failed: list[BaseException] = []

    def keep_alive() -> None:
        try:
            while not done.wait(every_s):
                dist.broadcast(torch.tensor([WRITING]), src=0, group=group)
        except BaseException as e:  # a peer died: said after the write, by the main thread
            failed.append(e)

    thread = threading.Thread(target=keep_alive, name="rankscope-save-keepalive", daemon=True)
    thread.start()
    try:
        write()
    finally:
        done.set()
        thread.join()
    if failed:
        raise failed[0]
    dist.broadcast(torch.tensor([WRITTEN]), src=0, group=group)
