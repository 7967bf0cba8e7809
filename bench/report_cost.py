"""What one report costs on rank 0: its pieces timed alone, in a real 2-rank trainer.

    .venv/bin/python bench/report_cost.py [--reports 300] [--hidden 512]

Runs itself under torchrun (2 CPU ranks, gloo, OMP_NUM_THREADS=1). Rank 0 has the telemetry
server and writes metrics.jsonl, as in a run. After every training step both ranks make a
report and take part in the round that carries it, and each piece is timed by the main
thread's CPU clock (medians over ``--reports``):

- ``report row``: ``Trainer._row`` (the loss read, the step timer, the reducer's sample, the
  device readings, the logged values), and inside it the reducer's ``read`` and DDP's
  ``_get_ddp_logging_data`` alone, and the step timer's ``collect``;
- ``row tensor``: the round's float64 tensor made from the row;
- ``round``: ``StopFlag.gather`` (the all-gather of every rank's row, and its wait);
- ``rank entries``: the metrics message's per-rank entries made from the gathered rows;
- ``publish``: ``Reporter.publish`` (the entries, the loss watch, the message queued for the
  telemetry thread, which is woken);
- ``encode``: what the telemetry thread then does per message before writing it (non-finite
  values to null, JSON), timed on rank 0's last metrics line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.two_ranks import endless, main, on_two_ranks, rank_folder, workload  # noqa: E402


def launch(args: argparse.Namespace) -> None:
    got = on_two_ranks(__file__, ["--reports", str(args.reports), "--hidden", str(args.hidden)])
    print(f"mlp 256-{args.hidden}-{args.hidden}-10, 2 CPU ranks (gloo); rank 0, "
          f"{args.reports} reports; main thread's CPU, median")
    for name, us in got["median_us"].items():
        print(f"  {name:<26} {us:8.1f} us")
    print(f"  metrics line: {got['line_bytes']} bytes")


def rank_side(args: argparse.Namespace) -> None:
    import torch

    from ddp_engine.common.heartbeat import Heartbeat
    from ddp_engine.common.protocol import encode
    from ddp_engine.rank.distributed import StopFlag, init_distributed, teardown
    from ddp_engine.rank.metrics_file import finite
    from ddp_engine.rank.reports import Interval, rank_entries
    from ddp_engine.rank.telemetry import Telemetry
    from ddp_engine.rank.trainer import Trainer

    ctx = init_distributed("cpu", 120)
    rank = ctx.info.rank
    cfg = workload(args.hidden)
    work = rank_folder("report-cost", rank)
    telemetry = (Telemetry(work, welcome_extra={}, on_stop=lambda _why: None)
                 if rank == 0 else None)
    heartbeat = Heartbeat(work, rank)
    heartbeat.start()
    stop = StopFlag.from_config(cfg, ctx.side_group)
    trainer = Trainer(cfg, ctx, work, stop, telemetry, heartbeat)
    assert trainer.timer is not None and trainer.reducer_timing is not None
    timer, reducer = trainer.timer, trainer.reducer_timing
    feed = endless(trainer)
    interval = Interval()
    for _ in range(30):  # warm-up
        interval.add(trainer._train_step(feed), cfg.batch_size)
    cpu: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[..., Any], *fn_args: Any) -> Any:
        c0 = time.thread_time()
        out = fn(*fn_args)
        cpu.setdefault(name, []).append(time.thread_time() - c0)
        return out

    for _ in range(args.reports):
        interval.add(trainer._train_step(feed), cfg.batch_size)
        trainer.pos.step += 1
        step = trainer.pos.step
        row = timed("report row", trainer._row, interval)
        timed("  reducer read", reducer.read)
        timed("  _get_ddp_logging_data", trainer.model._get_ddp_logging_data)
        timed("  step timer collect", timer.collect)
        timed("row tensor", partial(torch.tensor, dtype=torch.float64), [0.0, 0.01, *row])
        done = timed("round", stop.gather, step, row)
        timed("rank entries", rank_entries, done.reports(), trainer.places, None)
        timed("publish", trainer.reporter.publish, [done], step, 0)
    if telemetry is not None:
        telemetry.flush()
        line = (work / "metrics.jsonl").read_text().splitlines()[-1]
        message = json.loads(line)
        for _ in range(300):
            timed("encode (telemetry thread)", encode, finite(message))
        Path(args.out).write_text(json.dumps({
            "median_us": {k: 1e6 * statistics.median(v) for k, v in cpu.items()},
            "line_bytes": len(line)}))
    heartbeat.close()
    if telemetry is not None:
        telemetry.close()
    teardown()


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reports", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=512)


if __name__ == "__main__":
    main(__doc__, launch, rank_side, options)
