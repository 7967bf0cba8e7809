"""Run under torchrun (2 CPU ranks): the engine's step with the timing hook (loss divided by the
world size, buckets summed) against the same step on stock DDP (telemetry off), from the same
weights and data, with and without gradient accumulation. Rank 0 prints one JSON line: the
largest difference of any weight after 3 steps, and of the steps' losses."""

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_engine.common.config import RunConfig
from ddp_engine.rank.distributed import StopFlag, init_distributed, teardown
from ddp_engine.rank.trainer import Trainer


def trained(ctx, accum: int, telemetry: bool
            ) -> tuple[list[torch.Tensor], list[float], float]:
    """Weights after 3 steps, the steps' losses, and how far the weights moved."""
    cfg = RunConfig(optimizer="sgd", momentum=0.0, lr=0.5, max_steps=3, batch_size=8,
                    grad_accum=accum, telemetry=telemetry, dataset_args={"num_samples": 256})
    with tempfile.TemporaryDirectory(prefix="grad-probe-") as folder:
        trainer = Trainer(cfg, ctx, Path(folder), StopFlag.from_config(cfg, ctx.side_group))
        return _three_steps(trainer, telemetry)


def _three_steps(trainer: Trainer, telemetry: bool
                 ) -> tuple[list[torch.Tensor], list[float], float]:
    assert (trainer.timer is not None) == telemetry
    trainer.sampler.set_epoch(0)
    batches = iter(trainer.loader)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    losses = [float(trainer._train_step(batches)) for _ in range(3)]
    after = [p.detach().clone() for p in trainer.model.parameters()]
    moved = max(float((a - b).abs().max()) for a, b in zip(after, before, strict=True))
    return after, losses, moved


def main() -> None:
    ctx = init_distributed("cpu", 60)
    result = {}
    for accum in (1, 2):
        hooked, hooked_losses, _ = trained(ctx, accum, telemetry=True)
        stock, stock_losses, moved = trained(ctx, accum, telemetry=False)
        result[f"accum{accum}"] = {
            "weights": max(float((a - b).abs().max()) for a, b in zip(hooked, stock,
                                                                      strict=True)),
            "moved": moved,
            "losses": max(abs(a - b) for a, b in zip(hooked_losses, stock_losses,
                                                     strict=True)),
            "loss_values": stock_losses}
    if dist.get_rank() == 0:
        print(json.dumps(result), flush=True)
    teardown()
    sys.exit(0)


if __name__ == "__main__":
    main()
