"""The end of a watched script: at an agreed stop, how it leaves and what rank 0 saves; by
itself, how every rank's last report reaches rank 0 without a collective."""

from __future__ import annotations

import datetime
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_engine.common.config import RunConfig
from ddp_engine.common.heartbeat import Heartbeat
from ddp_engine.rank import checkpoint
from ddp_engine.rank.distributed import ROW_HEAD, DistInfo, Round, StopFlag
from ddp_engine.rank.logged import LoggedScalars
from ddp_engine.rank.reporter import Reporter
from ddp_engine.rank.save_wait import while_rank0_writes

log = logging.getLogger("ddp_engine.rank.script_stop")


class ScriptStopped(SystemExit):  # noqa: N818 (it is an exit, as SystemExit is)
    """Raised out of ``optimizer.step()`` on every rank after an agreed stop: it leaves the
    script (a SystemExit, so ``except Exception`` in the script lets it through)."""

    def __init__(self, step: int, outcome: str) -> None:
        super().__init__(0)
        self.step = step
        self.outcome = outcome


class ScriptEnd(Protocol):
    """What the end of a script needs of its watch (:class:`~.script_watch.ScriptWatch`)."""

    cfg: RunConfig
    info: DistInfo
    run_dir: Path
    stop: StopFlag
    heartbeat: Heartbeat | None
    reporter: Reporter
    logged: LoggedScalars
    group: dist.ProcessGroup | None
    store: dist.Store | None
    step: int
    epoch: int
    on_stop_fns: list[Callable[[], Any]]

    @property
    def ddps(self) -> list[DDP]: ...

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]: ...


FINAL_KEY = "rankscope/final/{rank}"


def _named(objs: list[Any]) -> dict[str, Any]:
    """``{"Generator": sd, "Discriminator": sd}``: each state dict by its class name (and
    position where two share one)."""
    names = [type(o).__name__ for o in objs]
    return {(n if names.count(n) == 1 else f"{n}_{i}"): o.state_dict()
            for i, (n, o) in enumerate(zip(names, objs, strict=True))}


def stop_payload(watch: ScriptEnd) -> Any:
    """Run the script's ``rankscope.on_stop`` functions (on every rank: they may use
    collectives) and return what rank 0 saves: the last non-None result; without such a
    function, every DDP module's ``module.state_dict()`` and every optimizer's state, named
    by class (``models``, ``optimizers``; ``model`` and ``optimizer`` are the latest DDP's and
    the step-counting optimizer's); None when there is neither."""
    payload: Any = None
    for fn in watch.on_stop_fns:
        got = fn()
        payload = got if got is not None else payload
    ddps, optimizers = watch.ddps, watch.optimizers
    if watch.on_stop_fns or not ddps:
        return payload
    return {"format": checkpoint.FORMAT, "source": "script", "script": watch.cfg.script,
            "model": ddps[-1].module.state_dict(),
            "optimizer": optimizers[0].state_dict() if optimizers else None,
            "models": _named([m.module for m in ddps]), "optimizers": _named(optimizers),
            "step": watch.step, "epoch": watch.epoch, "world_size": watch.info.world_size}


def save_stop_checkpoint(payload: Any, run_dir: Path, step: int, has_on_stop: bool
                         ) -> Path | None:
    """Rank 0: ``payload`` atomically to ``run_dir/checkpoints/last.pt``; returns the path,
    or None (said in the log) when there is nothing to save.

    Raises:
        CheckpointError: the file could not be written (naming the path and the cause).
    """
    if payload is None:
        log.warning("stopped at step %d without a checkpoint: %s", step,
                    "its on_stop function returned None (it saved its own)" if has_on_stop
                    else "the script built no DistributedDataParallel and registered no "
                    "rankscope.on_stop function (or its loss was not finite)")
        return None
    path = run_dir / "checkpoints" / "last.pt"
    try:
        checkpoint.save_atomic(payload, path)
    except OSError as e:
        raise checkpoint.write_error(e, step, path, "no checkpoint is kept") from e
    return path


def save_at_stop(watch: ScriptEnd) -> None:
    """Every rank, at an agreed stop: the on_stop functions; rank 0 saves what they return,
    or by default the DDP module's and the first optimizer's state (:func:`stop_payload`),
    while the others wait for it (:func:`~ddp_engine.rank.save_wait.while_rank0_writes`:
    however long the write takes, with no stop watchdog meanwhile)."""
    watch.stop.hold(True)  # on_stop functions may save a big model themselves
    try:
        payload = None if watch.reporter.poisoned else stop_payload(watch)  # NaN: not kept
    finally:
        watch.stop.hold(False)

    def write() -> None:
        _enter(watch, "save")  # not a collective: the others wait for this rank
        path = save_stop_checkpoint(payload, watch.run_dir, watch.step, bool(watch.on_stop_fns))
        _enter(watch, "checkpoint")
        if path is not None:
            watch.reporter.event("checkpoint_saved", step=watch.step, epoch=watch.epoch,
                                 paths=[str(path)])

    while_rank0_writes(watch.group, watch.info.rank, write, watch.cfg.dist_timeout_s, watch.stop)


def _enter(watch: ScriptEnd, phase: str) -> None:
    if watch.heartbeat is not None:
        watch.heartbeat.enter(phase, watch.step)


def post_final(watch: ScriptEnd, row: list[float] | None) -> None:
    """This rank's last report (``row``: the steps since the last one, or None) and its logged
    values, into the run's store for rank 0 (:func:`publish_finals`): a write, no wait. The
    round still in flight is read first: every rank started it after the same step, so it
    completes without waiting on any rank's script."""
    settled = watch.stop.settle()
    final = {"step": watch.step, "row": row,
             "logged": watch.logged.mine(watch.step) if row is not None else {},
             "settled": None if settled is None else {
                 "step": settled.step, "rows": settled.rows, "reported": settled.reported,
                 "time": settled.time,
                 "logged": watch.logged.mine(settled.step) if settled.reported else {}}}
    if watch.info.world_size == 1:
        _publish(watch, {0: final})
    elif watch.store is not None:
        watch.store.set(FINAL_KEY.format(rank=watch.info.rank), json.dumps(final))


def publish_finals(watch: ScriptEnd, wait_s: float) -> None:
    """Rank 0, once its own script is over: every rank's last report. Waits for the other
    ranks' posts at most ``wait_s`` (they come as their scripts end; torchrun ends this rank
    if one fails), then publishes what came."""
    world = watch.info.world_size
    if world == 1 or watch.store is None:
        return
    keys = [FINAL_KEY.format(rank=r) for r in range(world)]
    try:
        watch.store.wait(keys, datetime.timedelta(seconds=wait_s))
    except (RuntimeError, dist.DistError) as e:  # a rank that never posted
        log.warning("the last reports of some ranks did not come within %g s (%s); "
                    "publishing those that did", wait_s, e)
    finals = {r: json.loads(watch.store.get(key)) for r, key in enumerate(keys)
              if watch.store.check([key])}
    _publish(watch, finals)


def _publish(watch: ScriptEnd, finals: dict[int, dict[str, Any]]) -> None:
    """Rank 0: the round that was in flight (its rows are the same on every rank; the logged
    values each rank's own) and every rank's last report, as one more round."""
    world = watch.info.world_size
    if not finals:
        return
    settled = next((f["settled"] for f in finals.values() if f.get("settled")), None)
    if settled is not None:
        logged = [(finals.get(r, {}).get("settled") or {}).get("logged", {})
                  for r in range(world)]
        watch.reporter.publish([Round(settled["step"], settled["rows"], settled["reported"],
                                      settled["time"])], watch.step, watch.epoch,
                               logged=[logged])
    rows = [finals[r]["row"] if r in finals else None for r in range(world)]
    size = next((len(row) for row in rows if row is not None), 0)
    if size:
        step = max(int(f["step"]) for f in finals.values())
        full = [[*[0.0] * ROW_HEAD, *(row if row is not None else [math.nan] * size)]
                for row in rows]
        logged = [finals[r]["logged"] if r in finals else {} for r in range(world)]
        watch.reporter.publish([Round(step, full, True, time.time())], watch.step,
                               watch.epoch, logged=[logged])
