"""The end of a watched script's step: which optimizer step closes it (with
:class:`~ddp_engine.rank.script_steps.StepCounter`), a pending step held until then, the count,
the agreed-stop round it takes part in, and the report row it carries. Functions of
the :class:`~ddp_engine.rank.script_watch.ScriptWatch` they are given."""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

import torch

from ddp_engine.rank.reducer_timing import SYNC_FIELDS
from ddp_engine.rank.reports import REPORT_FIELDS
from ddp_engine.rank.script_steps import SCALER_SKIPS_DIVERGED

if TYPE_CHECKING:
    from ddp_engine.rank.script_watch import ScriptWatch

log = logging.getLogger("ddp_engine.rank.script_watch")


def stepped(w: ScriptWatch, optimizer: torch.optim.Optimizer, skipped: bool) -> None:
    if w._opt_owner is optimizer:
        w._opt_owner, w._in_opt = None, False
        if w.timer is not None and w._opt_stamp is not None:
            w.timer.phase("optimizer", w._opt_stamp, w.timer.stamp())
        w._opt_stamp = None
    counting = w.steps.is_counter(optimizer)
    ended = w.steps.stepped(optimizer, skipped)
    if skipped and counting:
        if w.steps.skipped_in_row < SCALER_SKIPS_DIVERGED:
            w._loss = None  # a skipped step's loss (often inf) is not the next one's
        elif w.steps.skipped_in_row == SCALER_SKIPS_DIVERGED:
            w._loss = torch.tensor(math.inf)  # the run's non-finite-loss policy decides
            log.warning("the GradScaler skipped %d steps in a row: the loss is taken as "
                        "non-finite", SCALER_SKIPS_DIVERGED)
    if ended:
        if w._held is not None:  # the counting optimizer's step, then this one's
            loss, samples, record, _ = w._held
            w._held = None
            if loss is not None:
                w._loss = loss if w._loss is None else loss + w._loss
            w._samples += samples
            if record is not None and w.timer is not None:
                w.timer.merge(record)
        end_step(w)
    elif w.steps.pending and counting:  # the step may end at another optimizer's step
        w._held = (w._loss, w._samples,
                      w.timer.hold() if w.timer is not None else None,
                      time.perf_counter())
        w._loss, w._samples = None, 0


def close_pending(w: ScriptWatch) -> None:
    """The pending step ends now, as it was at its counting optimizer's step; what came
    after is the next step's."""
    if w._held is None:
        return
    after = (w._loss, w._samples)
    w._loss, w._samples, record, w._step_end = w._held
    w._held = None
    try:
        end_step(w, record)
    finally:
        w._step_end = None
    w._loss, w._samples = after


def shadow_step(w: ScriptWatch) -> None:
    """Out of data inside DDP's Join: one of the other ranks' steps, without training."""
    if w.steps.end_pending():
        close_pending(w)
    end_step(w)


def end_step(w: ScriptWatch, record: Any = None) -> None:
    """A step ended (the counting optimizer's, a skipped one, or a should_stop() call in a
    loop without one): count it, and take part in the agreed-stop round when one is due."""
    if w.outcome is not None or "steps" in w.guard.off:
        return
    count_step(w, record)
    last = w.cfg.max_steps is not None and w.step >= w.cfg.max_steps
    w._phase("stop_check")
    stopping = False
    if agreeing(w):
        due = w.stop.report_due(w.step) or last
        rounds = w.stop.after_step(w.step, (lambda: report_row(w)) if due else None, flush=last)
        w.profiler.device = w.device
        w.profiler.after_step(w.step)
        stopping = w.reporter.publish(rounds, w.step, w.epoch) or w.stop.stopping
        if due:
            w._say_unavailable()
    w._idle_since = time.perf_counter()
    w._phase("data")
    if stopping or last:
        w._end("stopped" if stopping else "completed")


def count_step(w: ScriptWatch, record: Any = None) -> None:
    """One step more: its loss, samples and timing (``record``: a held one)."""
    if w.timer is not None:
        w.timer.end_step(record)
    w.step += 1
    w._interval.add(w._loss, w._samples)
    w._loss, w._samples = None, 0


def agreeing(w: ScriptWatch) -> bool:
    """Whether the ranks can agree (a side group, or one rank alone): a script that
    never calls init_process_group in a run of several ranks cannot be stopped at an
    agreed step (torchrun's signals still end it)."""
    return w.group is not None or w.info.world_size == 1


def report_row(w: ScriptWatch) -> list[float]:
    """This rank's report since the last one, as the round's row (reporting steps only);
    all NaN if making it failed (the rows must keep their shape on every rank)."""
    row = w.guard.run("steps", _make_row, w)
    return row if row is not None else [math.nan] * len(REPORT_FIELDS)


def _make_row(w: ScriptWatch) -> list[float]:
    w._phase("report")  # the loss read waits for the device (on CUDA: its all-reduce)
    values: dict[str, float | None] = dict(w._interval.take(w._step_end))  # .item():
    # a host-device sync point, on reporting steps only
    if w.heartbeat is not None:
        w.heartbeat.synced(w.step)
    if w.ddp is None:
        values["samples_per_s"] = None  # no forward seen: the batch size is unknown
    if w.timer is not None:
        values.update(w.timer.collect())
        if w.reducer_timing is not None:  # sync: DDP's own timers, one sample
            values.update(w.guard.run("sync", w.reducer_timing.read) or {})
        if w.sync_missing or "sync" in w.guard.off:  # zeros would claim a sync
            values.update(dict.fromkeys(SYNC_FIELDS))
    if w.sampler is not None:
        values.update(w.sampler.latest())
    values["skipped_steps"] = float(w.steps.take_skipped())
    values["process_cpu_s"] = time.process_time()
    values["logged_keys"] = w.logged.take(w.step)
    values["local_rank"] = w.info.local_rank
    values["on_cuda"] = 1.0 if w.device.type == "cuda" else 0.0
    row = w.reporter.row(w.step, w.epoch, values)
    w._phase("stop_check")  # the round that carries it
    return row
