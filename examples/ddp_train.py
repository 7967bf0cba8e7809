"""An ordinary DDP training script, written as the PyTorch tutorials teach. It knows nothing
of Rankscope: run it with plain torchrun, or watch it with Rankscope, unchanged.

    torchrun --nproc-per-node 2 examples/ddp_train.py --epochs 3
    python -m ddp_engine launch --script examples/ddp_train.py --nproc 2 -- --epochs 3
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_dataset(samples: int, features: int, classes: int) -> TensorDataset:
    """A learnable classification problem: the label is the argmax of a fixed projection."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ w).argmax(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser(description="Train an MLP with DDP")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--checkpoint", default="checkpoint.pt",
                        help="where rank 0 saves the model at the end")
    args = parser.parse_args()

    # torchrun sets RANK, LOCAL_RANK and WORLD_SIZE.
    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    dataset = make_dataset(args.samples, 32, 10)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10)).to(device)
    model = DDP(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=args.epochs * len(loader))

    try:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)  # a different shuffle every epoch
            total, batches = 0.0, 0
            started = time.perf_counter()
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                scheduler.step()
                total += loss.item()
                batches += 1
            rate = batches * args.batch_size * dist.get_world_size() / (
                time.perf_counter() - started)
            if rank == 0:
                print(f"epoch {epoch}: mean loss {total / max(batches, 1):.4f}, "
                      f"{rate:.0f} samples/s", flush=True)
        if rank == 0:
            torch.save(model.module.state_dict(), args.checkpoint)
            print(f"saved {args.checkpoint}", flush=True)
        dist.barrier()  # every rank waits for rank 0's save before the group is destroyed
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
