"""One rank of a user's own training script (``launch --script train.py -- ARGS``).

The script runs in this process as ``__main__``, with the argv (``[script, *script_args]``),
environment (torchrun's RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...), ``sys.path[0]`` (its
folder) and working folder (``script_cwd``, default the caller's folder) that ``torchrun
train.py ARGS`` gives it. Around it, as for built-in runs: rank 0's telemetry server, the
heartbeat, the rank's state file, and the failure report. The watching itself is
:mod:`ddp_engine.rank.script_watch`.
"""

from __future__ import annotations

import gc
import logging
import os
import runpy
import sys
from pathlib import Path

import rankscope
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.heartbeat import Heartbeat
from ddp_engine.common.run_dir import prepare_run_dir
from ddp_engine.common.stack_dumps import arm_stack_dumps
from ddp_engine.rank.distributed import DistInfo, StopFlag
from ddp_engine.rank.rank_life import RunFailed, close_rank, record_failure, write_rank_state
from ddp_engine.rank.script_stop import ScriptStopped, publish_finals
from ddp_engine.rank.script_watch import ScriptWatch
from ddp_engine.rank.telemetry import Telemetry, rank0_telemetry

log = logging.getLogger("ddp_engine.rank.script_run")


class ScriptFailed(RuntimeError):
    """The script ended with a non-zero ``sys.exit`` code."""


def run_script(cfg: RunConfig, stop: StopFlag) -> int:
    """Run ``cfg.script`` as this rank; returns 0 (completed or stopped), raises on failure."""
    assert cfg.script is not None
    info = DistInfo.from_env()
    if cfg.run_dir is None:
        raise ConfigError("run_dir: a script's rank needs its run folder; start it with "
                          "python -m ddp_engine launch --script FILE.py")
    run_dir = prepare_run_dir(cfg.run_dir)
    arm_stack_dumps(run_dir, info.rank)  # before the rank file says "running"
    telemetry: Telemetry | None = None
    heartbeat: Heartbeat | None = None
    watch: ScriptWatch | None = None
    step: dict[str, int] = {}
    try:
        if info.rank == 0:
            telemetry = rank0_telemetry(cfg, run_dir, info.world_size, stop)
        write_rank_state(run_dir, info, "cpu", "running")
        heartbeat = Heartbeat(run_dir, info.rank)
        heartbeat.start()
        watch = ScriptWatch(cfg, info, run_dir, stop, telemetry, heartbeat)
        watch.install()
        rankscope._session = watch
        log.info("rank %d/%d runs %s %s in %s, run folder %s", info.rank, info.world_size,
                 cfg.script, " ".join(cfg.script_args), cfg.script_cwd, run_dir)
        outcome = _run_main(cfg, watch)
        if info.rank == 0 and watch.outcome is None:  # it ended by itself: every rank's last
            publish_finals(watch, watch.side_timeout_s)  # report, as each rank's script ends
        step = {"step": watch.step, "epoch": watch.epoch}
        watch.reporter.event(outcome, step=watch.step, epoch=watch.epoch)
        if telemetry is not None:
            telemetry.flush()  # the record is whole
        if stop.failure:
            raise RunFailed(f"{stop.failure}; every rank stopped after step {watch.step}")
        write_rank_state(run_dir, info, watch.device, outcome, **step,
                         **({"reason": stop.reason} if outcome == "stopped" else {}))
        log.info("%s at step %d", outcome, watch.step)
    except BaseException as e:
        if watch is not None:
            step = {"step": watch.step, "epoch": watch.epoch}
        record_failure(e, run_dir, info, watch.device if watch else "cpu", telemetry, step)
        raise
    finally:
        rankscope._session = None
        if watch is not None:
            watch.uninstall()
        gc.collect()  # the script's models (cycles included) go before their process group
        if watch is not None:
            watch.patches.release_groups()  # the last reference: destroyed without the GIL
        close_rank(heartbeat, telemetry)
    return 0


def _run_main(cfg: RunConfig, watch: ScriptWatch) -> str:
    """Run the script as ``__main__``; returns "completed" or "stopped"."""
    assert cfg.script is not None
    script = Path(cfg.script)
    sys.argv = [str(script), *cfg.script_args]
    sys.path[0] = str(script.parent)  # what ``python train.py`` puts first
    os.chdir(cfg.script_cwd or os.curdir)  # unset (not resolved by a plan): where it started
    try:
        runpy.run_path(str(script), run_name="__main__")
    except ScriptStopped as e:
        return e.outcome
    except SystemExit as e:
        if e.code not in (None, 0):
            raise ScriptFailed(f"the script exited with code {e.code!r} (sys.exit)") from None
    if watch.outcome is None and watch.stop.requested and not watch.stop.stopping:
        log.info("the script ended before the stop that was asked for was agreed")
    watch.finish()  # the last report, if the script did not destroy its process group
    return watch.outcome or "completed"
