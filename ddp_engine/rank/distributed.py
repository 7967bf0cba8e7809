"""Process-group set-up and teardown, the CPU side group, and the agreed stop."""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from ddp_engine.common.config import RunConfig
from ddp_engine.common.config_values import NODE_RANK_ENV
from ddp_engine.common.lifeline import (
    PARENT_DEATH_SIGNAL,
    STOP_REQUEST_SIGNAL,
    asked_by_signal,
    signal_name,
)
from ddp_engine.rank.backend import choose_backend, device_id_is_safe
from ddp_engine.rank.profile_ask import ProfileAsk
from ddp_engine.rank.report_pace import ReportPace


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


@dataclass
class DistContext:
    """What a worker needs after init: identity, device and the CPU side group."""

    info: DistInfo
    backend: str
    device: torch.device
    side_group: dist.ProcessGroup
    """A gloo group of its own for small CPU collectives (stop rounds, per-rank stats, the
    checkpoint's RNG states): no GPU sync, and out of the gradient all-reduces' way."""


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
    # device_id binds the NCCL communicator to this rank's GPU eagerly (NCCL errors at init,
    # not at the first all-reduce), where that is safe.
    eager = backend == "nccl" and device_id_is_safe(torch.__version__)
    dist.init_process_group(backend=backend, timeout=timeout, rank=info.rank,
                            world_size=info.world_size, device_id=device if eager else None)
    # A group of its own even on gloo: the agreed-stop rounds run asynchronously beside DDP's
    # gradient all-reduces, and their own group (own connections and threads) keeps them out
    # of the gradient buckets' queue.
    side = dist.new_group(backend="gloo", timeout=timeout)
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
#: A round is read one round later (its all-gather runs while the next steps train) unless
#: that would delay a stop by this much or more: then the rank waits for it at once, a wait
#: that costs nothing measurable next to steps that long.
LAG_S = 0.25


@dataclass
class Round:
    """One agreement: the rows every rank sent after ``step`` (row r is rank r's)."""

    step: int
    rows: list[list[float]]
    """[stop code, seconds per step, *profile ask, *report] per rank (:data:`ROW_HEAD` columns
    before the report); the report is empty or all NaN when the round carried none."""
    reported: bool
    """Whether the ranks sent a report (the same on every rank: reporting steps are fixed)."""
    time: float
    """This rank's ``time.time()`` when it sent its row: when the report was taken."""

    def reports(self) -> list[list[float]]:
        """Each rank's report fields, row r for rank r."""
        return [row[ROW_HEAD:] for row in self.rows]


ROUND_SPAN = "rankscope::round"
"""While a profile records, a round's all-gather runs inside this span (named apart from the
script's collectives in the summary)."""
ROW_HEAD = 2 + len(ProfileAsk.NONE)
"""Columns of a round's row before the report: stop code, seconds per step, profile ask."""


class StopFlag:
    """A local stop request (signal, or a command on rank 0) and the all-ranks agreement on it,
    which also carries each rank's report to every rank.

    Ranks call :meth:`after_step` after every step, with the same arguments' shape (the report
    on the same steps). At most ``every`` steps apart, and every step once steps are slow, it
    starts a *round*: an asynchronous all-gather, on the CPU side group, of each rank's stop
    code, seconds per step and (on reporting steps) report row. The round is read at the next
    round, by then long finished, so training never waits for it: a stop agreed there makes
    every rank stop after that same step. A round is read at once (a synchronous wait) when
    asked to (``flush``: before a checkpoint, at the last step), for the first round, and when
    steps are so slow that reading it a round later would delay a stop by :data:`LAG_S` or
    more. The check steps follow from the first step and the slowest rank's step time as the
    rounds say, so every rank starts and reads rounds at the same steps.
    """

    def __init__(self, every: int, side_group: dist.ProcessGroup | None = None, *,
                 log_every: int = 10, report_s: float = 0.0) -> None:
        """``every``: at most that many steps between rounds (0: rounds follow the reports, at
        least every :data:`STOP_CHECK_S`); reports fall on multiples of ``log_every``, at
        least ``report_s`` apart at the slowest rank's pace (0: every ``log_every`` steps)."""
        # A plain attribute, not a threading.Event: signal handlers must not take locks that
        # the interrupted main thread may hold.
        self._requested = False
        self._watchdog: threading.Timer | None = None
        self._held = False  # a checkpoint is being saved: the watchdog waits (see hold())
        self._group = side_group
        self._every = every
        self.pace = ReportPace(log_every, report_s)
        self.reason: str | None = None
        self._code = STOP_ASKED
        self.failure: str | None = None
        """Set when the agreed stop is a failure: a node's launcher died (the run stops
        cleanly on every rank, and ends failed)."""
        self.stopping = False
        """Every rank agreed to stop: it stops after the step that read the round."""
        self._next: int | None = None  # the step of the next round (the same on every rank)
        self._last = (0, 0.0)  # (step, time.monotonic()) at the last round
        self._per_step_s: float | None = None  # the slowest rank's, as the last round read said
        self._pending: tuple[Any, list[torch.Tensor], int, bool, float] | None = None
        self.rounds: list[int] = []
        """The steps that started a round (tests and benchmarks read it)."""
        self.profile = ProfileAsk()
        """A profile asked for on rank 0, carried by the rounds; agreed like a stop."""
        self.handlers: dict[int, Any] = {}
        """The signal handlers :meth:`install_signal_handlers` set, by signal number (a
        script's own handler for one of them is chained onto ours)."""

    @classmethod
    def from_config(cls, cfg: RunConfig, side_group: dist.ProcessGroup | None = None,
                    ) -> StopFlag:
        """The run's flag: its stop checks and report pace as ``cfg`` says."""
        pace = ReportPace.of(cfg)
        return cls(cfg.stop_check_every, side_group, log_every=pace.every, report_s=pace.seconds)

    def report_due(self, step: int) -> bool:
        """Whether the ranks report after ``step``, alike on every rank (:class:`ReportPace`;
        a checkpoint or the last step reports too: :meth:`after_step` is told by ``report``)."""
        return self.pace.due(step)

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
        """The launcher's stop request (:data:`STOP_REQUEST_SIGNAL`: it got SIGTERM, SIGINT or
        SIGHUP), and those signals themselves (a rank started by plain torchrun, or the
        launcher's escalation when the agreed stop did not end), request a stop; so does the
        parent-death signal (the launcher died). Either way, a rank whose stop has not finished
        ``grace_s`` later is stuck (a hung step, a collective with a dead peer): it says so and
        SIGKILLs itself. torchrun, which waits 30 s after a failure whatever its shutdown
        timeout, then ends the run at once."""

        def watchdog(why: str, code: float = STOP_ASKED) -> None:
            self.request(why, code)
            if self._watchdog is None:
                self._arm_watchdog(why, grace_s)

        def handler(signum: int, _frame: FrameType | None) -> None:
            watchdog(f"signal {signal_name(signum)}")

        def asked(_signum: int, _frame: FrameType | None) -> None:
            node = os.environ.get(NODE_RANK_ENV)
            watchdog(asked_by_signal(int(node) if node else None))

        def orphaned(_signum: int, _frame: FrameType | None) -> None:
            node = int(os.environ.get(NODE_RANK_ENV) or 0)
            watchdog(lost_launcher_text(node), LOST_LAUNCHER + node)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, handler)
        signal.signal(STOP_REQUEST_SIGNAL, asked)
        signal.signal(PARENT_DEATH_SIGNAL, orphaned)
        self.handlers = {int(sig): signal.getsignal(sig) for sig in (
            signal.SIGTERM, signal.SIGINT, signal.SIGHUP, STOP_REQUEST_SIGNAL,
            PARENT_DEATH_SIGNAL)}
        parent = os.getppid()

        def watch_parent() -> None:
            """The parent-death signal's handler runs only when the main thread runs Python:
            not while it is blocked in C++ (a store wait, a collective with a dead peer, for
            up to the group's timeout). This thread sees the launcher gone by itself and
            starts the same stop, whose watchdog ends a rank that cannot take it."""
            while os.getppid() == parent:
                time.sleep(PARENT_POLL_S)
            orphaned(PARENT_DEATH_SIGNAL, None)

        threading.Thread(target=watch_parent, name="rankscope-parent-watch",
                         daemon=True).start()

    def _arm_watchdog(self, why: str, grace_s: float) -> None:
        """SIGKILL this rank ``grace_s`` from now unless it has exited (see
        :meth:`install_signal_handlers`); armed again when the stop is agreed, so the final
        checkpoint and teardown get the whole grace period."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = threading.Timer(grace_s, _give_up, args=(why, grace_s))
        self._watchdog.daemon = True
        if not self._held:
            self._watchdog.start()

    def hold(self, held: bool) -> None:
        """Held while a checkpoint is saved: no stop watchdog, as a slow disk is not a stuck
        rank; released, it gets its whole grace period again (armed by a signal meanwhile)."""
        self._held = held
        if self._watchdog is not None and held:
            self._watchdog.cancel()
        elif self._watchdog is not None:
            self._arm_watchdog(*self._watchdog.args)  # type: ignore[arg-type]

    def interval(self, per_step_s: float) -> int:
        """Steps until the next check: ``every``, or fewer when steps are slow, so that a stop
        waits about :data:`STOP_CHECK_S` (at least one step) whatever the step time; with
        ``every`` 0, only that (and the reports' rounds)."""
        if per_step_s <= 0:
            return self._every or self.pace.every
        slow = max(1, int(STOP_CHECK_S / per_step_s))
        return min(self._every, slow) if self._every else slow

    def after_step(self, step: int, report: Callable[[], list[float]] | None = None, *,
                   flush: bool = False) -> list[Round]:
        """Call after every step, on every rank. ``report`` (given on reporting steps, the same
        steps on every rank) makes this row's report; it forces a round, as ``flush`` does, and
        ``flush`` also reads it at once. Returns the rounds read now (oldest first): none, the
        previous one, and the one started now when it was read at once. After it,
        :attr:`stopping` says whether every rank stops after this step."""
        now = time.monotonic()
        if self._next is None:  # the first step: a round at the next multiple of every
            first = self._every or self.pace.every
            self._next = -(-step // first) * first
            self._last = (step, now)
        if step < self._next and report is None and not flush:
            return []
        read = []
        if self._pending is not None:
            read.append(self._finish())
            if self.stopping:
                return read
        last_step, last_time = self._last
        per_step = (now - last_time) / (step - last_step) if step > last_step else 0.0
        self._last = (step, now)
        self._start(step, per_step, report() if report is not None else None)
        known = self._per_step_s
        if report is not None:
            self.pace.reported(step, known)
        # read at once unless the next round (a check's, or a report's if sooner) is near
        if flush or known is None or min(self.interval(known),
                                         self.pace.steps_to_next(step)) * known >= LAG_S:
            read.append(self._finish())
            if report is not None:  # the round just read knows the pace better
                self.pace.reported(step, self._per_step_s)
        self._next = step + self.interval(self._per_step_s or 0.0)
        return read

    def settle(self) -> Round | None:
        """Read the pending round, if any (every rank at the same point): when training ends
        with a round still in flight (a stop for a non-finite loss), nothing is left pending
        on the side group."""
        return self._finish() if self._pending is not None else None

    def gather(self, step: int, report: list[float]) -> Round:
        """A round read at once, whatever the schedule (the report of the steps after the
        last round, when training ends). Every rank calls it at the same point."""
        if self._pending is not None:
            self._finish()
        self._start(step, 0.0, report)
        return self._finish()

    def _start(self, step: int, per_step_s: float, report: list[float] | None) -> None:
        code = self._code if self._requested else 0.0
        row = torch.tensor([code, per_step_s, *self.profile.row(), *(report or [])],
                           dtype=torch.float64)
        world = 1 if self._group is None else dist.get_world_size(self._group)
        if world == 1:
            work, rows = None, [row]
        else:
            rows = [torch.empty_like(row) for _ in range(world)]
            with record_function(ROUND_SPAN) if self.profile.recording else nullcontext():
                work = dist.all_gather(rows, row, group=self._group, async_op=True)
        self.rounds.append(step)
        self._pending = (work, rows, step, report is not None, time.time())

    def _finish(self) -> Round:
        """Wait for the pending round and act on it: the stop, and the pace of the next."""
        assert self._pending is not None
        work, tensors, step, reported, when = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        rows = [t.tolist() for t in tensors]
        self._per_step_s = max(r[1] for r in rows)
        code = max(r[0] for r in rows)
        self.profile.read([r[2:ROW_HEAD] for r in rows])
        if code > 0 and not self.stopping:
            self._agree(code)
        return Round(step, rows, reported, when)

    def _agree(self, code: float) -> None:
        self.stopping = True
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


PARENT_POLL_S = 1.0
"""How often a rank's thread checks that its launcher (its parent) is alive."""


def _give_up(why: str, grace_s: float) -> None:
    print(f"[rank {os.environ.get('RANK', '?')}] the stop requested by {why} has not finished "
          f"after {grace_s:g} s (this rank is stuck): killing itself", file=sys.stderr,
          flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
