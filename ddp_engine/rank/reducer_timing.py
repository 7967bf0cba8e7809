"""Sync timing read from DDP's own reducer timers: nothing in Python per step, whatever comm
hook the model has (none, a built-in C++ one, the script's own), over DDP's own group.

DDP's C++ reducer times itself on *sampled* iterations: the first ten, then every
``sample_rate``-th (``DistributedDataParallel._set_ddp_runtime_logging_sample_rate``; DDP's
default is 100). On a sampled iteration it records, with the host clock on CPU and CUDA events
on GPUs (torch/csrc/distributed/c10d/reducer.cpp, ``Timer::Event``):

- ``kForwardStart``: DDP's forward begins;
- ``kBackwardComputeStart``: backward begins (the first gradient hook);
- ``kBackwardCommStart``: the first gradient bucket is handed to the all-reduce (or comm hook);
- ``kBackwardComputeEnd``: the last gradient is ready;
- ``kBackwardCommEnd``: every bucket is reduced (the reducer's finalize).

At the next forward (``Logger::set_runtime_stats_and_log``, logger.cpp; on CUDA it waits for
those events there, once per sample) it turns them into, in ns, read with
``_get_ddp_logging_data()`` (``iteration``: which iteration they belong to):

- ``forward_compute_time`` = ForwardStart -> BackwardComputeStart (the forward, the loss and
  whatever the script does before ``backward()``);
- ``backward_compute_time`` = BackwardComputeStart -> BackwardComputeEnd;
- ``backward_comm_time`` = BackwardCommStart -> BackwardCommEnd;
- ``backward_compute_comm_overlap_time`` = BackwardCommStart -> BackwardComputeEnd.

The logger also keeps running means over every sampled iteration (``avg_backward_comm_time``,
``avg_backward_compute_comm_overlap_time``: ``avg = (t + avg * (n - 1)) / n``, n the
iterations recorded). On CPU, where its timers are host clocks and sampling costs nothing
measurable (bench/step_toggles.py ``--sample-rate 1``), Rankscope samples every iteration and
reports the mean over the iterations since the last report, ``(avg1 * n1 - avg0 * n0) / (n1 -
n0)`` with n the ``iteration`` (every iteration recorded since the module's first): a mean over
the interval, like the step's other parts. One sampled iteration per report swung from 0.3 to
6.4 ms on a 2-rank CPU run whose mean backward was 1.7 ms, and often exceeded it. On CUDA the
logger waits for a sampled iteration's events at the next forward, a host-device sync, so
there the sample rate is 10 steps (or ``log_every``; a report spans one or more such periods)
and a report carries the latest sample; so does a module that ran before it was watched.

Reported: ``sync_time_s`` (= comm time), ``sync_exposed_s`` (comm time less its overlap with
backward compute: from the last gradient to the last bucket reduced), ``sync_bytes`` and
``sync_buckets`` (the buckets' sizes). Forward and backward stay timed around the calls, as
means over the interval (a step that accumulates gradients under ``no_sync`` holds several
forwards, of which the reducer times the synced one). These are
private APIs: :func:`missing_api` says when a torch lacks them (then the comm hook times sync,
and the dashboard says so).
"""

from __future__ import annotations

import weakref
from typing import Any

from torch.nn.parallel import DistributedDataParallel as DDP

API = ("_set_ddp_runtime_logging_sample_rate", "_get_ddp_logging_data")
SYNC_FIELDS = ("sync_time_s", "sync_exposed_s", "sync_bytes", "sync_buckets")
NS = 1e-9


def missing_api(module: Any = DDP) -> str | None:
    """Why DDP's reducer timers cannot be read here (None: they can)."""
    absent = [name for name in API if not hasattr(module, name)]
    return (f"this torch's DistributedDataParallel lacks {', '.join(absent)}" if absent
            else None)


def _sizes(text: Any) -> list[int]:
    """``"4239400, 2101248"`` (the logging data's bucket sizes in bytes) as ints."""
    try:
        return [int(part) for part in str(text or "").split(",") if part.strip()]
    except ValueError:
        return []


class ReducerTiming:
    """The timers of the latest DDP module watched, read once per report (:meth:`read`): the
    mean over the iterations since the last read on CPU, the latest sampled iteration (one
    every ``every``) on CUDA."""

    def __init__(self, every: int) -> None:
        self.every = max(1, int(every))
        self._module: weakref.ref[DDP] | None = None
        self._last: Any = None  # the iteration of the last sample read
        self._means = False  # every iteration sampled from the module's first: interval means
        self._sums = (0, 0.0, 0.0)  # at the last read: iterations, comm and overlap sums (ns)

    def watch(self, module: DDP) -> None:
        """From now on, time ``module`` (a new stage's DDP replaces the last one)."""
        param = next(iter(module.parameters()), None)
        on_cuda = param is not None and param.is_cuda
        fresh = not module._get_ddp_logging_data().get("iteration")
        self._means = fresh and not on_cuda
        module._set_ddp_runtime_logging_sample_rate(1 if self._means else self.every)
        self._module, self._last, self._sums = weakref.ref(module), None, (0, 0.0, 0.0)

    @property
    def watching(self) -> bool:
        return self._module is not None and self._module() is not None

    def read(self) -> dict[str, float | None]:
        """The sync fields since the last read (all None when DDP recorded nothing new)."""
        module = self._module() if self._module is not None else None
        out: dict[str, float | None] = dict.fromkeys(SYNC_FIELDS)
        if module is None:
            return out
        data = module._get_ddp_logging_data()
        iteration = data.get("iteration")
        if iteration is None or iteration == self._last:
            return out
        self._last = iteration
        comm, overlap = self._interval(data, iteration)
        if comm is not None and comm > 0:  # 0: no all-reduce in that iteration
            out["sync_time_s"] = comm * NS
            out["sync_exposed_s"] = min(comm, max(0.0, comm - overlap)) * NS
            sizes = _sizes(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes"))
            if sizes:
                out["sync_bytes"], out["sync_buckets"] = float(sum(sizes)), float(len(sizes))
        return out

    def _interval(self, data: dict[str, Any], iteration: Any) -> tuple[float | None, float]:
        """Comm and overlap time (ns) of the iterations since the last read: their means
        where every iteration is sampled, else the latest sample's (also when the running
        means do not add up: an iteration the logger could not time leaves them behind)."""
        comm = data.get("backward_comm_time")
        overlap = data.get("backward_compute_comm_overlap_time")
        latest = (float(comm) if isinstance(comm, int) else None,
                  float(overlap) if isinstance(overlap, int) else 0.0)
        avg_comm = data.get("avg_backward_comm_time")
        avg_overlap = data.get("avg_backward_compute_comm_overlap_time")
        if not (self._means and isinstance(iteration, int) and isinstance(avg_comm, int)):
            return latest
        n0, comm0, overlap0 = self._sums
        sums = (iteration, float(avg_comm) * iteration,
                float(avg_overlap if isinstance(avg_overlap, int) else 0) * iteration)
        self._sums = sums
        steps = iteration - n0
        if steps <= 0:
            return latest
        mean_comm, mean_overlap = (sums[1] - comm0) / steps, (sums[2] - overlap0) / steps
        return latest if mean_comm < 0 or mean_overlap < 0 else (mean_comm, mean_overlap)


def sync_source(asked: str) -> tuple[str, str | None]:
    """Where sync timing comes from for ``--sync-timing asked``: ``reducer`` or ``hook``, and
    why it is not what was asked (a torch without the reducer's timers), if it is not."""
    if asked == "reducer":
        why = missing_api()
        if why is not None:
            return "hook", (f"sync timing comes from Rankscope's comm hook (every step): {why}")
        return "reducer", None
    return "hook", None
