"""A custom training loop that uses Rankscope's small API (``import rankscope``).

It builds no DistributedDataParallel and takes no optimizer step: it averages gradients with
its own all_reduce and updates the weights by hand. So Rankscope cannot find its steps by
itself: ``rankscope.should_stop()`` ends each step (and says when every rank agreed to stop),
``rankscope.log`` adds series, ``rankscope.on_stop`` saves the script's own checkpoint. Outside
Rankscope (plain torchrun) every call does nothing and the script runs as it is:

    torchrun --nproc-per-node 2 examples/custom_loop.py --steps 200
    python -m ddp_engine launch --script examples/custom_loop.py --nproc 2 -- --steps 200
"""

import argparse
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

import rankscope


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    true_w = torch.randn(16, 1, generator=g)
    torch.manual_seed(0)  # the same initial weights on every rank
    w = torch.zeros(16, 1, requires_grad=True)
    data = torch.Generator().manual_seed(1 + rank)  # each rank its own samples

    step = 0

    @rankscope.on_stop
    def checkpoint() -> dict:
        return {"w": w.detach().clone(), "step": step}  # Rankscope saves it on rank 0

    try:
        for step in range(1, args.steps + 1):
            x = torch.randn(args.batch_size, 16, generator=data)
            y = x @ true_w + 0.01 * torch.randn(args.batch_size, 1, generator=data)
            loss = F.mse_loss(x @ w, y)
            loss.backward()
            assert w.grad is not None
            dist.all_reduce(w.grad)  # average the gradient by hand
            w.grad /= world
            lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
            with torch.no_grad():
                w -= lr * w.grad
                w.grad = None
            # A tensor is read on reporting steps only: no sync per step.
            rankscope.log(lr=lr, weight_error=(w.detach() - true_w).norm())
            if rankscope.should_stop():  # every rank gets the same answer at the same step
                if rank == 0:
                    print(f"stopping at step {step}, as asked", flush=True)
                break
        if rank == 0:
            print(f"done at step {step}: loss {loss.item():.5f}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
