"""Per-step timing without host-device syncs: phases and the gradient all-reduce.

- Phases (forward, backward, optimizer) and the all-reduce of each gradient bucket are stamped
  with ``time.perf_counter()`` on CPU and with CUDA events on GPU. CUDA events are read a step
  (or more) later, once ``Event.query()`` says they have happened: never a synchronize.
- The all-reduce is timed by a DDP communication hook that does what the stock
  ``default_hooks.allreduce_hook`` does: a stamp when DDP hands the bucket over, another in the
  future's ``then`` callback. The stock hook divides every bucket by the world size, a pass over
  all gradients that DDP's own all-reduce folds into its copy into the bucket and a hook cannot:
  where the training step divides its loss by the world size instead (``divide=False``), the
  hook sums as it is, for the same mean gradient. Sync time per step is the union of the
  buckets' in-flight intervals (buckets that overlap count once). The *exposed* part is how
  long the step waited after backward compute ended: from the last bucket's hand-over to the
  end of ``backward()`` (DDP's backward returns, or on CUDA lets the stream continue, only
  once every bucket is reduced).
- Data wait is host time blocked on the DataLoader, timed with perf_counter on every device.
"""

# No "from __future__ import annotations": DDP checks the hook's annotations at runtime.
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

Stamp = Any  # float seconds (CPU) or torch.cuda.Event (CUDA)

PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")


@dataclass
class _Bucket:
    start: Stamp
    end: Stamp | None = None
    nbytes: int = 0


@dataclass
class _Step:
    phases: list[tuple[str, Stamp, Stamp]] = field(default_factory=list)
    buckets: list[_Bucket] = field(default_factory=list)
    backward_end: Stamp | None = None
    data_wait_s: float = 0.0


class StepTimer:
    """Collects one record per training step; :meth:`collect` sums the resolved ones."""

    def __init__(self, device: torch.device, *, divide: bool = True) -> None:
        """``divide``: the hook divides each bucket by the world size (the stock hook's mean);
        False where the step has divided its loss by the world size already."""
        self.cuda = device.type == "cuda"
        self.divide = divide
        self._avg: bool | None = None  # whether the group's backend averages (nccl), once known
        self._lock = threading.Lock()  # hook callbacks can run on a communication thread
        self._current = _Step()
        self._pending: deque[_Step] = deque()
        self._sums = dict.fromkeys(("data_wait_s", "sync_time_s", "sync_exposed_s",
                                    "sync_bytes", "sync_buckets", *[p + "_s" for p in PHASES]),
                                   0.0)
        self._steps = 0

    # ------------------------------------------------------------------------------ stamps
    def stamp(self) -> Stamp:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def phase(self, name: str, start: Stamp, end: Stamp) -> None:
        self._current.phases.append((name, start, end))

    def add_data_wait(self, seconds: float) -> None:
        self._current.data_wait_s += seconds

    def mark_backward_end(self, stamp: Stamp) -> None:
        """Where the final micro-step's backward() returned (all buckets reduced)."""
        self._current.backward_end = stamp

    def hook(self, state: dist.ProcessGroup | None, bucket: dist.GradBucket
             ) -> torch.futures.Future[torch.Tensor]:
        """DDP comm hook: the stock all-reduce (``default_hooks.allreduce_hook``: divide by the
        world size, all-reduce the bucket), timed, with one callback instead of two. Without
        ``divide`` the bucket is summed as it is (the loss was divided instead). On NCCL the
        mean is the all-reduce's own (``ReduceOp.AVG``): no extra pass over the bucket; gloo
        has no such op, so there the bucket is divided first."""
        buf = bucket.buffer()
        record = _Bucket(start=self.stamp(), nbytes=buf.numel() * buf.element_size())
        with self._lock:
            self._current.buckets.append(record)
        group = state if state is not None else dist.group.WORLD
        op = dist.ReduceOp.SUM
        if self.divide:
            if self._avg is None:  # NCCL averages inside the reduction: no pass of our own
                self._avg = dist.get_backend(group) == "nccl"
            if self._avg:
                op = dist.ReduceOp.AVG
            else:
                buf.div_(dist.get_world_size(group))

        def done(fut: "torch.futures.Future[list[torch.Tensor]]") -> torch.Tensor:  # noqa: UP037
            # (quoted: not evaluated on every bucket of every step)
            record.end = self.stamp()  # on CUDA: recorded on the stream the result is ready on
            return fut.value()[0]

        work = dist.all_reduce(buf, op=op, group=group, async_op=True)
        assert work is not None
        return work.get_future().then(done)  # type: ignore[arg-type]

    def wrap(self, hook: Any) -> Any:
        """A script's own comm hook, timed: a stamp when DDP hands the bucket over, another
        when the hook's future completes. The hook's result passes through unchanged."""

        def timed(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            buf = bucket.buffer()
            record = _Bucket(start=self.stamp(), nbytes=buf.numel() * buf.element_size())
            with self._lock:
                self._current.buckets.append(record)

            def done(fut: "torch.futures.Future[torch.Tensor]") -> torch.Tensor:  # noqa: UP037
                record.end = self.stamp()
                return fut.value()

            return hook(state, bucket).then(done)

        timed.__name__ = getattr(hook, "__name__", "hook")  # DDP logs the hook's name
        timed.__qualname__ = getattr(hook, "__qualname__", timed.__name__)
        return timed

    def end_step(self, held: "_Step | None" = None) -> None:  # noqa: UP037
        """The step ends: the current record, or a ``held`` one (then the current one goes on,
        for the next step)."""
        with self._lock:
            if held is not None:
                self._pending.append(held)
            else:
                self._pending.append(self._current)
                self._current = _Step()

    def hold(self) -> "_Step":  # noqa: UP037
        """The current record, set aside (a step whose end is not known yet); a new one
        starts. It ends with :meth:`end_step` or goes back with :meth:`merge`."""
        with self._lock:
            held, self._current = self._current, _Step()
        return held

    def merge(self, held: "_Step") -> None:  # noqa: UP037
        """A held record belongs to the current step after all."""
        with self._lock:
            cur = self._current
            cur.phases[:0] = held.phases
            cur.buckets[:0] = held.buckets
            cur.backward_end = cur.backward_end if cur.backward_end is not None \
                else held.backward_end
            cur.data_wait_s += held.data_wait_s

    # ------------------------------------------------------------------------------ reading
    def collect(self) -> dict[str, float | None]:
        """Mean per step over the steps resolved since the last call (None if none were)."""
        with self._lock:
            while self._pending and self._ready(self._pending[0]):
                self._add(self._pending.popleft())
            steps, sums = self._steps, dict(self._sums)
            self._steps = 0
            for k in self._sums:
                self._sums[k] = 0.0
        if steps == 0:
            return dict.fromkeys(sums)
        return {k: v / steps for k, v in sums.items()}

    def _ready(self, step: _Step) -> bool:
        if not self.cuda:
            return all(b.end is not None for b in step.buckets)
        stamps = [s for _, a, b in step.phases for s in (a, b)]
        stamps += [b.end for b in step.buckets] + [step.backward_end]
        return all(s is not None and s.query() for s in stamps)

    def _seconds(self, a: Stamp, b: Stamp) -> float:
        return a.elapsed_time(b) / 1000.0 if self.cuda else b - a

    def _add(self, step: _Step) -> None:
        self._steps += 1
        self._sums["data_wait_s"] += step.data_wait_s
        for name, a, b in step.phases:
            self._sums[name + "_s"] += max(0.0, self._seconds(a, b))
        if not step.buckets:
            return
        origin = step.buckets[0].start
        spans = sorted((self._seconds(origin, b.start), self._seconds(origin, b.end))
                       for b in step.buckets)
        total, cur_start, cur_end = 0.0, spans[0][0], spans[0][1]
        for s, e in spans[1:]:
            if s > cur_end:
                total += cur_end - cur_start
                cur_start, cur_end = s, e
            else:
                cur_end = max(cur_end, e)
        total += cur_end - cur_start
        self._sums["sync_time_s"] += total
        self._sums["sync_bytes"] += sum(b.nbytes for b in step.buckets)
        self._sums["sync_buckets"] += len(step.buckets)
        if step.backward_end is not None:
            last_launch = max(step.buckets, key=lambda b: self._seconds(origin, b.start))
            exposed = self._seconds(last_launch.start, step.backward_end)
            self._sums["sync_exposed_s"] += min(max(0.0, exposed), total)
