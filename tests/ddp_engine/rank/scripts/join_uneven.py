"""DDP's Join context manager for uneven inputs, as its tutorial uses it: rank r has
--batches + 3 * r batches; the ranks that run out early shadow the others' all-reduces until
every rank is done. Rank 0 writes its loss of every step and the final weights to --out. It
never imports rankscope."""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--batches", type=int, default=8)
    args = p.parse_args()

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    batches = [torch.randn(16, 6, generator=g) for _ in range(args.batches + 3 * rank)]
    losses: dict[int, float] = {}
    with Join([model]):
        for step, x in enumerate(batches, 1):
            loss = F.mse_loss(model(x), x[:, :2].sum(1, keepdim=True))
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
