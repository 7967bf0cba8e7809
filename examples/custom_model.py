"""Bring your own model, data and loss to Rankscope.

    python -m ddp_engine launch --config examples/custom_run.toml

or from flags:

    python -m ddp_engine launch --model examples/custom_model.py:build_model \
        --dataset examples/custom_model.py:build_dataset --model-arg hidden=64 --max-steps 100

Each function is imported in every rank. Keyword arguments come from the [model] and [dataset]
tables of the config file (or --model-arg / --dataset-arg KEY=VALUE).
"""

import math

import torch
from torch import nn
from torch.utils.data import TensorDataset


def build_model(hidden: int = 64) -> nn.Module:
    """Return any torch.nn.Module. Here: a classifier for 2-D points of two spirals."""
    return nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, 2))


def build_dataset(num_samples: int = 4096, noise: float = 0.1, seed: int = 0):
    """Return a Dataset of (input, target) pairs, or a (train, val) pair of them.

    Every rank calls this: make it deterministic (a fixed seed) so all ranks see the same data;
    the DistributedSampler then gives each rank its own shard.
    """
    g = torch.Generator().manual_seed(seed)

    def spirals(n: int) -> TensorDataset:
        label = torch.randint(0, 2, (n,), generator=g)
        t = torch.rand(n, generator=g) * 3 * math.pi
        angle = t + label * math.pi
        x = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], dim=1) / (3 * math.pi)
        x += noise * torch.randn(n, 2, generator=g) / 3
        return TensorDataset(x, label)

    return spirals(num_samples), spirals(num_samples // 8)


def smooth_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A loss plugin: any callable (output, target) -> scalar tensor."""
    return nn.functional.cross_entropy(output, target, label_smoothing=0.05)
