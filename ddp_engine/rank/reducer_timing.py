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

Rankscope sets the sample rate to the report interval (``log_every``), so that every report
carries one fresh sample (one iteration's, not a mean over the interval), and reports
``sync_time_s`` (= comm time), ``sync_exposed_s`` (comm time less its overlap with backward
compute: from the last gradient to the last bucket reduced), ``sync_bytes`` and
``sync_buckets`` (the buckets' sizes). Forward and backward stay timed around the calls, as
means over the interval: one sampled iteration's compute beside an interval's mean step time
would not add up (and a step that accumulates gradients under ``no_sync`` holds several
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
    """The timers of the latest DDP module watched, sampled every ``every`` iterations and
    read once per report (:meth:`read`)."""

    def __init__(self, every: int) -> None:
        self.every = max(1, int(every))
        self._module: weakref.ref[DDP] | None = None
        self._last: Any = None  # the iteration of the last sample read

    def watch(self, module: DDP) -> None:
        """From now on, time ``module`` (a new stage's DDP replaces the last one)."""
        module._set_ddp_runtime_logging_sample_rate(self.every)
        self._module, self._last = weakref.ref(module), None

    @property
    def watching(self) -> bool:
        return self._module is not None and self._module() is not None

    def read(self) -> dict[str, float | None]:
        """The sync fields of the latest sample, once: all None when there is no new one since
        the last read."""
        module = self._module() if self._module is not None else None
        out: dict[str, float | None] = dict.fromkeys(SYNC_FIELDS)
        if module is None:
            return out
        data = module._get_ddp_logging_data()
        iteration = data.get("iteration")
        if iteration is None or iteration == self._last:
            return out
        self._last = iteration
        comm = data.get("backward_comm_time")
        overlap = data.get("backward_compute_comm_overlap_time") or 0
        if isinstance(comm, int) and comm > 0:  # 0: no all-reduce in that iteration
            out["sync_time_s"] = comm * NS
            out["sync_exposed_s"] = min(comm, max(0, comm - overlap)) * NS
            sizes = _sizes(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes"))
            if sizes:
                out["sync_bytes"], out["sync_buckets"] = float(sum(sizes)), float(len(sizes))
        return out


def sync_source(asked: str) -> tuple[str, str | None]:
    """Where sync timing comes from for ``--sync-timing asked``: ``reducer`` or ``hook``, and
    why it is not what was asked (a torch without the reducer's timers), if it is not."""
    if asked == "reducer":
        why = missing_api()
        if why is not None:
            return "hook", (f"sync timing comes from Rankscope's comm hook (every step): {why}")
        return "reducer", None
    return "hook", None
