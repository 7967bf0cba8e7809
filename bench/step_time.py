"""A loss plugin with a controlled step time, for bench/stop_latency.py.

    --loss bench/step_time.py:loss   with RANKSCOPE_BENCH_STEP_S=0.01 in the run's environment

Every micro-step sleeps RANKSCOPE_BENCH_STEP_S seconds (default 0) in the forward pass, then
returns the plain cross entropy: the step time is that sleep plus the (small) real work.
"""

import os
import time

import torch
import torch.nn.functional as F

STEP_S = float(os.environ.get("RANKSCOPE_BENCH_STEP_S", "0"))


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sleep RANKSCOPE_BENCH_STEP_S seconds, then the cross entropy."""
    if STEP_S > 0:
        time.sleep(STEP_S)
    return F.cross_entropy(output, target)
