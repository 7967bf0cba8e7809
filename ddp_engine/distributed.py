"""Process-group set-up and teardown, the CPU side group, and the agreed stop."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType

import torch
import torch.distributed as dist

from ddp_engine.config import NODE_RANK_ENV
from ddp_engine.lifeline import PARENT_DEATH_SIGNAL


@dataclass(frozen=True)
class DistInfo:
    """Who this process is, as torchrun's environment (and the node rank) says."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int = 0

    @classmethod
    def from_env(cls) -> DistInfo:
        """Read RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE (set by torchrun).

        Raises:
            RuntimeError: when not started by torchrun.
        """
        missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if k not in os.environ]
        if missing:
            raise RuntimeError(f"{', '.join(missing)} not set: start the worker with torchrun "
                               "(torchrun --nproc-per-node N -m ddp_engine.worker --config FILE)"
                               " or with python -m ddp_engine launch")
        world = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        rank = int(os.environ["RANK"])
        node = os.environ.get(NODE_RANK_ENV) or None  # empty: unset (a single node)
        if node is None:
            return cls(rank, local_rank, world, local_world,
                       node_rank=int(os.environ.get("GROUP_RANK", 0)))
        nodes = int(os.environ.get("GROUP_WORLD_SIZE", world // max(local_world, 1)))
        node_rank = int(node) if node.isdigit() else -1
        if world != nodes * local_world or not 0 <= node_rank < nodes:
            raise RuntimeError(f"node_rank: {node!r} does not fit this run of {nodes} nodes "
                               f"and {world} ranks ({local_world} on this node): every node "
                               "must run the same number of processes and have its own node "
                               f"rank, 0..{nodes - 1}")
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "True") != "True":
            raise RuntimeError("node_rank: numbering the ranks by node needs torchrun's shared "
                               "store; unset TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
        rank = node_rank * local_world + local_rank
        os.environ["RANK"] = str(rank)  # what this rank is, for everything that reads it
        return cls(rank, local_rank, world, local_world, node_rank=node_rank)


def choose_backend(device_pref: str, local_world_size: int) -> str:
    """nccl when CUDA is wanted and every local rank has its own GPU, else gloo.

    Raises:
        RuntimeError: device "cuda" was asked for but there are too few GPUs.
    """
    gpus = torch.cuda.device_count() if device_pref != "cpu" else 0
    if gpus >= local_world_size and gpus > 0:
        return "nccl"
    if device_pref == "cuda":
        raise RuntimeError(f"device: cuda needs one GPU per local rank: {local_world_size} ranks, "
                           f"{gpus} GPUs visible (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    return "gloo"


@dataclass
class DistContext:
    """What a worker needs after init: identity, device and the CPU side group."""

    info: DistInfo
    backend: str
    device: torch.device
    side_group: dist.ProcessGroup
    """A gloo group for small CPU collectives (stop flag, per-rank stats): no GPU sync."""


def init_distributed(device_pref: str, timeout_s: float) -> DistContext:
    """init_process_group (nccl on GPUs, gloo on CPU), set the CUDA device, make the side group."""
    info = DistInfo.from_env()
    backend = choose_backend(device_pref, info.local_world_size)
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
        device = torch.device("cuda", info.local_rank)
    else:
        device = torch.device("cpu")
    timeout = datetime.timedelta(seconds=timeout_s)
    if os.environ.get(NODE_RANK_ENV) and info.local_rank == 0:
        _claim_node(info, timeout)
    # device_id binds the NCCL communicator to this rank's GPU eagerly.
    dist.init_process_group(backend=backend, timeout=timeout, rank=info.rank,
                            world_size=info.world_size,
                            device_id=device if backend == "nccl" else None)
    side = (dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo"
            else dist.group.WORLD)
    assert side is not None
    return DistContext(info=info, backend=backend, device=device, side_group=side)


def _claim_node(info: DistInfo, timeout: datetime.timedelta) -> None:
    """Take this node's rank in torchrun's store, before the ranks numbered by it meet: two
    nodes given the same --node-rank would otherwise share rank numbers and hang.

    Raises:
        RuntimeError: another node of this run has this node rank.
    """
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timeout, wait_for_workers=False)
    run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if store.add(f"rankscope/{run}/{attempt}/node/{info.node_rank}", 1) != 1:
        nodes = info.world_size // info.local_world_size
        raise RuntimeError(f"node_rank: {info.node_rank} is already taken by another node of "
                           f"this run; give every node its own --node-rank, 0..{nodes - 1}")


def teardown() -> None:
    """destroy_process_group if a group exists; safe to call on every exit path."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


STOP_ASKED = 1.0
LOST_LAUNCHER = 2.0
"""Stop codes, all-reduced with MAX: a lost launcher (LOST_LAUNCHER + its node rank) wins
over a plain stop, so every rank learns that the run failed, and where."""


def lost_launcher_text(node: int) -> str:
    """What a rank says when a launcher died: which node's, in a multi-node run."""
    return (f"the launcher of node {node} died" if NODE_RANK_ENV in os.environ
            else "the launcher died")


#: Seconds a stop request waits at most for the next agreed-stop check (beyond the step it
#: arrives in): slow steps are checked more often than every ``stop_check_every`` steps.
STOP_CHECK_S = 0.5


class StopFlag:
    """A local stop request (signal, or a command on rank 0) and the all-ranks agreement on it.

    Ranks call :meth:`agreed` at the same steps; it all-reduces the local flags (MAX) on the CPU
    side group, so all ranks see the same answer and stop after the same step.
    """

    def __init__(self, every: int, side_group: dist.ProcessGroup | None = None) -> None:
        # A plain attribute, not a threading.Event: signal handlers must not take locks that
        # the interrupted main thread may hold.
        self._requested = False
        self._watchdog: threading.Timer | None = None
        self._group = side_group
        self._every = every
        self.reason: str | None = None
        self._code = STOP_ASKED
        self.failure: str | None = None
        """Set when the agreed stop is a failure: a node's launcher died (the run stops
        cleanly on every rank, and ends failed)."""
        # [stop code, this rank's seconds per step since the last check], reduced with MAX
        self._buf = torch.zeros(2, dtype=torch.float64)
        self._next: int | None = None  # the step of the next check (the same on every rank)
        self._last = (0, 0.0)  # (step, time.monotonic()) at the last check
        self.checks = 0  # how many agreements (all-reduces) this flag has taken part in

    def attach(self, side_group: dist.ProcessGroup) -> None:
        """Use ``side_group`` for the agreement (created after the handlers were installed)."""
        self._group = side_group

    def request(self, reason: str, code: float = STOP_ASKED) -> None:
        """Ask for a stop (thread- and signal-safe: attribute assignments). ``code`` above
        STOP_ASKED says the run lost a node's launcher: :data:`LOST_LAUNCHER` + its node."""
        if not self._requested:
            self.reason = reason
            self._code = code
        self._requested = True

    @property
    def requested(self) -> bool:
        return self._requested

    def install_signal_handlers(self, grace_s: float) -> None:
        """SIGTERM, SIGINT and SIGHUP (which torchrun forwards) request a stop; so does the
        parent-death signal (the launcher died). Either way, a rank whose stop has not finished
        ``grace_s`` later is stuck (a hung step, a collective with a dead peer): it says so and
        SIGKILLs itself. torchrun, which waits 30 s after a failure whatever its shutdown
        timeout, then ends the run at once."""

        def watchdog(why: str, code: float = STOP_ASKED) -> None:
            self.request(why, code)
            if self._watchdog is None:
                self._arm_watchdog(why, grace_s)

        def handler(signum: int, _frame: FrameType | None) -> None:
            watchdog(f"signal {signal.Signals(signum).name}")

        def orphaned(_signum: int, _frame: FrameType | None) -> None:
            node = int(os.environ.get(NODE_RANK_ENV) or 0)
            watchdog(lost_launcher_text(node), LOST_LAUNCHER + node)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, handler)
        signal.signal(PARENT_DEATH_SIGNAL, orphaned)

    def _arm_watchdog(self, why: str, grace_s: float) -> None:
        """SIGKILL this rank ``grace_s`` from now unless it has exited (see
        :meth:`install_signal_handlers`); armed again when the stop is agreed, so the final
        checkpoint and teardown get the whole grace period."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = threading.Timer(grace_s, _give_up, args=(why, grace_s))
        self._watchdog.daemon = True
        self._watchdog.start()

    def interval(self, per_step_s: float) -> int:
        """Steps until the next check: ``every``, or fewer when steps are slow, so that a stop
        waits about :data:`STOP_CHECK_S` (at least one step) whatever the step time."""
        if per_step_s <= 0:
            return self._every
        return max(1, min(self._every, int(STOP_CHECK_S / per_step_s)))

    def agreed(self, step: int) -> bool:
        """True on every rank when any rank asked to stop. Ranks call it after every step; it
        checks (a two-float all-reduce on the CPU side group) at most ``every`` steps apart, and
        every step once steps take :data:`STOP_CHECK_S` or more. The check steps follow from
        the first step and the slowest rank's step time (reduced with the flag), so every rank
        checks at the same steps and all stop after the same one."""
        now = time.monotonic()
        if self._next is None:  # the first step: check at the next multiple of every
            self._next = -(-step // self._every) * self._every
            self._last = (step, now)
        if step < self._next:
            return False
        last_step, last_time = self._last
        per_step = (now - last_time) / (step - last_step) if step > last_step else 0.0
        self._buf[0] = self._code if self._requested else 0.0
        self._buf[1] = per_step
        if self._group is not None:
            dist.all_reduce(self._buf, op=dist.ReduceOp.MAX, group=self._group)
        self.checks += 1
        self._last = (step, now)
        self._next = step + self.interval(float(self._buf[1]))
        code = float(self._buf[0])
        if code <= 0:
            return False
        if self._watchdog is not None:  # agreed: from here on the stop is not stuck
            self._arm_watchdog(*self._watchdog.args)  # type: ignore[arg-type]
        if code >= LOST_LAUNCHER:
            self.failure = lost_launcher_text(int(code - LOST_LAUNCHER))
            self.reason = self.failure
        else:
            asked = self._asker_reason()  # a collective: every rank, every time
            if not self._requested:
                self.request(asked)
        self._requested = True
        return True

    def _asker_reason(self) -> str:
        """Why the run stops, as the lowest rank that asked says. Every rank calls it once,
        when the stop is agreed: the ranks that did not ask learn why (every node then reports
        the same reason)."""
        fallback = "another rank asked to stop"
        if self._group is None or dist.get_world_size(self._group) == 1:
            return self.reason or fallback
        reasons: list[str | None] = [None] * dist.get_world_size(self._group)
        dist.all_gather_object(reasons, self.reason if self._requested else None,
                               group=self._group)
        return next((r for r in reasons if r), fallback)


def _give_up(why: str, grace_s: float) -> None:
    print(f"[rank {os.environ.get('RANK', '?')}] the stop requested by {why} has not finished "
          f"after {grace_s:g} s (this rank is stuck): killing itself", file=sys.stderr,
          flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def rank_places(info: DistInfo, group: dist.ProcessGroup | None) -> list[dict[str, object]]:
    """Where every rank runs, row r for rank r: its node's host name, node rank and local rank
    (gathered once, at start: telemetry names them in every rank entry)."""
    mine: dict[str, object] = {"host": socket.gethostname(), "node": info.node_rank,
                               "local_rank": info.local_rank}
    if group is None or info.world_size == 1:
        return [mine]
    places: list[dict[str, object] | None] = [None] * info.world_size
    dist.all_gather_object(places, mine, group=group)
    return [p if p is not None else {} for p in places]


def all_gather_rows(values: list[float], group: dist.ProcessGroup | None,
                    world_size: int) -> list[list[float]]:
    """Gather one row of floats from every rank (on the CPU side group); row r is rank r's."""
    row = torch.tensor(values, dtype=torch.float64)
    if group is None or world_size == 1:
        return [row.tolist()]
    rows = [torch.empty_like(row) for _ in range(world_size)]
    dist.all_gather(rows, row, group=group)
    return [r.tolist() for r in rows]
