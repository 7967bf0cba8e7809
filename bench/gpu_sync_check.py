"""The sync timing of CUDA events against torch.profiler's communication kernel time.

    python bench/gpu_sync_check.py [--device cuda|cpu] [--steps 20] [--width 16384]
                                   [--source hook|reducer]

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

``--source reducer`` checks the engine's default sync source instead (issue 29): DDP's own
reducer timers (ddp_engine.rank.reducer_timing.ReducerTiming, sampled every iteration here),
whose ``backward_comm_time`` runs from the first bucket handed to the all-reduce to the last one
reduced, against the span of each step's communication kernels (the first one's start to the
last one's end; a kernel belongs to the step whose ``record_function`` range launched it, by
the profiler's correlation ids). The model gets a minimal hook asking NCCL for the mean, as
above, so that one rank runs a kernel at all; the reducer times whatever hook there is. The
line then also has ``reducer_ms`` and ``span_ms``.

``--device cpu`` (gloo, small layers) runs the same steps where no GPU is; it has no kernels
to compare (``kernel_ms`` null): a rehearsal of this script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import math
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

from ddp_engine.rank.reducer_timing import ReducerTiming  # noqa: E402
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


def mean_hook(_state, bucket):  # type: ignore[no-untyped-def]
    """The mean of the bucket (NCCL's AVG: a kernel even on one rank), untimed. Not annotated:
    DDP checks a hook's annotations against the classes, and this module's are strings."""
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, async_op=True)
    assert work is not None
    return work.get_future().then(lambda fut: fut.value()[0])


def train_reducer(ddp: DDP, timing: ReducerTiming, x: torch.Tensor,
                  steps: int) -> list[dict[str, float | None]]:
    """``steps`` steps, each in a ``rankscope-step-N`` profiler range; returns each step's sync
    fields as DDP's reducer timed them (read at the next step's forward, where DDP's logger
    turns a sampled iteration's timers into its stats: one step more is run)."""
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-9)
    out: list[dict[str, float | None]] = []
    for i in range(steps + 1):
        with torch.profiler.record_function(f"rankscope-step-{i}"):
            loss = ddp(x).square().mean()
            if i > 0:
                out.append(timing.read())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
    return out


def step_spans(trace: Path, steps: int) -> float | None:
    """The summed span (ms) of each of the first ``steps`` steps' communication kernels: from
    the first one's start to the last one's end, by the ``rankscope-step-N`` range whose CPU
    launch call carries the kernel's correlation id. None when no kernel could be placed."""
    events = json.loads(trace.read_text()).get("traceEvents", [])
    ranges = [(e["ts"], e["ts"] + e.get("dur", 0), int(e["name"].rsplit("-", 1)[1]))
              for e in events if e.get("cat") == "user_annotation"
              and str(e.get("name", "")).startswith("rankscope-step-")]
    launched = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}
    spans: dict[int, tuple[float, float]] = {}
    for e in events:
        if e.get("cat") != "kernel" or not COMM_KERNEL.search(str(e.get("name", ""))):
            continue
        at = launched.get(e.get("args", {}).get("correlation"))
        step = next((n for a, b, n in ranges if at is not None and a <= at <= b), None)
        if step is None or step >= steps:
            continue
        lo, hi = spans.get(step, (math.inf, -math.inf))
        spans[step] = (min(lo, e["ts"]), max(hi, e["ts"] + e.get("dur", 0)))
    return sum(b - a for a, b in spans.values()) / 1000.0 if spans else None


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
    parser.add_argument("--source", choices=["hook", "reducer"], default="hook",
                        help="what times sync: the engine's comm hook or DDP's reducer timers")
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
        x = torch.randn(16, width, device=device)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        trace = work / "trace.json"
        line: dict[str, Any] = {"device": args.device, "backend": dist.get_backend(),
                                "world_size": 1, "source": args.source, "steps": args.steps,
                                "layers": args.layers, "width": width}
        if args.source == "reducer":
            ddp = DDP(torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False,
                                                            device=device)
                                            for _ in range(args.layers)]),
                      device_ids=[device.index] if cuda else None)
            ddp.register_comm_hook(None, mean_hook)
            timing = ReducerTiming(1)  # every iteration sampled
            timing.watch(ddp)
            train_reducer(ddp, timing, x, args.warmup)  # DDP rebuilds its buckets
            if cuda:
                torch.cuda.synchronize()
            with torch.profiler.profile(activities=activities) as prof:
                got = train_reducer(ddp, timing, x, args.steps)
                if cuda:
                    torch.cuda.synchronize()
            prof.export_chrome_trace(str(trace))
            timed = [g["sync_time_s"] for g in got]
            last = got[-1] if got else {}
            line.update(reducer_ms=1000.0 * sum(t for t in timed if t is not None),
                        sampled_steps=sum(t is not None for t in timed),
                        span_ms=step_spans(trace, args.steps) if cuda else None,
                        buckets_per_step=last.get("sync_buckets"),
                        bucket_mib=(last.get("sync_bytes") or 0)
                        / max(1.0, last.get("sync_buckets") or 1) / 2**20)
        else:
            ddp, timer = build(device, width, args.layers)
            train(ddp, timer, x, args.warmup)  # DDP rebuilds its buckets after the first step
            if cuda:
                torch.cuda.synchronize()  # a sync point: warm-up steps are left out
            timer.collect()
            with torch.profiler.profile(activities=activities) as prof:
                train(ddp, timer, x, args.steps)
                if cuda:
                    torch.cuda.synchronize()  # every event and kernel has happened
            timed_hook = timer.collect()
            prof.export_chrome_trace(str(trace))
            line.update(buckets_per_step=timed_hook["sync_buckets"],
                        bucket_mib=(timed_hook["sync_bytes"] or 0)
                        / max(1.0, timed_hook["sync_buckets"] or 1) / 2**20,
                        events_ms=1000.0 * (timed_hook["sync_time_s"] or 0.0) * args.steps)
        kernel_ms, names, others, total = kernels(trace) if cuda else (None, {}, [], 0)
        line.update(kernel_ms=kernel_ms if names else None, kernels=names,
                    other_stream_kernels=others, kernels_seen=total,
                    nccl=nccl_version() if cuda else None)
        print(json.dumps(line))
    finally:
        dist.destroy_process_group()
        for p in work.iterdir():
            p.unlink()
        os.rmdir(work)


if __name__ == "__main__":
    main()
