"""A DDP model compiled with ``torch.compile``, as the DDP + compile tutorial does it
(``torch.compile(DDP(model))``). Rank 0 writes its loss of every step, the final weights and
the number of graph breaks dynamo counted (``torch._dynamo.utils.counters``) to --out. It never
imports rankscope."""

import argparse
import json
import os

import torch
import torch._dynamo
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.compile(DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    losses: dict[int, float] = {}
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 8, generator=g)
        loss = F.mse_loss(model(x), x[:, :2].sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[step] = loss.item()
    reasons = torch._dynamo.utils.counters["graph_break"]
    breaks = sum(reasons.values())
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(losses, f)
        with open(os.path.join(args.out, "graph_breaks.json"), "w") as f:
            json.dump({"graph_breaks": breaks,
                       "reasons": sorted({r.splitlines()[0] for r in reasons})}, f)
    dist.barrier()  # every rank done (rank 0 wrote its files) before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
