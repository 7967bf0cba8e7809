"""A plain DDP script for the stacks tests: rank 1 stays in a loop of its own at ``--stuck-at``
(between its forward and its backward) while the other ranks go on into DDP's backward and
wait there for its gradients. It never imports rankscope."""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def spin() -> None:
    """Rank 1's endless loop (the line the stacks must name)."""
    while True:
        time.sleep(0.05)  # rank 1 stands here


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stuck-at", type=int, default=3)
    args = p.parse_args()
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 1_000_000):
        x = torch.randn(16, 8)
        loss = F.cross_entropy(model(x), (x[:, 0] > 0).long())
        opt.zero_grad()
        if dist.get_rank() == 1 and step == args.stuck_at:
            spin()
        loss.backward()  # rank 0 waits here, in DDP's gradient all-reduce
        opt.step()


if __name__ == "__main__":
    main()
