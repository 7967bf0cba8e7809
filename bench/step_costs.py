"""Where the engine's per-step time goes: its pieces added one at a time, in one 2-rank run.

    .venv/bin/python bench/step_costs.py [--blocks 30] [--block-steps 40] [--hidden 512]

Runs itself under torchrun (2 CPU ranks, gloo, OMP_NUM_THREADS=1) on the workload of
bench/telemetry_overhead.py. Within one process pair it alternates blocks of steps of each
variant below, in a rotating order, and reports each variant's median seconds per step over
the blocks and its cost against ``plain``, in microseconds per step. Alternating blocks of
well under a second inside one run shares the machine's noise far better than separate runs.

- ``plain``: the standard step on its own DDP model (data, forward, backward, SGD step);
- ``step``: the engine's ``Trainer._train_step`` with telemetry off (no timing);
- ``nohb``: the same with telemetry on but no heartbeat (the step timer's stamps, the
  reducer's sampled timers; the device sampler thread runs);
- ``timed``: ``nohb`` plus the heartbeat's phase updates, as in a run;
- ``hook``: ``timed`` with ``--sync-timing hook`` (Rankscope's comm hook on every step);
- ``+rounds``: ``timed`` plus the agreed-stop rounds as the engine ran them before issue 29 (an
  asynchronous all-gather every 10 steps, read a round later);
- ``+reports``: ``+rounds`` plus a report every 10 steps (loss, timing, device readings,
  gathered in the rounds, published by rank 0 to metrics.jsonl through the telemetry thread),
  as ``--log-every 10`` runs;
- ``+paced``: ``+rounds`` plus the reports at the default pace (issue 29: multiples of 10 steps
  at least 0.2 s apart, each with its round), as a run at the default settings. Give it blocks
  long enough to hold a few reports (``--block-steps 200`` at 5 ms steps).
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

VARIANTS = ("plain", "step", "nohb", "timed", "hook", "+rounds", "+reports", "+paced")
PAIRS = (("step", "plain"), ("nohb", "step"), ("timed", "nohb"), ("hook", "timed"),
         ("+rounds", "timed"), ("+reports", "+rounds"), ("+paced", "timed"),
         ("+paced", "+reports"))
"""Each piece against the variant without it."""


def launch(args: argparse.Namespace) -> None:
    got = on_two_ranks(__file__, ["--blocks", str(args.blocks), "--block-steps",
                                  str(args.block_steps), "--hidden", str(args.hidden)])
    result, blocks = got["median"], got["blocks"]
    print(f"mlp 256-{args.hidden}-{args.hidden}-10, batch 64/rank, SGD, 2 CPU ranks (gloo); "
          f"{args.blocks} blocks of {args.block_steps} steps per variant, rotating")
    base = result["plain"]
    cpu = got["cpu"]
    print("variant        median ms/step   cost vs plain, us/step   as a share of plain"
          "   main thread's CPU, ms/step (vs plain, us)")
    for name in VARIANTS:
        v = result[name]
        print(f"  {name:<12} {1000 * v:10.3f}       {1e6 * (v - base):+10.0f}              "
              f"{(v - base) / base:+7.1%}      {1000 * cpu[name]:8.3f} "
              f"({1e6 * (cpu[name] - cpu['plain']):+5.0f})")
    for name, rounds in got["rounds"].items():
        gaps = [b - a for a, b in zip(rounds, rounds[1:], strict=False)]
        print(f"rounds {name}: {len(rounds)}, steps apart: median {statistics.median(gaps)}, "
              f"min {min(gaps)} (blocks of each variant restart its schedule)")
    print("side by side, block by block (the same block of the run): with - without")
    for more, less in PAIRS:
        diffs = [a - b for a, b in zip(blocks[more], blocks[less], strict=True)]
        print(f"  {more:<10} - {less:<8} median {1e6 * statistics.median(diffs):+6.0f} us/step, "
              f"{sum(d > 0 for d in diffs)}/{len(diffs)} blocks slower")


def rank_side(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_engine.common.config import RunConfig
    from ddp_engine.common.heartbeat import Heartbeat
    from ddp_engine.rank.distributed import StopFlag, init_distributed, teardown
    from ddp_engine.rank.models import build_model
    from ddp_engine.rank.reports import Interval
    from ddp_engine.rank.telemetry import Telemetry
    from ddp_engine.rank.trainer import Trainer

    ctx = init_distributed("cpu", 120)
    rank = ctx.info.rank
    cfg = workload(args.hidden)
    work = rank_folder("step-costs", rank)
    telemetry = (Telemetry(work, welcome_extra={}, on_stop=lambda _why: None)
                 if rank == 0 else None)
    heartbeat = Heartbeat(work, rank)
    heartbeat.start()
    stop_flag = StopFlag(10, ctx.side_group)  # rounds and reports every 10 steps, as before
    paced = StopFlag.from_config(cfg, ctx.side_group)  # the defaults (issue 29)
    untimed = Trainer(RunConfig(**{**cfg.to_dict(), "telemetry": False}), ctx, work,
                      StopFlag.from_config(cfg, ctx.side_group))
    timed = Trainer(cfg, ctx, work, stop_flag, telemetry, heartbeat)
    nohb = Trainer(cfg, ctx, work, StopFlag.from_config(cfg, ctx.side_group))
    hooked = Trainer(RunConfig(**{**cfg.to_dict(), "sync_timing": "hook"}), ctx, work,
                     StopFlag.from_config(cfg, ctx.side_group), None, heartbeat)
    assert timed.device_sampler is not None and timed.reducer_timing is not None
    timed.device_sampler.start()  # as in a run: the rank's device readings at 2 Hz
    torch.manual_seed(cfg.seed)
    plain_model = DDP(build_model(cfg, untimed.data.info))
    plain_opt = torch.optim.SGD(plain_model.parameters(), lr=0.01)
    interval = Interval()
    step = {"n": 0}

    feeds = {id(t): endless(t) for t in (untimed, timed, nohb, hooked)}
    plain_feed = endless(untimed)

    def plain_step() -> None:
        x, y = next(plain_feed)
        loss = torch.nn.functional.cross_entropy(plain_model(x), y)
        loss.backward()
        plain_opt.step()
        plain_opt.zero_grad(set_to_none=True)

    def engine_step(trainer: Trainer, rounds: bool = False, reports: bool = False,
                    flag: StopFlag = stop_flag) -> None:
        loss = trainer._train_step(feeds[id(trainer)])
        step["n"] += 1
        n = step["n"]
        interval.add(loss, 64)
        if rounds:
            trainer.pos.step = n
            trainer._phase("stop_check")
            due = flag.report_due(n) if flag is paced else reports and n % 10 == 0
            got = flag.after_step(n, (lambda: trainer._report(interval)) if due else None)
            trainer.reporter.publish(got, n, 0)

    runs = {
        "plain": plain_step,
        "step": lambda: engine_step(untimed),
        "nohb": lambda: engine_step(nohb),
        "timed": lambda: engine_step(timed),
        "hook": lambda: engine_step(hooked),
        "+rounds": lambda: engine_step(timed, rounds=True),
        "+reports": lambda: engine_step(timed, rounds=True, reports=True),
        "+paced": lambda: engine_step(timed, rounds=True, flag=paced),
    }
    per_step: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}  # the main thread's CPU time
    for _ in range(5):  # warm-up: DDP rebuilds its buckets after the first iterations
        for name in VARIANTS:
            runs[name]()
    for flag in (stop_flag, paced):  # nothing left pending between blocks
        flag.after_step(step["n"] + 1, flush=True)
    for block in range(args.blocks):
        k = block % len(VARIANTS)
        for name in VARIANTS[k:] + VARIANTS[:k]:
            step["n"] = -(-step["n"] // 10) * 10  # blocks start on a round boundary
            dist.barrier(group=ctx.side_group)
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(args.block_steps):
                runs[name]()
            per_step[name].append((time.perf_counter() - t0) / args.block_steps)
            cpu[name].append((time.thread_time() - c0) / args.block_steps)
            for flag in (stop_flag, paced):
                flag.settle()  # read what the block left, outside its time
                # the next block's rounds pace themselves on its own steps, not on the gap
                flag._next, flag._last = None, (0, 0.0)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"median": {k: statistics.median(v)
                                                         for k, v in per_step.items()},
                                              "blocks": per_step,
                                              "cpu": {k: statistics.median(v)
                                                      for k, v in cpu.items()},
                                              "rounds": {"every 10": stop_flag.rounds,
                                                         "paced": paced.rounds}}))
    heartbeat.close()
    if telemetry is not None:
        telemetry.close()
    teardown()


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--block-steps", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=512)


if __name__ == "__main__":
    main(__doc__, launch, rank_side, options)
