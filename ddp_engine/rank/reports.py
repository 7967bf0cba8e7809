"""A rank's report: the fields it sends each log interval, the interval that collects them
between reports, and the per-rank entries of the metrics message rank 0 publishes."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ddp_engine.rank.device_sampler import KEYS as DEVICE_KEYS

__all__ = ["DEVICE_KEYS", "LOGGED_AT", "REPORT_FIELDS", "TIMING_FIELDS", "Interval",
           "rank_entries"]

TIMING_FIELDS: tuple[str, ...] = ("data_wait_s", "forward_s", "backward_s", "optimizer_s",
                                  "sync_time_s", "sync_exposed_s", "sync_bytes", "sync_buckets")
REPORT_FIELDS: tuple[str, ...] = ("loss", "samples_per_s", "step_time_s", "eval_s",
                                  *TIMING_FIELDS,
                                  *DEVICE_KEYS, "process_cpu_s", "skipped_steps",
                                  "loss_steps", "logged_keys",
                                  "local_rank", "on_cuda")
"""Per-rank values gathered to rank 0 at each log interval, in this order (NaN for None).
The last four are not published as they are: ``loss_steps`` (steps with a loss: 0 when a
script's report had none, so its NaN loss is no NaN alarm), ``logged_keys`` (whether the
rank logged scalars, see :mod:`ddp_engine.rank.logged`), and the two that make the entry's
``device``."""
PUBLISHED = REPORT_FIELDS[:-4]
LOGGED_AT = REPORT_FIELDS.index("logged_keys")


class Interval:
    """Loss and throughput since the last report: the losses stay on the device, unread,
    until a reporting step sums them (one host-device sync per report, none per step)."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self.loss_steps = 0  # steps that had a loss (a script's step may have none)
        self.steps = 0
        self.samples = 0
        self.eval_s = 0.0  # evaluations in the interval: in its step time, and said apart
        self.start = time.perf_counter()

    def add(self, loss: torch.Tensor | None, samples: int) -> None:
        if loss is not None:
            self.losses.append(loss)
            self.loss_steps += 1
            if len(self.losses) >= 64:  # a long interval: one sum on the device, still no sync
                self.losses = [torch.stack(self.losses).float().sum()]
        self.steps += 1
        self.samples += samples

    def take(self, end: float | None = None) -> dict[str, float]:
        """The report since the last one, up to ``end`` (a ``perf_counter`` time: a step that
        ended earlier than it was counted), else now; the next interval starts there."""
        total = torch.stack(self.losses).float().sum().item() if self.losses else math.nan
        loss = total / max(self.loss_steps, 1)
        now = time.perf_counter() if end is None else end
        elapsed = max(now - self.start, 1e-9)
        out = {"loss": loss, "samples_per_s": self.samples / elapsed,
               "step_time_s": elapsed / max(self.steps, 1),
               "eval_s": self.eval_s / max(self.steps, 1), "loss_steps": self.loss_steps}
        self.losses = []
        self.steps = self.samples = self.loss_steps = 0
        self.eval_s = 0.0
        self.start = now
        return out


def rank_entries(rows: list[list[float]], places: list[dict[str, object]],
                 logged: list[dict[str, float]] | None = None) -> list[dict[str, Any]]:
    """The "ranks" of a metrics message from the gathered report rows (row r is rank r's, in
    REPORT_FIELDS order), where each rank runs (host, node, local rank) and what each logged
    (an entry's ``logged``, only where it logged something)."""
    ranks = []
    for r, gathered in enumerate(rows):
        got = dict(zip(REPORT_FIELDS, gathered, strict=True))
        entry: dict[str, Any] = {"rank": r}
        entry.update({k: _finite_or_none(got[k]) for k in PUBLISHED})
        for k in entry:
            if (k.endswith("_bytes") or k in ("sync_buckets", "gpu_throttle")) \
                    and entry[k] is not None:
                entry[k] = round(entry[k])
        entry.update(places[r])  # host, node, local_rank, gpu (NVML index, UUID, name, bus)
        entry["device"] = device_name(entry.get("gpu"), int(got["local_rank"]), got["on_cuda"])
        if logged and logged[r]:
            entry["logged"] = logged[r]
        ranks.append(entry)
    return ranks


def device_name(gpu: object, local_rank: int, on_cuda: float) -> str:
    """A rank's device as nvidia-smi names it, ``GPU 2``; ``cuda:<local rank>`` where NVML
    could not name the GPU; ``cpu``."""
    if not on_cuda:
        return "cpu"
    if isinstance(gpu, dict) and isinstance(gpu.get("index"), int):
        return f"GPU {gpu['index']}"
    return f"cuda:{local_rank}"


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
