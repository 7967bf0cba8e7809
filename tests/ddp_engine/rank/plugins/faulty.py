"""Loss and model plugins that misbehave on purpose, for the fault tests."""

import os
import resource
import threading
import time

import torch.nn.functional as F
from torch import nn

_calls = 0


def raise_on_rank1(output, target):
    """Rank 1 raises at its 5th micro-step."""
    global _calls
    _calls += 1
    if os.environ.get("RANK") == "1" and _calls == 5:
        raise RuntimeError("boom from the test plugin")
    return F.cross_entropy(output, target)


def hang_on_rank1(output, target):
    """Rank 1 stops answering at its 5th micro-step (a hung rank that ignores stop requests)."""
    global _calls
    _calls += 1
    if os.environ.get("RANK") == "1" and _calls >= 5:
        while True:
            time.sleep(0.5)
    return F.cross_entropy(output, target)


def slow(output, target):
    """Every micro-step takes at least 20 ms: a run at most 50 steps/s on any machine, so a test
    can rely on it still training a while."""
    time.sleep(0.02)
    return F.cross_entropy(output, target)


def nan_on_rank1_from_step_25(output, target):
    """Rank 1's loss is NaN from its 25th micro-step on (a diverging run)."""
    global _calls
    _calls += 1
    loss = F.cross_entropy(output, target)
    if os.environ.get("RANK") == "1" and _calls >= 25:
        return loss * float("nan")
    return loss


def spike_from_step_51(output, target):
    """Every rank's loss is 10 times itself from its 51st micro-step on (a run that blows up;
    the gradients too, which AdamW's normalized steps shrug off, so the run trains on)."""
    global _calls
    _calls += 1
    loss = F.cross_entropy(output, target)
    return loss * 10 if _calls >= 51 else loss


def abort_rank0_while_rank1_hangs(output, target):
    """Rank 1 stops answering at its 5th micro-step; rank 0, waiting for it in that step's
    gradient all-reduce, is aborted (SIGABRT) 3 s later by a thread of its own: what NCCL's
    watchdog does to a rank whose collective outlived the process-group timeout."""
    global _calls
    _calls += 1
    rank = os.environ.get("RANK")
    if _calls == 5 and rank == "1":
        while True:
            time.sleep(0.5)
    if _calls == 5 and rank == "0":
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file for the test's abort
        threading.Timer(3.0, os.abort).start()
    return F.cross_entropy(output, target)


class _SlowToSave(nn.Sequential):
    """An MLP whose state_dict takes ``save_s`` seconds on rank 0 (a checkpoint of a big model
    on a slow disk: rank 0 alone builds and writes it)."""

    def __init__(self, save_s: float) -> None:
        super().__init__(nn.Flatten(), nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        self.save_s = save_s

    def state_dict(self, *args, **kwargs):
        if os.environ.get("RANK") == "0":
            time.sleep(self.save_s)
        return super().state_dict(*args, **kwargs)


def slow_to_save(save_s: float = 8.0) -> nn.Module:
    """A model for the synthetic data (32 inputs, 10 classes) that rank 0 saves slowly."""
    return _SlowToSave(save_s)


def stuck_here() -> None:
    """Where ``stuck_on_rank1`` keeps rank 1: a Python loop that never returns."""
    while True:
        time.sleep(0.2)


def stuck_on_rank1(output, target):
    """Rank 1 stays in :func:`stuck_here` from its 5th micro-step on, in Python, while rank 0
    waits for it in that step's gradient all-reduce (a hang whose stacks tell the two apart)."""
    global _calls
    _calls += 1
    if os.environ.get("RANK") == "1" and _calls >= 5:
        stuck_here()
    return F.cross_entropy(output, target)
