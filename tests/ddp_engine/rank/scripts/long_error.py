"""A plain DDP script for the failure-reason tests: at ``--fail-at`` rank 1 raises a
RuntimeError whose text is about 5 KB over many lines (a first line of 600 characters, then
an "At:" dump of frames, as gloo and pybind11 write them). It never imports rankscope."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

FRAMES = 150
LAST_LINE = "END OF THE WHOLE TEXT"


def long_message(step: int) -> str:
    """The exception's text: one long first line, an "At:" dump, a last line to look for."""
    first = f"rank 1 saw a bad batch at step {step}: " + ", ".join(
        f"sample {i} is NaN" for i in range(40))
    frames = "\n".join(f"  /home/me/project/model.py({100 + i}): forward" for i in range(FRAMES))
    return f"{first}\n\nAt:\n{frames}\n{LAST_LINE}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fail-at", type=int, default=3)
    args = p.parse_args()
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 1_000_000):
        x = torch.randn(16, 8)
        loss = F.cross_entropy(model(x), (x[:, 0] > 0).long())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if dist.get_rank() == 1 and step == args.fail_at:
            raise RuntimeError(long_message(step))


if __name__ == "__main__":
    main()
