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
