"""What the gradient comm hook and the agreed-stop rounds cost, each against the bare step, in
one 2-rank run (issue 16's analysis).

    .venv/bin/python bench/sync_costs.py [--hidden 1024] [--blocks 12] [--block-steps 25]

Runs itself under torchrun (2 CPU ranks, gloo, OMP_NUM_THREADS=1): an MLP 256-H-H-10, batch
64, SGD, on fixed tensors (no data loader). Variants alternate in blocks of steps, rotating:

- ``c++``: DDP's own all-reduce (no comm hook): the reference;
- ``stock-py``: ``default_hooks.allreduce_hook``, PyTorch's Python hook doing the same;
- ``timer``: the engine's timing hook (``StepTimer.hook``) with its per-step bookkeeping;
- ``no-div``: a hook that only all-reduces, the loss divided by the world size instead;
- ``rounds-side``: ``c++`` plus the engine's ``StopFlag.after_step`` on a gloo side group (an
  asynchronous all-gather every 5 steps, read a round later), as the engine runs it;
- ``rounds-default``: the same rounds on the default group;
- ``sync-side``: ``c++`` plus a synchronous all-reduce every 5 steps on the side group.

Each variant prints its median ms per step, its cost against ``c++`` and, for the rounds, the
main thread's time inside ``after_step`` per step.
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
HOOKS = ("c++", "stock-py", "timer", "no-div")
ROUNDS = ("rounds-side", "rounds-default", "sync-side")


def launch(args: argparse.Namespace) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", __file__, "--rank-side", "--out", str(out),
                        "--hidden", str(args.hidden), "--blocks", str(args.blocks),
                        "--block-steps", str(args.block_steps)],
                       check=True, env=env, cwd=REPO)
        result = json.loads(out.read_text())
    print(f"mlp 256-{args.hidden}-{args.hidden}-10, batch 64/rank, SGD, 2 CPU ranks (gloo); "
          f"{args.blocks} blocks of {args.block_steps} steps per variant, rotating")
    base = result["c++"]["step"]
    print("variant          median ms/step   cost vs c++, us/step   in after_step, us/step")
    for name in (*HOOKS, *ROUNDS):
        v = result[name]
        inside = f"{1e6 * v['inside']:8.0f}" if name in ROUNDS else ""
        print(f"  {name:<14} {1000 * v['step']:10.3f}      {1e6 * (v['step'] - base):+10.0f}"
              f"             {inside}")


def rank_side(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO))
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_engine.rank.distributed import StopFlag
    from ddp_engine.rank.sync_timing import StepTimer

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    side = dist.new_group(backend="gloo")
    h = args.hidden

    def mlp() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(256, h), torch.nn.ReLU(), torch.nn.Linear(h, h),
                                   torch.nn.ReLU(), torch.nn.Linear(h, 10))

    def bare(_state, bucket):  # type: ignore[no-untyped-def]  # DDP reads no string annotations
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    plain = DDP(mlp())
    models = {"c++": plain}
    stock = DDP(mlp())
    stock.register_comm_hook(None, default_hooks.allreduce_hook)
    models["stock-py"] = stock
    timer = StepTimer(torch.device("cpu"))
    timed = DDP(mlp())
    timed.register_comm_hook(None, timer.hook)
    models["timer"] = timed
    nodiv = DDP(mlp())
    nodiv.register_comm_hook(None, bare)
    models["no-div"] = nodiv
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in models.items()}
    flags = {"rounds-side": StopFlag(5, side), "rounds-default": StopFlag(5, dist.group.WORLD)}
    flag_tensor = torch.zeros(2, dtype=torch.float64)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    count = {"n": 0}

    def step(name: str) -> float:
        model_name = name if name in HOOKS else "c++"
        model = models[model_name]
        loss = torch.nn.functional.cross_entropy(model(x), y)
        (loss / world if model_name == "no-div" else loss).backward()
        opts[model_name].step()
        opts[model_name].zero_grad(set_to_none=True)
        if model_name == "timer":
            timer.end_step()
            timer.collect()
        count["n"] += 1
        t0 = time.perf_counter()
        if name in flags:
            flags[name].after_step(count["n"])
        elif name == "sync-side" and count["n"] % 5 == 0:
            dist.all_reduce(flag_tensor, group=side)
        return time.perf_counter() - t0

    names = [*HOOKS, *ROUNDS]
    for name in names:  # warm-up: DDP rebuilds its buckets after the first iterations
        for _ in range(10):
            step(name)
    per_step: dict[str, list[float]] = {n: [] for n in names}
    inside: dict[str, list[float]] = {n: [] for n in names}
    for block in range(args.blocks):
        k = block % len(names)
        for name in names[k:] + names[:k]:
            count["n"] = -(-count["n"] // 5) * 5  # blocks start on a round boundary
            dist.barrier()
            t0 = time.perf_counter()
            spent = sum(step(name) for _ in range(args.block_steps))
            per_step[name].append((time.perf_counter() - t0) / args.block_steps)
            inside[name].append(spent / args.block_steps)
            for f in flags.values():
                f.settle()  # nothing left pending between blocks
                f._next, f._last = None, (0, 0.0)
    if rank == 0:
        Path(args.out).write_text(json.dumps({
            n: {"step": statistics.median(per_step[n]), "inside": statistics.median(inside[n])}
            for n in names}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--block-steps", type=int, default=25)
    parser.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rank_side(args) if args.rank_side else launch(args)


if __name__ == "__main__":
    main()
