"""Loss functions by name, or from a plugin ``FILE.py:FUNC`` taking (output, target)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ddp_engine.rank.plugins import load_callable

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross entropy; sequence outputs (B, T, V) with targets (B, T) are flattened."""
    if output.dim() == 3:
        return F.cross_entropy(output.reshape(-1, output.size(-1)), target.reshape(-1))
    return F.cross_entropy(output, target)


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target.to(output.dtype).reshape(output.shape))


def build_loss(spec: str) -> LossFn:
    if spec == "cross_entropy":
        return cross_entropy
    if spec == "mse":
        return mse
    return load_callable(spec, "loss")
