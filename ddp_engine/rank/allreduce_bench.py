"""torchrun's target for ``python -m ddp_engine doctor``: timed all-reduces at several message
sizes, the way nccl-tests' all_reduce_perf measures them, so the numbers compare with it.

``torchrun --nproc-per-node N -m ddp_engine.rank.allreduce_bench --out FILE --device cpu``.
Every rank sets up as a training rank does (:func:`init_distributed`: nccl on GPUs, gloo on
CPU), then for each size: one warm-up all-reduce (connections, NCCL's buffers), a short probe
that sizes the chunks, and the timed all-reduces, chunk by chunk until the size's time is spent
(agreed by all ranks after each chunk: each must call the collective equally often). Rank 0
writes the results to FILE; every rank leaves through ``destroy_process_group``.
"""

from __future__ import annotations

from ddp_engine.common.lifeline import arm_parent_death

arm_parent_death()  # first, before the slow imports: a doctor that dies takes the ranks along

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

from ddp_engine.common.doctor_result import (  # noqa: E402
    SIZE_STARTED,
    SizeResult,
    bandwidths_gbs,
    sizes_for,
)
from ddp_engine.common.run_dir import atomic_write_json  # noqa: E402
from ddp_engine.rank.distributed import init_distributed, teardown  # noqa: E402

PROBE_SHARE = 0.1
"""Of each size's time, the share the probe that sets the iteration count may take."""
CHUNKS = 4
"""The timed all-reduces of a size run in about this many chunks (see :func:`measure`)."""
MIN_ITERATIONS = 3
MAX_ITERATIONS = 2000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ddp_engine.rank.allreduce_bench",
                                     description="timed all-reduces (run by torchrun)")
    parser.add_argument("--out", required=True, help="rank 0 writes the results here (JSON)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="time for all sizes together (default: 3)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="init_process_group's timeout in seconds (default: 120)")
    parser.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",") if x],
                        default=None, metavar="BYTES,...",
                        help="message sizes (default: 1..256 MiB on GPUs, 64 KiB..16 MiB on CPU)")
    return parser.parse_args(argv)


def _sync(device: torch.device) -> None:
    """Wait for the GPU: an all-reduce on it returns before it is done. A host-device sync
    point, only outside the timed loops and at their end."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest(value: float, device: torch.device) -> float:
    """The largest ``value`` of all ranks. A collective, so it also lines the ranks up before
    the next timed loop (a host-device sync on GPUs)."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def measure(size_bytes: int, seconds: float, device: torch.device,
            world_size: int) -> SizeResult:
    """All-reduce a float32 tensor of ``size_bytes`` for about ``seconds``.

    The timed all-reduces run in a few chunks sized by a probe; after each chunk the ranks
    agree on the time spent (the slowest rank's), and stop together once it reaches
    ``seconds``: a probe fooled by a busy CPU cannot make one size take many times its share.
    """
    # Zeros: a sum of ones would grow to inf over many iterations (speed is the same, but
    # a reader of the tensor would not expect it).
    buf = torch.zeros(max(1, size_bytes // 4), dtype=torch.float32, device=device)
    dist.all_reduce(buf)  # warm-up: connections and buffers for this size
    per_call = _probe(buf, seconds * PROBE_SHARE, device)
    chunk = int(min(MAX_ITERATIONS, max(MIN_ITERATIONS, seconds / CHUNKS / max(per_call, 1e-9))))
    iterations, mine_s, spent_s = 0, 0.0, 0.0
    while spent_s < seconds and iterations < MAX_ITERATIONS:
        _sync(device)
        start = time.perf_counter()
        for _ in range(chunk):
            dist.all_reduce(buf)
        _sync(device)  # the GPU's all-reduces return before they are done
        mine_s += time.perf_counter() - start
        iterations += chunk
        spent_s = _slowest(mine_s, device)  # agreed: every rank stops after the same chunk
    time_s = spent_s / iterations
    algbw, busbw = bandwidths_gbs(buf.numel() * 4, time_s, world_size)
    return SizeResult(buf.numel() * 4, iterations, time_s, algbw, busbw)


def _probe(buf: torch.Tensor, seconds: float, device: torch.device) -> float:
    """Seconds per all-reduce of ``buf``: batches of 1, 4, 16, ... calls until one takes
    ``seconds`` (timeit's autorange). Every rank stops at the same batch: the decision is taken
    on the slowest rank's time, agreed by a collective."""
    calls = 1
    while True:
        _sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(buf)
        _sync(device)
        elapsed = _slowest(time.perf_counter() - start, device)
        if elapsed >= seconds or calls >= MAX_ITERATIONS:
            return elapsed / calls
        calls *= 4


def nccl_version() -> str | None:
    """The NCCL this torch ships, e.g. ``2.21.5``; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # a build without NCCL
        return None
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


@record
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ctx = init_distributed(args.device, args.timeout)
    try:
        sizes = args.sizes or sizes_for(ctx.device.type)
        per_size_s = args.seconds / len(sizes)
        results = []
        for i, size in enumerate(sizes, 1):
            if ctx.info.rank == 0:  # doctor --progress reads it in torchrun's log
                print(f"{SIZE_STARTED} {i}/{len(sizes)} {size}", flush=True)
            results.append(measure(size, per_size_s, ctx.device, ctx.info.world_size))
        if ctx.info.rank == 0:
            atomic_write_json(args.out, {
                "backend": ctx.backend, "world_size": ctx.info.world_size,
                "device": ctx.device.type, "time": time.time(),
                "sizes": [asdict(r) for r in results],
                "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                             "nccl": nccl_version() if ctx.backend == "nccl" else None}})
    finally:
        teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
