"""FSDP2 (fully_shard) training as the PyTorch tutorial writes it, on CPU with gloo or on GPUs
with nccl: --mesh 2d shards over one mesh dimension and replicates over the other (HSDP). Rank 0
writes every step's loss to OUT/losses.json. It never imports rankscope."""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--mesh", choices=["1d", "2d"], default="1d")
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--out", default=None)
args = p.parse_args()

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
device_type = "cuda" if torch.cuda.is_available() else "cpu"
if device_type == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
if args.mesh == "2d":
    mesh = init_device_mesh(device_type, (world // 2 if world >= 2 else 1, 2 if world >= 2 else 1),
                            mesh_dim_names=("replicate", "shard"))
else:
    mesh = init_device_mesh(device_type, (world,))
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(args.hidden, args.hidden),
                                                  torch.nn.ReLU()) for _ in range(4)],
                            torch.nn.Linear(args.hidden, 1))
if args.slow_rank == rank:
    model[0].register_forward_pre_hook(lambda m, a: time.sleep(0.02))
for layer in model:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(rank)
losses = {}
for step in range(args.steps):
    x = torch.randn(32, args.hidden, generator=g, device="cpu").to(device_type)
    y = x.sum(dim=1, keepdim=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses[step + 1] = loss.item()
    if rank == 0 and step % 20 == 0:
        print(f"step {step} loss {losses[step + 1]:.4f}", flush=True)
if rank == 0 and args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump(losses, f)
dist.destroy_process_group()
