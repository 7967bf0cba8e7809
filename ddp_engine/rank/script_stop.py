"""The end of a watched script at an agreed stop: how it leaves, and what rank 0 saves."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddp_engine.rank import checkpoint
from ddp_engine.rank.save_wait import while_rank0_writes

if TYPE_CHECKING:
    from ddp_engine.rank.script_watch import ScriptWatch

log = logging.getLogger("ddp_engine.rank.script_stop")


class ScriptStopped(SystemExit):  # noqa: N818 (it is an exit, as SystemExit is)
    """Raised out of ``optimizer.step()`` on every rank after an agreed stop: it leaves the
    script (a SystemExit, so ``except Exception`` in the script lets it through)."""

    def __init__(self, step: int, outcome: str) -> None:
        super().__init__(0)
        self.step = step
        self.outcome = outcome


def stop_payload(watch: ScriptWatch) -> Any:
    """Run the script's ``rankscope.on_stop`` functions (on every rank: they may use
    collectives) and return what rank 0 saves: the last non-None result; without such a
    function, the DDP module's ``module.state_dict()`` and the first optimizer's state; None
    when there is neither."""
    payload: Any = None
    for fn in watch.on_stop_fns:
        got = fn()
        payload = got if got is not None else payload
    if watch.on_stop_fns or watch.ddp is None:
        return payload
    return {"format": checkpoint.FORMAT, "source": "script", "script": watch.cfg.script,
            "model": watch.ddp.module.state_dict(),
            "optimizer": watch.optimizers[0].state_dict() if watch.optimizers else None,
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


def save_at_stop(watch: ScriptWatch) -> None:
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


def _enter(watch: ScriptWatch, phase: str) -> None:
    if watch.heartbeat is not None:
        watch.heartbeat.enter(phase, watch.step)
