"""Loss plugins that misbehave on purpose, for the fault tests."""

import os
import time

import torch.nn.functional as F

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
