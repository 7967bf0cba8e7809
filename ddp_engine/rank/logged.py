"""Scalars a rank logs by name (``rankscope.log(accuracy=...)``, the built-in loop's ``lr``),
carried to rank 0 with the reports and published as each rank entry's ``logged``.

Values are kept as given, a tensor included, and read on reporting steps only: logging a
device tensor every step costs no host-device sync. Between two reports the last value of each
key counts. Every rank's report row says how many keys it logged; when any rank logged one,
every rank takes part in one small all-gather of the names and values (the rows are the same
on every rank, so every rank decides alike). Values the same on every rank by construction
(the built-in loop's ``lr``: :meth:`LoggedScalars.log_shared`) are not gathered: rank 0's own
go into every rank's entry, and a run that logs nothing else costs no extra collective.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
import torch.distributed as dist

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$")
MAX_KEYS = 32
"""Keys one rank may log in one report (a chart each)."""


class LoggedScalars:
    """This rank's logged scalars since the last report."""

    def __init__(self) -> None:
        self._latest: dict[str, Any] = {}
        self._shared: dict[str, float] = {}
        self._taken: dict[int, dict[str, float]] = {}  # reporting step -> values, until gathered
        self._taken_shared: dict[int, dict[str, float]] = {}

    def log(self, scalars: dict[str, Any]) -> None:
        """Keep the latest value of each key (number, bool or one-element tensor).

        Raises:
            ValueError: a key that is not a name, a value that is not one number, or more
                than :data:`MAX_KEYS` keys.
        """
        for key, value in scalars.items():
            if not NAME_RE.match(key):
                raise ValueError(f"rankscope.log: key {key!r} is not allowed; use 1-64 letters, "
                                 "digits, '_', '.', '/' or '-', starting with a letter or '_'")
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"rankscope.log: {key} must be one number, got a tensor "
                                     f"of shape {tuple(value.shape)}")
                value = value.detach()
            elif not isinstance(value, int | float):
                raise ValueError(f"rankscope.log: {key} must be a number, got "
                                 f"{type(value).__name__} {value!r}")
            if key not in self._latest and len(self._latest) >= MAX_KEYS:
                raise ValueError(f"rankscope.log: at most {MAX_KEYS} keys per report; "
                                 f"{key!r} would be key {MAX_KEYS + 1}")
            self._latest[key] = value

    def log_shared(self, key: str, value: float) -> None:
        """A value every rank logs alike at the same step (no gather needed)."""
        self._shared[key] = value

    def take(self, step: int) -> int:
        """On a reporting step: keep what was logged since the last report for the gather
        at ``step`` (reading tensors now: a sync point, on reporting steps only) and return
        how many keys that is (it goes into the report row)."""
        values = {k: float(v.float().item()) if isinstance(v, torch.Tensor) else float(v)
                  for k, v in self._latest.items()}
        self._latest = {}
        if values:
            self._taken[step] = values
        if self._shared:
            self._taken_shared[step], self._shared = self._shared, {}
        return len(values)

    def mine(self, step: int) -> dict[str, float]:
        """This rank's values of the report at ``step``, its shared ones included, without a
        gather (a script's last report carries them another way)."""
        mine = {k: v for k, v in self._taken.pop(step, {}).items() if math.isfinite(v)}
        return {**self._taken_shared.pop(step, {}), **mine}

    def gather(self, step: int, counts: list[float], group: dist.ProcessGroup | None
               ) -> list[dict[str, float]]:
        """Every rank's values of the report at ``step`` (row r for rank r), given every
        rank's key count from the gathered rows. A collective when any count is above 0:
        every rank calls it with the same rows."""
        mine = {k: v for k, v in self._taken.pop(step, {}).items() if math.isfinite(v)}
        shared = self._taken_shared.pop(step, {})
        if not any(c > 0 for c in counts if math.isfinite(c)):
            return [dict(shared) for _ in counts]
        if group is None or len(counts) == 1:
            return [{**shared, **mine}]
        out: list[dict[str, float] | None] = [None] * len(counts)
        dist.all_gather_object(out, mine, group=group)
        return [{**shared, **(o or {})} for o in out]
