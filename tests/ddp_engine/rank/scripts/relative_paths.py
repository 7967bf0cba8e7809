"""A DDP script that reads --train-file and writes --out as given, relative paths meaning the
folder it was started from (the caller's, as with torchrun). The file has one sample a line:
six inputs and a target, separated by commas. Rank 0 writes its loss of every step and the
final weights to --out. It never imports rankscope."""

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
    p.add_argument("--train-file", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(args.train_file) as f:
        rows = torch.tensor([[float(v) for v in line.split(",")] for line in f if line.strip()])
    shard = rows[rank::world]
    torch.manual_seed(0)
    model = DDP(nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses: dict[int, float] = {}
    for _ in range(args.epochs):
        for batch in shard.split(16):
            loss = F.mse_loss(model(batch[:, :6]), batch[:, 6:])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[len(losses) + 1] = loss.item()
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(losses, f)
    dist.barrier()  # every rank done (rank 0 wrote its files) before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
