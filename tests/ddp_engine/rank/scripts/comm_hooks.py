"""A DDP script that registers a gradient communication hook, as users cut their sync cost:
``--hook fp16-builtin`` (DDP's C++ FP16_COMPRESS, ``_register_builtin_comm_hook``), ``fp16``
(torch's ``default_hooks.fp16_compress_hook``) or ``own`` (a Python hook of the script's own:
it averages each bucket itself). Rank 0 writes its loss of every step and the final weights to
--out. It never imports rankscope."""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


def averaged(group, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The script's own hook: the mean over the ranks, by hand."""
    buf = bucket.buffer().div_(dist.get_world_size())
    work = dist.all_reduce(buf, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--hook", choices=["fp16-builtin", "fp16", "own"], required=True)
    p.add_argument("--steps", type=int, default=15)
    args = p.parse_args()

    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1)))
    if args.hook == "fp16-builtin":
        model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    elif args.hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        model.register_comm_hook(None, averaged)
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
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(losses, f)
    dist.barrier()  # every rank done (rank 0 wrote its files) before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
