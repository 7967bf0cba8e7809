"""The sync timing of CUDA events against torch.profiler's communication kernel time.

    python bench/gpu_sync_check.py [--device cuda|cpu] [--steps 20] [--width 16384]

One process, a DDP model with the engine's own timing hook (ddp_engine.rank.sync_timing
.StepTimer: a CUDA event when DDP hands a bucket over, another where the all-reduce's result
is ready), profiled by torch.profiler for ``--steps`` steps. Prints one JSON line: the hook's
sync time summed over those steps (``events_ms``) and the summed duration of the
communication kernels the profiler saw (``kernel_ms``: NCCL's; names matching ``nccl`` or
``onerank``), so that bench/gpu_check.py can compare them.

With one GPU the process group has one rank. NCCL still runs a kernel for it: the hook asks
for a mean (``ReduceOp.AVG``), which NCCL computes on one rank as a scaling pass over the
bucket (its ``oneRankReduce`` kernel), on its own stream, between the same two events as on
many ranks. The layers are wide (1 GiB of gradient each at the default width) so that one
bucket's kernel lasts far longer than the few microseconds the events add around it.

``--device cpu`` (gloo, small layers) runs the same steps where no GPU is; it has no kernels
to compare (``kernel_ms`` null): a rehearsal of this script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from ddp_engine.rank.sync_timing import StepTimer  # noqa: E402

COMM_KERNEL = re.compile(r"nccl|onerank", re.IGNORECASE)


def build(device: torch.device, width: int, layers: int) -> tuple[DDP, StepTimer]:
    """A stack of wide linear layers in DDP (each layer's gradient a bucket of its own: larger
    than DDP's 25 MB cap), timed by the engine's hook as the trainer registers it."""
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False, device=device)
                                  for _ in range(layers)])  # made on the GPU: fast
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    timer = StepTimer(device)
    ddp.register_comm_hook(None, timer.hook)
    return ddp, timer


def train(ddp: DDP, timer: StepTimer, x: torch.Tensor, steps: int) -> None:
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-9)
    for _ in range(steps):
        loss = ddp(x).square().mean()
        loss.backward()
        timer.mark_backward_end(timer.stamp())  # every bucket is reduced by here
        opt.step()
        opt.zero_grad(set_to_none=False)
        timer.end_step()


def kernels(trace: Path) -> tuple[float, dict[str, int], list[str], int]:
    """(summed duration in ms of the communication kernels, their names with counts, the
    names of the other kernels that ran on streams other than the busiest one, how many
    kernels there were in all) from a chrome trace of torch.profiler."""
    events = json.loads(trace.read_text()).get("traceEvents", [])
    found = [e for e in events if e.get("cat") == "kernel"]
    comm = [e for e in found if COMM_KERNEL.search(str(e.get("name", "")))]
    names: dict[str, int] = {}
    for e in comm:
        names[e["name"][:80]] = names.get(e["name"][:80], 0) + 1
    streams: dict[Any, int] = {}
    for e in found:
        s = e.get("args", {}).get("stream")
        streams[s] = streams.get(s, 0) + 1
    busiest = max(streams, key=lambda s: streams[s]) if streams else None
    others = sorted({e["name"][:80] for e in found if e not in comm
                     and e.get("args", {}).get("stream") != busiest})
    return sum(float(e.get("dur", 0)) for e in comm) / 1000.0, names, others[:5], len(found)


def nccl_version() -> str:
    v = torch.cuda.nccl.version()  # a tuple (2, 21, 5) on recent releases, an int before
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--width", type=int, default=None,
                        help="layer width (default: 16384 on CUDA, 256 on CPU)")
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    width = args.width or (16384 if cuda else 256)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    work = Path(tempfile.mkdtemp(prefix="rankscope-sync-check-"))
    store = dist.FileStore(str(work / "store"), 1)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=0, world_size=1)
    try:
        ddp, timer = build(device, width, args.layers)
        x = torch.randn(16, width, device=device)
        train(ddp, timer, x, args.warmup)  # DDP rebuilds its buckets after the first step
        if cuda:
            torch.cuda.synchronize()  # a sync point: warm-up steps are left out of both sides
        timer.collect()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            train(ddp, timer, x, args.steps)
            if cuda:
                torch.cuda.synchronize()  # every event and kernel has happened
        timed = timer.collect()
        trace = work / "trace.json"
        prof.export_chrome_trace(str(trace))
        kernel_ms, names, others, total = kernels(trace) if cuda else (None, {}, [], 0)
        sync_s = timed["sync_time_s"] or 0.0
        print(json.dumps({
            "device": args.device, "backend": dist.get_backend(), "world_size": 1,
            "steps": args.steps, "layers": args.layers, "width": width,
            "buckets_per_step": timed["sync_buckets"],
            "bucket_mib": (timed["sync_bytes"] or 0) / max(1.0, timed["sync_buckets"] or 1)
            / 2**20,
            "events_ms": 1000.0 * sync_s * args.steps,
            "kernel_ms": kernel_ms if names else None,
            "kernels": names, "other_stream_kernels": others, "kernels_seen": total,
            "nccl": nccl_version() if cuda else None}))
    finally:
        dist.destroy_process_group()
        for p in work.iterdir():
            p.unlink()
        os.rmdir(work)


if __name__ == "__main__":
    main()
