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
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("full", "nosample", "nohb", "notimer", "none")


def launch(args: argparse.Namespace) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", __file__, "--rank-side", "--out", str(out),
                        "--blocks", str(args.blocks), "--block-steps", str(args.block_steps),
                        "--hidden", str(args.hidden), "--sample-rate", str(args.sample_rate)],
                       check=True, env=env, cwd=REPO)
        got: dict[str, list[float]] = json.loads(out.read_text())
    print(f"mlp 256-{args.hidden}-{args.hidden}-10, batch 64/rank, SGD, 2 CPU ranks (gloo); "
          f"{args.blocks} blocks of {args.block_steps} steps per variant, one model")
    base = statistics.median(got["none"])
    print("variant     main thread's CPU per step: median (quartiles), us    vs none, us")
    for name in VARIANTS:
        q = statistics.quantiles(got[name], n=4)
        print(f"  {name:<9} {1e6 * statistics.median(got[name]):9.1f} ({1e6 * q[0]:.0f}.."
              f"{1e6 * q[2]:.0f})          {1e6 * (statistics.median(got[name]) - base):+7.1f}")


def rank_side(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO))
    from ddp_engine.common.config import RunConfig
    from ddp_engine.common.heartbeat import Heartbeat
    from ddp_engine.rank.distributed import StopFlag, init_distributed, teardown
    from ddp_engine.rank.trainer import Trainer

    ctx = init_distributed("cpu", 120)
    cfg = RunConfig(model="mlp", model_args={"hidden": args.hidden, "depth": 2},
                    dataset="synthetic", dataset_args={"num_samples": 80_000, "val_samples": 0,
                                                       "input_shape": [256]},
                    device="cpu", max_steps=10**9, eval_every=0, batch_size=64,
                    optimizer="sgd", lr=0.01, momentum=0.0)
    work = Path(tempfile.mkdtemp(prefix=f"step-toggles-{ctx.info.rank}-"))
    (work / "checkpoints").mkdir()
    (work / "ranks").mkdir()
    heartbeat = Heartbeat(work, ctx.info.rank)
    heartbeat.start()
    trainer = Trainer(cfg, ctx, work, StopFlag(cfg.stop_check_every, ctx.side_group), None,
                      heartbeat)
    timer = trainer.timer
    assert timer is not None and trainer.reducer_timing is not None

    def batches():
        while True:
            yield from trainer.loader

    feed = batches()

    def switch(name: str) -> None:
        trainer.heartbeat = None if name in ("nohb", "none") else heartbeat
        trainer.timer = None if name in ("notimer", "none") else timer
        trainer.model._set_ddp_runtime_logging_sample_rate(
            10**9 if name in ("nosample", "none") else args.sample_rate or cfg.log_every)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=60)
    parser.add_argument("--block-steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--sample-rate", type=int, default=0,
                        help="the reducer's sample rate in 'full' (default: the engine's)")
    parser.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_side:
        rank_side(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
