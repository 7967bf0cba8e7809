"""A rank's life outside training, shared by built-in runs (:mod:`ddp_engine.rank.worker`)
and a user's script (:mod:`ddp_engine.rank.script_run`): its state file, its failure report,
its log lines and its close on every exit path."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

from ddp_engine.common.config import ConfigError
from ddp_engine.common.heartbeat import Heartbeat
from ddp_engine.common.run_dir import atomic_write_json, rank_file
from ddp_engine.rank.distributed import DistInfo, teardown
from ddp_engine.rank.telemetry import Telemetry

log = logging.getLogger("ddp_engine.rank.rank_life")


class RunFailed(RuntimeError):
    """The run stopped cleanly on every rank, but because it failed (a launcher died)."""


def write_rank_state(run_dir: Path, info: DistInfo, device: object, state: str,
                     **extra: object) -> None:
    atomic_write_json(rank_file(run_dir, info.rank), {
        "rank": info.rank, "local_rank": info.local_rank, "pid": os.getpid(),
        # Who may signal it for its stacks (same host), and which thread in them is main.
        "host": socket.gethostname(), "main_thread": threading.main_thread().ident,
        "device": str(device), "state": state, "time": time.time(), **extra})


def record_failure(e: BaseException, run_dir: Path | None, info: DistInfo, device: object,
                   telemetry: Telemetry | None, step: dict[str, int]) -> None:
    """Say in the rank's file (and rank 0's telemetry) that it failed, and why. Best effort:
    on a full disk these writes fail too, and must not hide ``e``."""
    with contextlib.suppress(OSError):
        if run_dir is not None:
            write_rank_state(run_dir, info, device, "failed", **step,
                             error=f"{type(e).__name__}: {e}",
                             traceback=traceback.format_exc()[-4000:])
        if telemetry is not None:
            telemetry.publish({"type": "event", "kind": "failed", "rank": info.rank,
                               "error": f"{type(e).__name__}: {e}"})
    if isinstance(e, ConfigError):
        log.error("%s", e)


def setup_logging(root: bool = True) -> None:
    """Log lines that name the rank (as the run numbers it, by node in a multi-node run, not
    as torchrun's rendezvous did). ``root=False`` (a user's script runs in this process):
    only the engine's own loggers, so that the script's logging.basicConfig still works."""
    try:
        rank: object = DistInfo.from_env().rank
    except (RuntimeError, ValueError):
        rank = "?"
    fmt = f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s"
    if root:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=fmt)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    engine = logging.getLogger("ddp_engine")
    engine.addHandler(handler)
    engine.setLevel(logging.INFO)
    engine.propagate = False


def close_rank(heartbeat: Heartbeat | None, telemetry: Telemetry | None) -> None:
    """On every exit path: the heartbeat, rank 0's server, and the process group."""
    if heartbeat is not None:
        heartbeat.close()
    if telemetry is not None:
        telemetry.close()
    teardown()


