"""What on-demand profiles (issue 31) cost: nothing measurable while no profile is asked for,
and how much a profiled step and writing its trace take when one is.

    .venv/bin/python bench/profile_overhead.py [--steps 400] [--hidden 512]

Runs itself under torchrun (2 CPU ranks, gloo, OMP_NUM_THREADS=1) on the overhead workload
(bench/telemetry_overhead.py's MLP, the default width), with a real Trainer. Rank 0 reports:

- ``idle hook``: ``RankProfiler.after_step`` while nothing is asked (what every step of every
  run pays), timed over 100,000 calls in a row (median of 5 such loops): one clock read costs
  more than a call on these machines;
- ``round``: the round's all-gather with its three profile columns against the same all-gather
  without them (what each round pays), interleaved pair by pair (each first in turn), medians
  and their ratio;
- ``step``: the training step's wall time, median over ``--steps`` steps, against which the
  two above are put;
- a profile of 5 steps taken as the app takes it (agreed in a round): the wall time of the
  warm-up step and of the recorded steps against the unprofiled median, and the time to write
  the trace (on the training thread) and to summarize both ranks' traces (rank 0's thread).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.two_ranks import endless, main, on_two_ranks, workload  # noqa: E402


def launch(args: argparse.Namespace) -> None:
    got = on_two_ranks(__file__, ["--steps", str(args.steps), "--hidden", str(args.hidden)])
    step_us = got["step_us"]
    print(f"mlp 256-{args.hidden}-{args.hidden}-10, 2 CPU ranks (gloo), default settings; "
          f"rank 0, {args.steps} steps")
    print(f"  step (wall, median)           {step_us:9.1f} us")
    print(f"  idle hook per step            {got['hook_us']:9.3f} us  "
          f"= {got['hook_us'] / step_us:.5%} of a step")
    r = got["round"]
    print(f"  round all-gather, with / without the profile columns: {r['with_us']:.1f} / "
          f"{r['without_us']:.1f} us (ratio {r['with_us'] / r['without_us']:.3f}, "
          f"{r['pairs']} pairs)")
    p = got["profile"]
    print(f"  profiled: warm-up step {p['warmup_us'] / step_us:.2f}x, recorded steps "
          f"{statistics.median(p['recorded_us']) / step_us:.2f}x the unprofiled step (median "
          f"of {len(p['recorded_us'])}); trace written in {p['write_ms']:.0f} ms "
          f"({p['trace_kib']:.0f} KiB gzipped), summarized in {p['summary_ms']:.0f} ms")


def rank_side(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from ddp_engine.common.profile_files import profile_folders, traces
    from ddp_engine.rank.distributed import ROW_HEAD, StopFlag, init_distributed, teardown
    from ddp_engine.rank.profile_ask import answer
    from ddp_engine.rank.reports import REPORT_FIELDS
    from ddp_engine.rank.trainer import Trainer

    ctx = init_distributed("cpu", 120)
    rank = ctx.info.rank
    cfg = workload(args.hidden)
    work = Path(tempfile.gettempdir()) / f"profile-overhead-{os.environ['MASTER_PORT']}"
    (work / "checkpoints").mkdir(parents=True, exist_ok=True)  # one run folder, as in a run:
    (work / "ranks").mkdir(exist_ok=True)  # rank 0 reads every rank's trace there
    stop = StopFlag.from_config(cfg, ctx.side_group)
    said: list[tuple[str, dict[str, Any]]] = []
    trainer = Trainer(cfg, ctx, work, stop, None, None)
    profiler = trainer.profiler
    profiler.event = (lambda kind, **f: said.append((kind, f))) if rank == 0 else None
    feed = endless(trainer)
    for _ in range(30):  # warm-up
        trainer._train_step(feed)
    steps = []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        trainer._train_step(feed)
        steps.append(time.perf_counter() - t0)
        profiler.after_step(step)
    # the hook alone, many calls in a row (a clock read costs more than one call here)
    hook = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(HOOK_CALLS):
            profiler.after_step(args.steps)
        hook.append((time.perf_counter() - t0) / HOOK_CALLS)
    # the round: the same all-gather with and without the three profile columns
    width = ROW_HEAD + len(REPORT_FIELDS)
    with_cols, without = [], []
    for i in range(args.steps):  # each pair in turn first: the first of a pair may wait more
        pair = ((width, with_cols), (width - 3, without))
        for n, into in pair if i % 2 else pair[::-1]:
            row = torch.zeros(n, dtype=torch.float64)
            rows = [torch.empty_like(row) for _ in range(2)]
            t0 = time.perf_counter()
            dist.all_gather(rows, row, group=ctx.side_group)
            into.append(time.perf_counter() - t0)
    # a profile, agreed as in a run: rank 0 asks, a round carries it
    if rank == 0:
        answer(stop.profile, work, {"type": "profile", "steps": 5})
    stop.gather(args.steps, [])
    profiled, step = [], args.steps + 1
    write_s = 0.0
    while True:
        was = profiler.active  # this step runs under the profiler (warm-up or recorded)
        t0 = time.perf_counter()
        trainer._train_step(feed)
        t1 = time.perf_counter()
        profiler.after_step(step)
        t2 = time.perf_counter()
        if was:
            profiled.append(t1 - t0)
            write_s = t2 - t1  # the last one: its trace written
        step += 1
        if profiled and not profiler.active:
            break
    t0 = time.perf_counter()
    for thread in profiler.summaries:
        thread.join(120)
    summary_s = time.perf_counter() - t0
    dist.barrier(group=ctx.side_group)
    if rank == 0:
        folder = profile_folders(work)[-1]
        written = [f for k, f in said if f.get("state") == "written"]
        Path(args.out).write_text(json.dumps({
            "step_us": 1e6 * statistics.median(steps),
            "hook_us": 1e6 * statistics.median(hook),
            "round": {"with_us": 1e6 * statistics.median(with_cols),
                      "without_us": 1e6 * statistics.median(without), "pairs": args.steps},
            "profile": {"warmup_us": 1e6 * profiled[0],
                        "recorded_us": [1e6 * s for s in profiled[1:]],
                        "write_ms": 1e3 * write_s,
                        "trace_kib": traces(folder)[0].stat().st_size / 1024,
                        "summary_ms": 1e3 * (written[0]["analysis_s"] if written
                                              else summary_s)}}))
    teardown()
    if rank == 0:
        shutil.rmtree(work, ignore_errors=True)


HOOK_CALLS = 100_000


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--hidden", type=int, default=512)


if __name__ == "__main__":
    main(__doc__, launch, rank_side, options)
