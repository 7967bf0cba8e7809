"""Gradient-sync timing: the union arithmetic, and agreement with torch.profiler and DDP."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from ddp_engine.rank.sync_timing import StepTimer, _Bucket
from tests.conftest import REPO, engine_env


def test_overlapping_buckets_count_once_and_exposed_is_after_the_last_launch() -> None:
    timer = StepTimer(torch.device("cpu"))
    timer._current.buckets += [_Bucket(10.0, 10.4, 100), _Bucket(10.2, 10.5, 50),
                               _Bucket(10.8, 11.0, 10)]
    timer.mark_backward_end(11.05)
    timer.phase("forward", 9.0, 9.5)
    timer.add_data_wait(0.25)
    timer.end_step()
    got = timer.collect()
    assert got["sync_time_s"] == pytest.approx(0.5 + 0.2)
    assert got["sync_exposed_s"] == pytest.approx(0.25)  # 10.8 -> 11.05
    assert got["sync_bytes"] == 160 and got["sync_buckets"] == 3
    assert got["forward_s"] == pytest.approx(0.5) and got["data_wait_s"] == 0.25
    assert timer.collect()["sync_time_s"] is None  # nothing new since


def _probe(script: str, key: str) -> dict:
    """Run tests/ddp_engine/rank/SCRIPT under torchrun (2 CPU ranks); rank 0's JSON line that
    holds ``key``."""
    env = engine_env()
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(REPO / "tests/ddp_engine/rank" / script)],
                          capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(json.loads(next(line for line in proc.stdout.splitlines() if key in line)))


@pytest.mark.slow
def test_sync_time_lies_between_the_profilers_spans_and_ddps_own_timers_on_cpu() -> None:
    """Same 20 steps, three measures of the gradient all-reduce, in the order their definitions
    put them (each one's interval holds the one before):
    - torch.profiler's ``gloo:all_reduce`` spans (their union: buckets overlap) time gloo's
      worker thread running the collective, from when it picks it up;
    - our hook times each bucket from DDP handing it over to its result, so the wait in
      gloo's queue too (a few ms a bucket on a loaded machine);
    - DDP's reducer timers (the default source, issue 29) run from the first bucket handed
      over to the end of backward, gaps between buckets included.
    A hook that timed only the launch reads far below the spans; one that summed overlapping
    buckets reads above the reducer's interval that contains them all."""
    result = _probe("sync_probe.py", "ours_sync_s")
    ours, profiler = result["ours_sync_s"], result["profiler_s"]["union"]
    reducer = result["reducer_sync"]  # one sample per step, read after it
    assert all(v is not None and v > 0 for v in reducer), reducer
    assert ours > 0 and profiler > 0
    assert 0.8 * profiler < ours < 1.05 * sum(reducer), (sum(reducer), result)
    assert sum(reducer) < 2.0 * profiler, (sum(reducer), result)  # not the whole backward
    ddp = result["ddp_avg_backward_comm_time_s"]
    if ddp > 0:  # private API, over other steps (DDP's first ten): a cross-check
        assert 0.5 < result["ours_mean_sync_s"] / ddp < 2.0, result
    # The exposed part (after backward compute ended) of the two sources is close.
    exposed = [v for v in result["reducer_exposed"] if v is not None]
    assert len(exposed) == len(reducer)
    assert 0.5 < (sum(exposed) / len(exposed)) / result["ours_mean_exposed_s"] < 2.0, result


@pytest.mark.slow
def test_the_timing_hook_trains_exactly_as_stock_ddp_on_two_ranks() -> None:
    """With telemetry on, the step divides its loss by the world size and the hook sums the
    buckets (no pass over the gradients to divide them): the weights after 3 steps match stock
    DDP's (telemetry off) to float rounding, with and without gradient accumulation. A hook
    that summed an undivided loss, or divided twice, moves them by a large part of a step."""
    result = _probe("grad_probe.py", "accum1")
    for accum in ("accum1", "accum2"):
        got = result[accum]
        assert got["moved"] > 1e-3, got  # the steps changed the weights measurably
        assert got["weights"] < 1e-4 * got["moved"], got
        assert got["losses"] < 1e-5, got
