"""A PyTorch Lightning script as its users write it: a LightningModule on random tensors,
``Trainer(accelerator="cpu", devices=2, strategy="ddp")``, run by torchrun. Rank 0 writes the
loss of every optimizer step (a Callback: Lightning's own per-batch loss, which it divides by
``accumulate_grad_batches``, summed over the step's batches: their mean) and the final weights
to --out. It never imports rankscope."""

import argparse
import json
import os

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class StepLosses(pl.Callback):
    """The loss of each optimizer step, by Lightning's global step."""

    def __init__(self) -> None:
        self.losses: dict[int, float] = {}
        self._sum = 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sum += float(outputs["loss"])  # already divided by accumulate_grad_batches
        if (batch_idx + 1) % trainer.accumulate_grad_batches == 0:
            self.losses[trainer.global_step] = self._sum
            self._sum = 0.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", type=int, default=2)
    args = p.parse_args()

    pl.seed_everything(0)
    x = torch.randn(args.samples, 16)
    y = x[:, :4].sum(1, keepdim=True) + 0.1 * torch.randn(args.samples, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = Regressor(lr=0.02)
    losses = StepLosses()
    trainer = pl.Trainer(accelerator=args.accelerator, devices=args.devices, strategy="ddp",
                         max_epochs=args.epochs,
                         accumulate_grad_batches=args.accumulate, callbacks=[losses],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True)
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(args.out, "weights.pt"))
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(losses.losses, f)


if __name__ == "__main__":
    main()
