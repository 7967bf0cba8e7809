"""What the node watch of a multi-node run costs (issue 32): one beat, timed alone.

    .venv/bin/python bench/node_watch_cost.py [--beats 3000] [--nnodes 2,8]

In a run of several nodes every launcher's NodeWatch thread makes one beat a second
(``BEAT_S``) through the rendezvous store node 0 hosts: on node K one ``add`` to its counter, on
node 0 a read of every other node's counter and a check for its end mark. Nothing of it runs in
the ranks. Here a real TCPStore server on 127.0.0.1 plays node 0's store (in a run, torchrun's
agent hosts it on node 0) and NodeWatch.poll_once, the very code a beat runs, is timed
``--beats`` times for node 0 and for node 1, for each node count: the thread's CPU time
(time.thread_time) and the wall time per beat (medians and 99th percentiles), and the share of
one core that a beat a second is. The store's server thread, which answers the beats, runs in
this process too: its CPU is in the process's time, printed beside (per beat, both sides).

Across hosts the wall time adds the network's round trip (the CPU does not change).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ddp_engine.common.config import RunConfig  # noqa: E402
from ddp_engine.launch.node_watch import BEAT_S, NodeWatch  # noqa: E402


def timed(watch: NodeWatch, beats: int) -> dict[str, float]:
    """``beats`` calls of poll_once: per-beat thread CPU and wall (s), and process CPU."""
    watch.poll_once()  # the connection, made once in a run
    cpu, wall = [], []
    proc0 = time.process_time()
    for _ in range(beats):
        c0, w0 = time.thread_time(), time.perf_counter()
        watch.poll_once()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    proc = (time.process_time() - proc0) / beats
    q = statistics.quantiles
    return {"cpu": statistics.median(cpu), "cpu99": q(cpu, n=100)[98],
            "wall": statistics.median(wall), "wall99": q(wall, n=100)[98], "proc": proc}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beats", type=int, default=3000)
    parser.add_argument("--nnodes", default="2,8", help="comma-separated node counts")
    args = parser.parse_args()
    try:
        counts = [int(n) for n in args.nnodes.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 2:
        parser.error(f"--nnodes: {args.nnodes!r}: give node counts of 2 or more, e.g. 2,8")
    if args.beats < 2:
        parser.error(f"--beats: {args.beats}: give 2 or more")
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=10))
    endpoint = f"127.0.0.1:{server.port}"
    print(f"node watch, one beat (NodeWatch.poll_once) against a TCPStore on {endpoint}, "
          f"{args.beats} beats each; a beat every {BEAT_S:g} s in a run")
    print("| nodes | node | thread CPU per beat, median (p99) | wall per beat, median (p99) "
          "| process CPU per beat (store server too) | share of one core at a beat a second |")
    print("|---|---|---|---|---|---|")
    for nnodes in counts:
        watches = {k: NodeWatch(RunConfig(device="cpu", nproc=1, nnodes=nnodes, node_rank=k,
                                          rdzv_endpoint=endpoint), f"10.0.0.{k + 1}")
                   for k in range(nnodes)}
        for k in range(1, nnodes):
            watches[k].poll_once()  # every node has beaten once: node 0 reads real counters
        for k in (0, 1):
            got = timed(watches[k], args.beats)
            print(f"| {nnodes} | {k} | {got['cpu'] * 1e6:.0f} µs ({got['cpu99'] * 1e6:.0f}) | "
                  f"{got['wall'] * 1e6:.0f} µs ({got['wall99'] * 1e6:.0f}) | "
                  f"{got['proc'] * 1e6:.0f} µs | {got['proc'] / BEAT_S * 100:.4f}% |")
        for w in watches.values():
            w.close()
    del server


if __name__ == "__main__":
    main()
