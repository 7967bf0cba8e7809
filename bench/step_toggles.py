"""What the engine's per-step watching costs on one model: its pieces switched off and on in
turn on the same trainer, timed by the main thread's CPU clock.

    .venv/bin/python bench/step_toggles.py [--hidden 512] [--blocks 60] [--block-steps 20]

bench/step_costs.py compares variants that each train their own model; two identical models
in one process already differ there by 35-55 us per step (memory placement). Here one
``Trainer`` (telemetry on, a heartbeat) trains throughout, and blocks of steps alternate, in a
rotating order, between:

- ``full``: as in a run (the step timer's stamps, the heartbeat's phase updates, DDP's reducer
  timers sampled every 10th iteration);
- ``nosample``: the reducer not sampled (its sample rate set to 10**9);
- ``nohb``: no heartbeat;
- ``notimer``: no step timer;
- ``none``: none of them (the untimed step).

Runs itself under torchrun (2 CPU ranks, gloo, OMP_NUM_THREADS=1); prints each variant's median
main-thread CPU per step and its difference from ``none``. The spread between blocks is the
resolution: differences of a few tens of microseconds are not resolved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.two_ranks import endless, main, on_two_ranks, rank_folder, workload  # noqa: E402

VARIANTS = ("full", "nosample", "nohb", "notimer", "none")


def launch(args: argparse.Namespace) -> None:
    got: dict[str, list[float]] = on_two_ranks(__file__, [
        "--blocks", str(args.blocks), "--block-steps", str(args.block_steps),
        "--hidden", str(args.hidden), "--sample-rate", str(args.sample_rate)])
    print(f"mlp 256-{args.hidden}-{args.hidden}-10, batch 64/rank, SGD, 2 CPU ranks (gloo); "
          f"{args.blocks} blocks of {args.block_steps} steps per variant, one model")
    base = statistics.median(got["none"])
    print("variant     main thread's CPU per step: median (quartiles), us    vs none, us")
    for name in VARIANTS:
        q = statistics.quantiles(got[name], n=4)
        print(f"  {name:<9} {1e6 * statistics.median(got[name]):9.1f} ({1e6 * q[0]:.0f}.."
              f"{1e6 * q[2]:.0f})          {1e6 * (statistics.median(got[name]) - base):+7.1f}")


def rank_side(args: argparse.Namespace) -> None:
    from ddp_engine.common.heartbeat import Heartbeat
    from ddp_engine.rank.distributed import StopFlag, init_distributed, teardown
    from ddp_engine.rank.report_pace import ReportPace
    from ddp_engine.rank.trainer import Trainer

    ctx = init_distributed("cpu", 120)
    cfg = workload(args.hidden)
    work = rank_folder("step-toggles", ctx.info.rank)
    heartbeat = Heartbeat(work, ctx.info.rank)
    heartbeat.start()
    trainer = Trainer(cfg, ctx, work, StopFlag.from_config(cfg, ctx.side_group), None,
                      heartbeat)
    timer = trainer.timer
    assert timer is not None and trainer.reducer_timing is not None
    feed = endless(trainer)

    def switch(name: str) -> None:
        trainer.heartbeat = None if name in ("nohb", "none") else heartbeat
        trainer.timer = None if name in ("notimer", "none") else timer
        trainer.model._set_ddp_runtime_logging_sample_rate(
            10**9 if name in ("nosample", "none") else args.sample_rate or ReportPace.of(cfg).every)

    for _ in range(40):  # warm-up: DDP rebuilds its buckets after the first iterations
        trainer._train_step(feed)
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for block in range(args.blocks):
        k = block % len(VARIANTS)
        for name in VARIANTS[k:] + VARIANTS[:k]:  # the same order on both ranks
            switch(name)
            c0 = time.thread_time()
            for _ in range(args.block_steps):
                trainer._train_step(feed)
            cpu[name].append((time.thread_time() - c0) / args.block_steps)
            timer.collect()  # what a report would read, outside the timed block
    if ctx.info.rank == 0:
        Path(args.out).write_text(json.dumps(cpu))
    heartbeat.close()
    teardown()


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--blocks", type=int, default=60)
    parser.add_argument("--block-steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--sample-rate", type=int, default=0,
                        help="the reducer's sample rate in 'full' (default: the engine's)")


if __name__ == "__main__":
    main(__doc__, launch, rank_side, options)
