"""Data parallel over a sub-group, as in tensor- or pipeline-parallel plus DDP: 4 ranks, two
data-parallel groups {0, 1} and {2, 3}, ``DDP(model, process_group=dp_group)``. The groups
train on different targets, so their weights differ. Each rank writes its loss of every step;
the first rank of each group its group's final weights. It never imports rankscope."""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=15)
    args = p.parse_args()

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group(list(range(k, k + 2))) for k in range(0, world, 2)]  # every rank
    dp = rank // 2
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1), process_group=groups[dp])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    losses: dict[int, float] = {}
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 8, generator=g)
        y = x[:, :2].sum(1, keepdim=True) * (1 + 2 * dp)  # each group its own target
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[step] = loss.item()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"losses-rank{rank}.json"), "w") as f:
        json.dump(losses, f)
    if rank % 2 == 0:
        torch.save(model.module.state_dict(), os.path.join(args.out, f"weights-group{dp}.pt"))
    # Every rank at once: gloo's destroy_process_group with sub-groups can hang (torch 2.13)
    # when a rank destroys them while another is still saving.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
