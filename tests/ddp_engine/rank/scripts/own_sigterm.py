"""A DDP script with its own SIGTERM handler, as scripts written for preemptible clusters have:
the handler sets a flag, the ranks agree on it every step (an all-reduce), leave the loop
together, and rank 0 saves --out/preempted.pt. Rank 0 writes its loss of every step and the
final weights to --out. --steps 0 trains until stopped. It never imports rankscope."""

import argparse
import itertools
import json
import os
import signal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

preempted = False


def on_sigterm(signum, frame) -> None:
    global preempted
    preempted = True
    print("SIGTERM: saving and leaving after this step", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(10, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    losses: dict[int, float] = {}
    os.makedirs(args.out, exist_ok=True)
    for step in range(1, args.steps + 1) if args.steps else itertools.count(1):
        x = torch.randn(16, 10, generator=g)
        loss = F.mse_loss(model(x), x[:, :2].sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[step] = loss.item()
        flag = torch.tensor(float(preempted))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "step": step},
                           os.path.join(args.out, "preempted.pt"))
            break
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(losses, f)
    dist.barrier()  # every rank done (rank 0 wrote its files) before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
