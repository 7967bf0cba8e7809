"""DDP's reducer timers as the default sync source (ddp_engine/rank/reducer_timing.py), read
from a real DDP module in this process (one gloo rank); two-rank accuracy against the profiler
and the timing hook: test_sync_timing.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_engine.rank.reducer_timing import SYNC_FIELDS, ReducerTiming, missing_api, sync_source


@pytest.fixture
def group(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _steps(model: DDP, n: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(n):
        model(torch.randn(8, 6)).square().mean().backward()
        opt.step()
        opt.zero_grad()


def test_this_torch_has_the_timers_and_reducer_is_the_default_source() -> None:
    assert missing_api() is None
    assert sync_source("reducer") == ("reducer", None)
    assert sync_source("hook") == ("hook", None)


def test_a_torch_without_the_timers_falls_back_to_the_hook_and_says_why() -> None:
    class OldDDP:
        _get_ddp_logging_data = None  # one of the two only

    why = missing_api(OldDDP)
    assert why == "this torch's DistributedDataParallel lacks _set_ddp_runtime_logging_sample_rate"


def test_each_new_sample_is_read_once(group: None) -> None:
    model = DDP(torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Linear(16, 1)))
    timing = ReducerTiming(every=4)
    assert timing.read() == dict.fromkeys(SYNC_FIELDS)  # watching nothing yet
    timing.watch(model)
    _steps(model, 2)  # DDP records an iteration's times at the next forward
    first = timing.read()
    assert first["sync_time_s"] > 0 and 0 <= first["sync_exposed_s"] <= first["sync_time_s"]
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert first["sync_bytes"] == params and first["sync_buckets"] == 1
    assert timing.read()["sync_time_s"] is None  # no new sample since
    _steps(model, 12)  # the first ten iterations, then every 4th, are sampled
    assert timing.read()["sync_time_s"] > 0


def test_a_new_ddp_module_is_timed_from_then_on(group: None) -> None:
    timing = ReducerTiming(every=1)
    first = DDP(torch.nn.Linear(6, 1))
    timing.watch(first)
    _steps(first, 2)
    assert timing.read()["sync_time_s"] > 0
    second = DDP(torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Linear(32, 1)))
    timing.watch(second)
    _steps(second, 2)
    assert timing.read()["sync_bytes"] == sum(p.numel() * 4 for p in second.parameters())
    del first, second
    assert not timing.watching


def test_on_cpu_a_read_is_the_mean_over_the_iterations_since_the_last(group: None) -> None:
    """Every iteration is sampled on CPU; a read gives the mean of the iterations' own times
    since the last read (DDP's logger records an iteration at the next forward), not the
    latest one alone."""
    model = DDP(torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.Linear(64, 1)))
    timing = ReducerTiming(every=10)
    timing.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: dict[int, tuple[int, int]] = {}  # iteration -> its own comm and overlap times (ns)

    def steps(n: int) -> None:
        for _ in range(n):
            out = model(torch.randn(8, 6))
            data = model._get_ddp_logging_data()
            if data.get("iteration"):
                seen[data["iteration"]] = (data["backward_comm_time"],
                                           data["backward_compute_comm_overlap_time"])
            out.square().mean().backward()
            opt.step()
            opt.zero_grad()

    steps(7)
    first = timing.read()
    assert sorted(seen) == list(range(1, 7))  # iteration 7 is recorded at the 8th forward
    steps(5)
    second = timing.read()
    assert sorted(seen) == list(range(1, 12))
    for got, its in ((first, range(1, 7)), (second, range(7, 12))):
        comm = sum(seen[i][0] for i in its) / len(its)
        overlap = sum(seen[i][1] for i in its) / len(its)
        assert got["sync_time_s"] == pytest.approx(comm * 1e-9, abs=1e-8)
        assert got["sync_exposed_s"] == pytest.approx(max(0.0, comm - overlap) * 1e-9, abs=1e-8)
    samples = [seen[i][0] for i in range(7, 12)]
    assert min(samples) < max(samples)  # so the mean is not any one sample by chance


def test_a_module_that_ran_before_it_was_watched_gives_its_latest_sample(group: None) -> None:
    model = DDP(torch.nn.Linear(6, 1))
    _steps(model, 3)  # DDP's own sample rate so far: its first ten iterations, then every 100th
    timing = ReducerTiming(every=2)
    timing.watch(model)
    _steps(model, 4)
    got = timing.read()
    data = model._get_ddp_logging_data()
    assert got["sync_time_s"] == pytest.approx(data["backward_comm_time"] * 1e-9)
