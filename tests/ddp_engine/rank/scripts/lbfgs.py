"""A closure optimizer: LBFGS on a DDP model, whose ``optimizer.step(closure)`` runs forward
and backward several times inside one step (as Lightning's automatic optimization runs its
closure; --closure-work-s: work in the closure before its forward, such as a batch's
preparation). Rank 0 writes the loss each step returned (the closure's first evaluation) and the
final weights to --out. It never imports rankscope."""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--closure-work-s", type=float, default=0.0)
    args = p.parse_args()

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=5)
    g = torch.Generator().manual_seed(rank)
    losses: dict[int, float] = {}
    for step in range(1, args.steps + 1):
        x = torch.randn(64, 6, generator=g)
        y = torch.sin(x[:, :1]) + x[:, 1:2]

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            opt.zero_grad()
            time.sleep(args.closure_work_s)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            return loss

        losses[step] = opt.step(closure).item()
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(losses, f)
    dist.barrier()  # every rank done (rank 0 wrote its files) before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
