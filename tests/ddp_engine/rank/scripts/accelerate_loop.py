"""A training loop with Hugging Face Accelerate, as its documentation teaches:
``Accelerator(cpu=True)``, ``accelerator.prepare`` of the model, optimizer, scheduler and
DataLoader, ``accelerator.backward(loss)``, run by torchrun. Rank 0 writes its own loss of
every step and the final weights (``accelerator.unwrap_model``) to --out. It never imports
rankscope."""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=512)
    args = p.parse_args()

    accelerator = Accelerator(cpu=True)
    set_seed(0)
    x = torch.randn(args.samples, 20)
    y = (x[:, :5].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader,
                                                              scheduler)
    losses: dict[int, float] = {}
    step = 0
    for epoch in range(args.epochs):
        model.train()
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            step += 1
            losses[step] = loss.item()
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(losses, f)
        accelerator.save(accelerator.unwrap_model(model).state_dict(),
                         os.path.join(args.out, "weights.pt"))
    accelerator.end_training()


if __name__ == "__main__":
    main()
