"""Staged training, as in fine-tuning: stage 1 trains the head of a frozen backbone (DDP over
the head's parameters, SGD); stage 2 unfreezes everything and builds DDP and the optimizer
(Adam) again. Rank 0 writes its loss of every step (numbered across both stages) and the final
weights to --out. It never imports rankscope."""

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
    p.add_argument("--stage1", type=int, default=8)
    p.add_argument("--stage2", type=int, default=8)
    args = p.parse_args()

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(10, 24), nn.ReLU(), nn.Linear(24, 1))
    g = torch.Generator().manual_seed(rank)
    losses: dict[int, float] = {}

    def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
        for _ in range(steps):
            x = torch.randn(16, 10, generator=g)
            loss = F.mse_loss(model(x), x[:, :3].sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[len(losses) + 1] = loss.item()

    for param in net[0].parameters():  # stage 1: the backbone frozen
        param.requires_grad_(False)
    model = DDP(net)
    train(model, torch.optim.SGD(net[2].parameters(), lr=0.05), args.stage1)
    for param in net.parameters():  # stage 2: everything, a new DDP and a new optimizer
        param.requires_grad_(True)
    model = DDP(net)
    train(model, torch.optim.Adam(net.parameters(), lr=0.01), args.stage2)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save(net.state_dict(), os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(losses, f)
    dist.barrier()  # every rank done (rank 0 wrote its files) before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
