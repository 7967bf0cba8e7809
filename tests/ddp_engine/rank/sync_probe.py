"""Run under torchrun (2 CPU ranks): our comm-hook sync time next to torch.profiler's all-reduce
time and DDP's own reducer timers (ddp_engine.rank.reducer_timing, sampled every iteration and
read after every step), for the same steps. Rank 0 prints one JSON line."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_engine.rank.reducer_timing import ReducerTiming
from ddp_engine.rank.sync_timing import StepTimer


def union_length(spans: list[tuple[float, float]]) -> float:
    total, cur = 0.0, None
    for a, b in spans:
        if cur is None or a > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    return total + (cur[1] - cur[0] if cur else 0.0)


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    ddp = DDP(model, bucket_cap_mb=1)
    timer = StepTimer(torch.device("cpu"))
    ddp.register_comm_hook(None, timer.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(32, 512), torch.randint(0, 10, (32,))

    def step() -> None:
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        timer.mark_backward_end(timer.stamp())
        opt.step()
        opt.zero_grad()
        timer.end_step()

    reducer = ReducerTiming(1)
    reducer.watch(ddp)
    for _ in range(5):
        step()
    timer.collect()
    reducer.read()
    steps = int(os.environ.get("PROBE_STEPS", "20"))
    reducer_sync, reducer_exposed = [], []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
            read = reducer.read()  # the iteration before this step: DDP records at a forward
            reducer_sync.append(read["sync_time_s"])
            reducer_exposed.append(read["sync_exposed_s"])
    ours = timer.collect()
    spans = sorted((e.time_range.start / 1e6, e.time_range.end / 1e6) for e in prof.events()
                   if e.name == "gloo:all_reduce")
    names = {"sum": sum(b - a for a, b in spans), "union": union_length(spans),
             "count": len(spans)}
    logging_data = ddp._get_ddp_logging_data()
    if dist.get_rank() == 0:
        print(json.dumps({"ours_sync_s": ours["sync_time_s"] * steps,
                          "ours_buckets": ours["sync_buckets"],
                          "profiler_s": names,
                          "ddp_avg_backward_comm_time_s":
                              logging_data.get("avg_backward_comm_time", 0) / 1e9,
                          "ours_mean_sync_s": ours["sync_time_s"],
                          "ours_mean_exposed_s": ours["sync_exposed_s"],
                          "reducer_sync": reducer_sync,
                          "reducer_exposed": reducer_exposed}), flush=True)
    dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
