"""What the agreed-stop rounds bring, acted on alike by the built-in loop and a watched script:
rank 0 publishes each report as a metrics message and watches the loss for spikes; every rank
checks the losses for NaN (the same rows everywhere, so every rank decides alike, without
another collective) and takes part in gathering logged scalars."""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ddp_engine.common.config import RunConfig
from ddp_engine.rank.distributed import Round, StopFlag
from ddp_engine.rank.logged import LoggedScalars
from ddp_engine.rank.loss_watch import LossWatch
from ddp_engine.rank.reports import LOGGED_AT, REPORT_FIELDS, rank_entries
from ddp_engine.rank.telemetry import Telemetry

log = logging.getLogger("ddp_engine.rank.reporter")

LOSS_AT = REPORT_FIELDS.index("loss")
LOSS_STEPS_AT = REPORT_FIELDS.index("loss_steps")  # 0: no loss in the report (a script's)


class Reporter:
    """Publishes a rank's share of the reports (see the module docstring)."""

    def __init__(self, cfg: RunConfig, stop: StopFlag, telemetry: Telemetry | None,
                 logged: LoggedScalars, kept: Callable[[], str]) -> None:
        """``telemetry``: rank 0's server (None on the other ranks); ``kept``: which
        checkpoint a run that stops now leaves, in words (for the NaN warning)."""
        self.cfg = cfg
        self.stop = stop
        self.telemetry = telemetry
        self.logged = logged
        # Weakly: the trainer (or script watch) owns this reporter; a strong reference back
        # would make a cycle that keeps its DDP module alive until a garbage collection, which
        # may come at interpreter exit, after destroy_process_group (torch then aborts).
        self._kept = weakref.WeakMethod(kept)  # type: ignore[arg-type]
        self.group: dist.ProcessGroup | None = None
        self.places: list[dict[str, object]] = []
        # Rank 0 alone judges the loss, from the reports it publishes (cfg.loss_spike_mads).
        self.loss_watch = (LossWatch(cfg.loss_spike_mads, cfg.loss_spike_reports)
                           if telemetry is not None else None)
        self.poisoned = False
        """A non-finite loss was seen and the policy is "stop" (its weights are not saved)."""
        self._epochs: dict[int, int] = {}  # reporting step -> its epoch, until published

    def attach(self, group: dist.ProcessGroup | None, places: list[dict[str, object]]) -> None:
        """The side group the logged scalars are gathered on, and where every rank runs."""
        self.group = group
        self.places = places

    def event(self, kind: str, **fields: Any) -> None:
        if self.telemetry is not None:
            self.telemetry.publish({"type": "event", "kind": kind, **fields})

    def row(self, step: int, epoch: int, values: dict[str, float | None]) -> list[float]:
        """A report's values as the round's row (REPORT_FIELDS order, NaN for None); the
        epoch is named when the report is published."""
        self._epochs[step] = epoch
        return [math.nan if values.get(k) is None else float(values[k] or 0.0)
                for k in REPORT_FIELDS]

    def publish(self, rounds: list[Round], step_now: int, epoch_now: int,
                logged: list[list[dict[str, float]]] | None = None) -> bool:
        """Act on the reports the rounds brought (read after step ``step_now``, in epoch
        ``epoch_now``). Returns True to stop for a non-finite loss (every rank alike).
        ``logged``: each round's logged values by rank, known already (a script's last
        reports, which come without a collective); otherwise they are gathered."""
        stop = False
        for i, done in enumerate(rounds):
            if not done.reported:
                continue
            rows = done.reports()
            bad = {r: got[LOSS_AT] for r, got in enumerate(rows)
                   if got[LOSS_STEPS_AT] > 0 and not math.isfinite(got[LOSS_AT])}
            epoch = self._epochs.pop(done.step, epoch_now)
            values = logged[i] if logged is not None else self.logged.gather(
                done.step, [got[LOGGED_AT] for got in rows], self.group)  # a collective
            # when any rank logged
            if self.telemetry is not None:
                self.telemetry.publish({"type": "metrics", "time": done.time, "step": done.step,
                                        "epoch": epoch, "total_steps": self.total_steps,
                                        "ranks": rank_entries(rows, self.places, values)})
                self._watch_loss(done.step, [got[LOSS_AT] for got in rows])
            if bad and not stop:
                stop = self._nonfinite(bad, done.step, step_now)
        return stop

    total_steps: int | None = None
    """What the metrics messages say the run's length is (None: unknown, a script's)."""

    def _watch_loss(self, step: int, losses: list[float]) -> None:
        """Rank 0: warn when the loss of the report at ``step`` completes a spike."""
        assert self.loss_watch is not None
        spike = self.loss_watch.add(step, losses)
        if spike is not None:
            log.warning("%s", spike.message)
            self.event("warning", **spike.event_fields())

    def _kept_text(self) -> str:
        kept = self._kept()
        return kept() if kept is not None else "no checkpoint is kept"

    def _nonfinite(self, bad: dict[int, float], at: int, step_now: int) -> bool:
        """A rank's loss was NaN or infinite in the interval up to step ``at``: warn, and
        (policy "stop") stop at this step. Returns True to stop."""
        where = ", ".join(f"rank {r}: {v}" for r, v in sorted(bad.items()))
        stop = self.cfg.nonfinite_loss == "stop"
        message = (f"non-finite loss at step {at} ({where})"
                   + (f": stopping at step {step_now}; {self._kept_text()}" if stop
                      else ": training goes on (--nonfinite-loss warn)"))
        self.event("warning", step=at, message=message, ranks=sorted(bad),
                   cause="nonfinite_loss")
        if stop:
            self.poisoned = True
            self.stop.request(message)
        return stop

