"""torchrun's target: ``torchrun --nproc-per-node N -m ddp_engine.worker --config FILE``.

init_process_group -> Trainer -> destroy_process_group, the last on every exit path.
"""

from __future__ import annotations

from ddp_engine.common.lifeline import arm_parent_death

arm_parent_death()  # first, before the slow imports: a launcher that dies now takes us along

import argparse
import logging
import sys
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from ddp_engine.common.config import RunConfig
from ddp_engine.common.config_files import load_config_file
from ddp_engine.common.heartbeat import Heartbeat
from ddp_engine.common.run_dir import new_run_dir, prepare_run_dir
from ddp_engine.common.stack_dumps import arm_stack_dumps
from ddp_engine.rank.distributed import (
    DistContext,
    StopFlag,
    init_distributed,
)
from ddp_engine.rank.rank_life import (
    RunFailed,
    close_rank,
    record_failure,
    setup_logging,
    write_rank_state,
)
from ddp_engine.rank.telemetry import Telemetry, rank0_telemetry

log = logging.getLogger("ddp_engine.rank.worker")


def resolve_run_dir(cfg: RunConfig, ctx: DistContext) -> Path:
    """The run folder: ``cfg.run_dir``, or the one rank 0 creates and broadcasts. Every rank
    takes part in the broadcast, with or without a folder of its own: nodes started one way
    (the launcher: a folder each) and the other (a plain torchrun script: none) still call
    the same collectives."""
    box: list[str | None] = [None]
    if ctx.info.rank == 0:
        box[0] = cfg.run_dir or str(new_run_dir(cfg.runs_dir, cfg.default_name()))
    if ctx.info.world_size > 1:
        dist.broadcast_object_list(box, src=0, group=ctx.side_group)
    folder = cfg.run_dir or box[0]
    assert folder is not None
    return prepare_run_dir(folder)


@record
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_engine.worker",
                                     description="One DDP rank; start it with torchrun.")
    parser.add_argument("--config", required=True, help="TOML or JSON RunConfig")
    args = parser.parse_args(argv)
    cfg = RunConfig.from_dict(load_config_file(args.config), source=f"config {args.config}")
    setup_logging(root=cfg.script is None)
    stop = StopFlag.from_config(cfg)
    # Before init: a stop during start-up is kept, not lost.
    stop.install_signal_handlers(grace_s=cfg.shutdown_timeout_s)
    if cfg.script is not None:
        from ddp_engine.rank.script_run import run_script

        return run_script(cfg, stop)

    ctx = init_distributed(cfg.device, cfg.dist_timeout_s)
    run_dir: Path | None = None
    telemetry: Telemetry | None = None
    heartbeat: Heartbeat | None = None
    step: dict[str, int] = {}  # where training got to, once it started
    try:
        stop.attach(ctx.side_group)
        run_dir = resolve_run_dir(cfg, ctx)
        arm_stack_dumps(run_dir, ctx.info.rank)  # before the rank file says "running"
        log.info("rank %d/%d on %s (backend %s), run folder %s", ctx.info.rank,
                 ctx.info.world_size, ctx.device, ctx.backend, run_dir)
        if ctx.info.rank == 0:
            telemetry = rank0_telemetry(cfg, run_dir, ctx.info.world_size, stop)
        write_rank_state(run_dir, ctx.info, ctx.device, "running")
        heartbeat = Heartbeat(run_dir, ctx.info.rank)
        heartbeat.start()
        from ddp_engine.rank.trainer import Trainer  # after init: model/data building is slow

        trainer = Trainer(cfg, ctx, run_dir, stop, telemetry, heartbeat)
        outcome = trainer.run()
        step = {"step": trainer.pos.step, "epoch": trainer.pos.epoch}
        if telemetry is not None:
            telemetry.flush()  # the record is whole (a full disk at the very end is named)
        if stop.failure:
            # Together, after rank 0's checkpoint: the first rank to exit with an error makes
            # torchrun end the others on its node.
            dist.barrier(group=ctx.side_group)
            raise RunFailed(f"{stop.failure}; every rank stopped after step {trainer.pos.step}")
        write_rank_state(run_dir, ctx.info, ctx.device, outcome, **step,
                         **({"reason": stop.reason} if outcome == "stopped" else {}))
        log.info("%s at step %d", outcome, trainer.pos.step)
    except BaseException as e:
        record_failure(e, run_dir, ctx.info, ctx.device, telemetry, step)
        raise
    finally:
        close_rank(heartbeat, telemetry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
