"""Fixtures for the tests of the code inside a rank."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from ddp_engine.rank.distributed import DistContext, init_distributed, teardown


@pytest.fixture
def ctx(monkeypatch: pytest.MonkeyPatch) -> Iterator[DistContext]:
    """A one-rank gloo process group in this process, as torchrun's environment would make it
    (a free port of its own), torn down after the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    context = init_distributed("cpu", 60)
    yield context
    teardown()
