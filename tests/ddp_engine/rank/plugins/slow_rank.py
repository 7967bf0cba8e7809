"""A model plugin whose rank 1 computes slower than the others: the straggler tests' run."""

import os
import time

import torch
from torch import nn


class _SlowForwardOnRank1(nn.Sequential):
    """An MLP for the synthetic data (32 inputs, 10 classes) whose forward takes at least
    ``forward_s`` on every rank (a sleep: a model big enough to matter, that a busy 2-core
    machine still times steadily) and, on rank 1, ``slower`` times its measured forward more."""

    def __init__(self, forward_s: float, slower: float, hidden: int, depth: int) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        width = 32
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        super().__init__(*layers, nn.Linear(width, 10))
        self.forward_s = forward_s
        self.slower = slower if os.environ.get("RANK") == "1" else 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        out = super().forward(x)
        time.sleep(self.forward_s)
        if self.slower:
            time.sleep(self.slower * (time.perf_counter() - t0))
        return out


def slow_forward_on_rank1(forward_s: float = 0.004, slower: float = 1.0, hidden: int = 64,
                          depth: int = 1) -> nn.Module:
    """Rank 1's forward takes ``1 + slower`` times (twice) as long as every other rank's
    (``hidden`` and ``depth``: a model of several gradient buckets). Twice, not 40% longer:
    on a loaded 2-core CI machine a 40% slower forward (about 2 ms a step) was sometimes lost
    in the noise for the 20 reports in a row that naming a straggler takes."""
    return _SlowForwardOnRank1(forward_s, slower, hidden, depth)
