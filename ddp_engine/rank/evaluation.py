"""Validation: the loss (and accuracy) over every rank's shard of the validation set."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist


@torch.no_grad()
def validation_metrics(model: torch.nn.Module, loader: Iterable[Any],
                       loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                       device: torch.device, autocast_dtype: torch.dtype | None,
                       classification: bool) -> dict[str, float]:
    """``val_loss`` (and ``val_accuracy`` for a classifier) over all ranks: a collective, so
    every rank calls it at the same step. Leaves the model in eval mode."""
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss*n, correct, n
    for x, y in loader:
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            out = model(x)
            loss = loss_fn(out, y)
        n = y.size(0)
        sums[0] += loss.double() * n
        sums[2] += n
        if classification and out.dim() == 2:
            sums[1] += (out.argmax(dim=1) == y).sum().double()
    dist.all_reduce(sums)
    total = max(sums[2].item(), 1.0)  # note: .item() syncs; evaluation only
    result = {"val_loss": sums[0].item() / total}
    if classification:
        result["val_accuracy"] = sums[1].item() / total
    return result
