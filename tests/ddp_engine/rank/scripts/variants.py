"""A plain DDP script for the tests, with the variations real scripts have: its own comm hook
(Python or DDP's built-in), no DDP at all, an exception on one rank, sys.exit codes, and an
evaluation pass. It never imports rankscope."""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--hook", choices=["none", "python", "builtin"], default="none")
    p.add_argument("--no-ddp", action="store_true")
    p.add_argument("--raise-on-rank", type=int, default=-1)
    p.add_argument("--raise-at-step", type=int, default=5)
    p.add_argument("--exit-code", type=int, default=None)
    p.add_argument("--write-cwd", default=None, help="rank 0 writes its argv and cwd here")
    args = p.parse_args()

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    if args.write_cwd and rank == 0:
        with open(args.write_cwd, "w") as f:
            f.write(f"{os.getcwd()}\n{sys.argv!r}\n{__name__}\n{os.environ['WORLD_SIZE']}\n")
    torch.manual_seed(0)
    model: nn.Module = nn.Linear(8, 2)
    if not args.no_ddp:
        model = DDP(model)
        if args.hook == "python":
            model.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
        elif args.hook == "builtin":
            model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    try:  # as the tutorials do: destroy_process_group on the way out, an exception's too
        for step in range(1, args.steps + 1):
            x = torch.randn(16, 8, generator=g)
            y = (x[:, 0] > 0).long()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            if args.no_ddp:
                for param in model.parameters():
                    dist.all_reduce(param.grad)
                    param.grad /= dist.get_world_size()
            opt.step()
            if rank == args.raise_on_rank and step == args.raise_at_step:
                raise ValueError(f"bad batch at step {step}")
            if step % 10 == 0:
                with torch.no_grad():  # an evaluation pass: not a training batch
                    model(torch.randn(1000, 8, generator=g))
    finally:
        dist.destroy_process_group()
    if args.exit_code is not None:
        sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
