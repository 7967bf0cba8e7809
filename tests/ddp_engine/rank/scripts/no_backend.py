"""A DDP script as current tutorials write it: ``dist.init_process_group()`` with no backend
(torch picks cpu:gloo,cuda:nccl), the device from LOCAL_RANK when there is a GPU. Rank 0
writes its loss of every step and the final weights to --out. It never imports rankscope."""

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
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()

    dist.init_process_group()
    rank = dist.get_rank()
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)
    model = DDP(nn.Linear(12, 3).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    losses: dict[int, float] = {}
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 12, generator=g)
        y = x[:, :3].argmax(1)
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[step] = loss.item()
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(losses, f)
    dist.barrier()  # every rank done (rank 0 wrote its files) before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
