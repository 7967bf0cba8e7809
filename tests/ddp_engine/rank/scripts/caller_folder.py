"""A DDP script that reads ``--data`` and writes ``--out`` as given: relative paths mean the
folder it was started in (the caller's, as with torchrun). ``--data`` has one sample a line,
four inputs and a target separated by spaces. Rank 0 writes the final weights and the folder
it ran in to ``--out`` (JSON). It never imports rankscope."""

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
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(args.data) as f:  # FileNotFoundError unless run in the caller's folder
        rows = torch.tensor([[float(v) for v in line.split()] for line in f if line.strip()])
    shard = rows[rank::world]
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(args.steps):
        loss = F.mse_loss(model(shard[:, :4]), shard[:, 4:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        weights = [v for t in model.module.state_dict().values() for v in t.flatten().tolist()]
        with open(args.out, "w") as f:
            json.dump({"cwd": os.getcwd(), "weights": weights}, f)
    dist.barrier()  # every rank done (rank 0 wrote its files) before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
