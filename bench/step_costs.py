"""Where the engine's per-step time goes: its pieces added one at a time, in one 2-rank run.

    .venv/bin/python bench/step_costs.py [--blocks 30] [--block-steps 40] [--hidden 512]

Runs itself under torchrun (2 CPU ranks, gloo, OMP_NUM_THREADS=1) on the workload of
bench/telemetry_overhead.py. Within one process pair it alternates blocks of steps of each
variant below, in a rotating order, and reports each variant's median seconds per step over
the blocks and its cost against ``plain``, in microseconds per step. Alternating blocks of
well under a second inside one run shares the machine's noise far better than separate runs.

- ``plain``: the standard step on its own DDP model (data, forward, backward, SGD step);
- ``step``: the engine's ``Trainer._train_step`` with telemetry off (no hook, no timing);
- ``timed``: the same with telemetry on (the timing comm hook, the phase stamps, the
  heartbeat's phase updates; the device sampler and heartbeat threads run);
- ``timed-div``: ``timed`` with the hook as it was before 2026-12-04's change: the hook divides
  every gradient bucket by the world size (a pass over all gradients) instead of the step
  dividing its loss;
- ``+rounds``: ``timed`` plus the agreed-stop rounds as the engine runs them by default (an
  asynchronous all-gather every 10 steps, read a round later);
- ``+rounds5``: the same with rounds every 5 steps (the default before 2026-12-04);
- ``+reports``: ``+rounds`` plus a report every 10 steps (loss, timing, device readings,
  gathered in the rounds, published by rank 0 to metrics.jsonl through the telemetry thread);
- ``sync-rounds``: ``timed`` plus the agreed-stop check as before issue 16: a synchronous
  all-reduce every 5 steps that the step waits for.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("plain", "step", "timed", "timed-div", "+rounds", "+rounds5", "+reports",
            "sync-rounds")
PAIRS = (("timed-div", "timed"), ("+rounds5", "+rounds"))
"""The 2026-12-04 changes, each against what it replaced."""


def launch(args: argparse.Namespace) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", __file__, "--rank-side", "--out", str(out),
                        "--blocks", str(args.blocks), "--block-steps", str(args.block_steps),
                        "--hidden", str(args.hidden)], check=True, env=env, cwd=REPO)
        got = json.loads(out.read_text())
    result, blocks = got["median"], got["blocks"]
    print(f"mlp 256-{args.hidden}-{args.hidden}-10, batch 64/rank, SGD, 2 CPU ranks (gloo); "
          f"{args.blocks} blocks of {args.block_steps} steps per variant, rotating")
    base = result["plain"]
    print("variant        median ms/step   cost vs plain, us/step   as a share of plain")
    for name in VARIANTS:
        v = result[name]
        print(f"  {name:<12} {1000 * v:10.3f}       {1e6 * (v - base):+10.0f}              "
              f"{(v - base) / base:+7.1%}")
    print("side by side, block by block (the same block of the run): before - now")
    for before, now in PAIRS:
        diffs = [a - b for a, b in zip(blocks[before], blocks[now], strict=True)]
        print(f"  {before:<10} - {now:<8} median {1e6 * statistics.median(diffs):+6.0f} us/step, "
              f"{sum(d > 0 for d in diffs)}/{len(diffs)} blocks slower")


def rank_side(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO))
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
    cfg = RunConfig(model="mlp", model_args={"hidden": args.hidden, "depth": 2},
                    dataset="synthetic", dataset_args={"num_samples": 80_000, "val_samples": 0,
                                                       "input_shape": [256]},
                    device="cpu", max_steps=10**9, eval_every=0, batch_size=64,
                    optimizer="sgd", lr=0.01, momentum=0.0)
    work = Path(tempfile.mkdtemp(prefix=f"step-costs-{rank}-"))
    (work / "checkpoints").mkdir()
    telemetry = (Telemetry(work, welcome_extra={}, on_stop=lambda _why: None)
                 if rank == 0 else None)
    (work / "ranks").mkdir()
    heartbeat = Heartbeat(work, rank)
    heartbeat.start()
    stop_flag = StopFlag(cfg.stop_check_every, ctx.side_group)  # the default: 10
    every5 = StopFlag(5, ctx.side_group)
    untimed = Trainer(RunConfig(**{**cfg.to_dict(), "telemetry": False}), ctx, work,
                      StopFlag(5, ctx.side_group))
    timed = Trainer(cfg, ctx, work, stop_flag, telemetry, heartbeat)
    timed_div = Trainer(cfg, ctx, work, StopFlag(5, ctx.side_group), None, heartbeat)
    assert timed_div.timer is not None
    timed_div.timer.divide, timed_div._loss_factor = True, 1.0  # the hook divides, as before
    assert timed.device_sampler is not None
    timed.device_sampler.start()  # as in a run: the rank's device readings at 2 Hz
    torch.manual_seed(cfg.seed)
    plain_model = DDP(build_model(cfg, untimed.data.info))
    plain_opt = torch.optim.SGD(plain_model.parameters(), lr=0.01)
    flag = torch.zeros(2, dtype=torch.float64)
    interval = Interval()
    step = {"n": 0}

    def batches(trainer: Trainer):
        while True:
            yield from trainer.loader

    feeds = {id(t): batches(t) for t in (untimed, timed, timed_div)}
    plain_feed = batches(untimed)

    def plain_step() -> None:
        x, y = next(plain_feed)
        loss = torch.nn.functional.cross_entropy(plain_model(x), y)
        loss.backward()
        plain_opt.step()
        plain_opt.zero_grad(set_to_none=True)

    def engine_step(trainer: Trainer, rounds: str, reports: bool,
                    flags: StopFlag = stop_flag) -> None:
        loss = trainer._train_step(feeds[id(trainer)])
        step["n"] += 1
        n = step["n"]
        interval.add(loss, 64)
        if rounds == "async":
            trainer.pos.step = n
            trainer._phase("stop_check")
            got = flags.after_step(
                n, (lambda: trainer._row(interval)) if reports and n % 10 == 0 else None)
            trainer._publish(got)
        elif rounds == "sync" and n % 5 == 0:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ctx.side_group)

    runs = {
        "plain": plain_step,
        "step": lambda: engine_step(untimed, "", False),
        "timed": lambda: engine_step(timed, "", False),
        "timed-div": lambda: engine_step(timed_div, "", False),
        "+rounds": lambda: engine_step(timed, "async", False),
        "+rounds5": lambda: engine_step(timed, "async", False, every5),
        "+reports": lambda: engine_step(timed, "async", True),
        "sync-rounds": lambda: engine_step(timed, "sync", False),
    }
    per_step: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(5):  # warm-up: DDP rebuilds its buckets after the first iterations
        for name in VARIANTS:
            runs[name]()
    for flags in (stop_flag, every5):  # nothing left pending between blocks
        flags.after_step(step["n"] + 1, flush=True)
    for block in range(args.blocks):
        k = block % len(VARIANTS)
        for name in VARIANTS[k:] + VARIANTS[:k]:
            step["n"] = -(-step["n"] // 10) * 10  # blocks start on a round boundary
            dist.barrier(group=ctx.side_group)
            t0 = time.perf_counter()
            for _ in range(args.block_steps):
                runs[name]()
            per_step[name].append((time.perf_counter() - t0) / args.block_steps)
            for flags in (stop_flag, every5):
                flags.settle()  # read what the block left, outside its time
                # the next block's rounds pace themselves on its own steps, not on the gap
                flags._next, flags._last = None, (0, 0.0)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"median": {k: statistics.median(v)
                                                         for k, v in per_step.items()},
                                              "blocks": per_step}))
    heartbeat.close()
    if telemetry is not None:
        telemetry.close()
    teardown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--block-steps", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_side:
        rank_side(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
