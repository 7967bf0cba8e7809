"""Mixed precision on CPU as torch.amp documents it: bf16 autocast and a GradScaler. Rank 0
meets a bad batch (an infinite loss) at the iterations in --inf-at: the all-reduced gradients
are then infinite on every rank, and the scaler skips that optimizer step on both (rank 1 with
a finite loss). Each rank writes its loss of every iteration and the iterations whose step was
skipped; rank 0 the final weights. It never imports rankscope."""

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
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--inf-at", default="5,11")
    args = p.parse_args()
    inf_at = {int(i) for i in args.inf_at.split(",") if i}

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    g = torch.Generator().manual_seed(rank)
    losses: dict[int, float] = {}
    skipped: list[int] = []
    for it in range(1, args.iterations + 1):
        x = torch.randn(32, 16, generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        loss = F.mse_loss(out.float(), x[:, :4].sum(1, keepdim=True))
        if rank == 0 and it in inf_at:
            loss = loss * float("inf")  # a bad batch
        opt.zero_grad()
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses[it] = loss.item()
        if scaler.get_scale() < scale:
            skipped.append(it)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"losses-rank{rank}.json"), "w") as f:
        json.dump({"losses": losses, "skipped": skipped}, f)
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(args.out, "weights.pt"))
    dist.barrier()  # every rank done (rank 0 wrote its files) before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
