"""A DDP script whose rank 0 evaluates and saves after training while the other ranks go
straight on to destroy_process_group, as many scripts end. The evaluation takes --epilogue-s
seconds; --pg-timeout-s sets the process group's timeout (torch's default when not given).
Rank 0 writes its loss of every step and the final weights to --out. It never imports
rankscope."""

import argparse
import datetime
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
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--epilogue-s", type=float, default=10.0)
    p.add_argument("--pg-timeout-s", type=float, default=None)
    args = p.parse_args()

    timeout = None if args.pg_timeout_s is None else datetime.timedelta(seconds=args.pg_timeout_s)
    dist.init_process_group(backend="gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(12, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    losses: dict[int, float] = {}
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 12, generator=g)
        loss = F.mse_loss(model(x), x[:, :3].sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[step] = loss.item()
    if rank == 0:  # a long final evaluation, then the save: rank 0 alone
        deadline = time.monotonic() + args.epilogue_s
        with torch.no_grad():
            while time.monotonic() < deadline:
                model.module(torch.randn(256, 12, generator=g))
                time.sleep(0.05)
        os.makedirs(args.out, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
