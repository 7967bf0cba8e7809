"""A GAN as the DCGAN example trains one: a generator and a discriminator, each in its own DDP,
each with its own Adam; per iteration a discriminator step (real and fake in one batch), then a
generator step. Rank 0 writes both losses of every iteration and both final weights to --out.
--iterations 0 trains until stopped. It never imports rankscope."""

import argparse
import itertools
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
    p.add_argument("--iterations", type=int, default=15)
    args = p.parse_args()

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    netG = DDP(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)))
    netD = DDP(nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1)))
    optD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    g = torch.Generator().manual_seed(rank)
    ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)
    losses: dict[int, list[float]] = {}
    steps = range(1, args.iterations + 1) if args.iterations else itertools.count(1)
    for it in steps:
        real = torch.randn(32, 2, generator=g) * 0.5 + torch.tensor([2.0, -1.0])
        fake = netG(torch.randn(32, 4, generator=g))
        errD = F.binary_cross_entropy_with_logits(
            netD(torch.cat([real, fake.detach()])), torch.cat([ones, zeros]))
        optD.zero_grad()
        errD.backward()
        optD.step()
        errG = F.binary_cross_entropy_with_logits(netD(fake), ones)
        optG.zero_grad()
        errG.backward()
        optG.step()
        losses[it] = [errD.item(), errG.item()]
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save({"G": netG.module.state_dict(), "D": netD.module.state_dict()},
                   os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(losses, f)
    dist.barrier()  # every rank done (rank 0 wrote its files) before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
