"""The PyTorch DDP tutorial's recipe with a DataLoader that has worker processes
(``num_workers=2``): init_process_group, a DistributedSampler with set_epoch, DDP, an LR
scheduler, and a rank-0 save at the end. Rank 0 writes its loss of every step and the final
weights to --out. It never imports rankscope."""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Blobs(Dataset):
    """Two Gaussian blobs in 10 dimensions, made from a fixed seed."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.y = torch.randint(0, 2, (n,), generator=g)
        self.x = torch.randn(n, 10, generator=g) + self.y[:, None].float()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--num-workers", type=int, default=2)
    args = p.parse_args()

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = Blobs(args.samples)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler, num_workers=args.num_workers)
    model = DDP(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    losses: dict[int, float] = {}
    try:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses[len(losses) + 1] = loss.item()
            sched.step()
            if rank == 0:
                print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
        if rank == 0:
            os.makedirs(args.out, exist_ok=True)
            torch.save(model.module.state_dict(), os.path.join(args.out, "weights.pt"))
            with open(os.path.join(args.out, "losses.json"), "w") as f:
                json.dump(losses, f)
        dist.barrier()  # every rank done (rank 0 wrote its files) before the group goes
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
