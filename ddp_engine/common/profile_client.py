"""Asking a live run for a profile and following it to its summary (issue 31), torch-free: the
command line (``python -m ddp_engine profile``) and the app use it.

Over the run's telemetry connection: ``{"type": "profile", "steps": N, "shapes": bool,
"stacks": bool}``; rank 0 answers ``ack`` (with the ask's ``id``) or ``error``. The profile
then shows up as events of kind ``profile``: ``state`` "started" (its ``folder``, the first
recorded step) and "written" (``summary``, the summary.json path), with the same ``id``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ddp_engine.common.profile_files import MAX_STEPS, SUMMARY_FILE, traces, wait_for_ranks
from ddp_engine.common.profile_summary import write_summary
from ddp_engine.common.profile_trace import load_trace
from ddp_engine.common.protocol import Connection
from ddp_engine.common.run_dir import FINAL_STATES, read_json


class ProfileError(RuntimeError):
    """The run refused the profile, ended before it was written, or never answered."""


def check_steps(steps: Any) -> int:
    """Raises ValueError naming the field, the value and what is allowed."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be a whole number between 1 and {MAX_STEPS}, "
                         f"got {steps!r}")
    return steps


def ask_profile(conn: Connection, steps: int, *, shapes: bool = False, stacks: bool = False,
                timeout_s: float = 10.0) -> float:
    """Send the ask and wait for rank 0's answer; returns the ask's id.

    Raises:
        ProfileError: refused (the reason rank 0 gave), or no answer in ``timeout_s``.
    """
    conn.send({"type": "profile", "steps": check_steps(steps), "shapes": shapes,
               "stacks": stacks})
    reply = _wait(conn, lambda m: m.get("command") == "profile"
                  and m.get("type") in ("ack", "error"), timeout_s)
    if reply is None:
        raise ProfileError(f"the run at {conn.address} did not answer the profile request "
                           f"within {timeout_s:g} s (a run started before profiles existed "
                           "does not know the command)")
    if reply["type"] == "error":
        raise ProfileError(str(reply.get("message")))
    return float(reply["id"])


def follow_profile(conn: Connection, asked: float, timeout_s: float,
                   on_started: Any = None) -> dict[str, Any]:
    """Wait for the profile ``asked`` to be written; returns its summary (read from its
    summary.json, or made here when the run ended before rank 0 made it).

    Raises:
        ProfileError: the run ended before the profile started, or nothing came in time.
    """
    folder: Path | None = None
    deadline = time.monotonic() + timeout_s
    while True:
        msg = _wait(conn, lambda m: m.get("type") == "event" and (
            (m.get("kind") == "profile" and m.get("id") == asked)
            or m.get("kind") in FINAL_STATES), max(0.0, deadline - time.monotonic()))
        if msg is None:
            break
        if msg.get("kind") in FINAL_STATES:
            if folder is not None:  # the run ended first: each rank's trace, or its reason
                wait_for_ranks(folder, _ranks_of(folder), ENDED_WAIT_S)
                if traces(folder):
                    return write_summary(folder)
            raise ProfileError(f"the run ended ({msg['kind']}) before the profile "
                               + ("was written" if folder else "started"))
        folder = Path(msg["folder"])
        if msg.get("state") == "failed":
            raise ProfileError(f"no rank could be profiled ({msg.get('reason')})")
        if msg.get("state") == "started" and on_started is not None:
            on_started(msg)
        if msg.get("state") == "written":
            return read_summary(folder)
    raise ProfileError(f"the profile was not written within {timeout_s:g} s"
                       + (f" (its folder: {folder})" if folder else
                          " (is the run stalled? a profile starts at the next agreed round)"))


ENDED_WAIT_S = 30.0
"""When the run ended during a profile: how long the other ranks' traces are waited for."""


def _ranks_of(folder: Path) -> range:
    """The ranks a profile folder should hold, as far as its traces say (their world size)."""
    for path in traces(folder).values():
        try:
            world = int(load_trace(path).get("distributedInfo", {}).get("world_size") or 1)
        except (ValueError, TypeError, AttributeError):
            continue
        return range(world)
    return range(0)


def read_summary(folder: Path) -> dict[str, Any]:
    """``folder``'s summary.json, made from its traces first when it is missing."""
    summary = read_json(folder / SUMMARY_FILE)
    return summary if isinstance(summary, dict) else write_summary(folder)


def _wait(conn: Connection, wanted: Any, timeout_s: float) -> dict[str, Any] | None:
    """The first message ``wanted`` accepts within ``timeout_s`` (None: none, or closed)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        got = conn.poll(min(left, 1.0))
        if got is None:
            raise ProfileError("the run's telemetry connection closed (the run has ended)")
        for msg in got:
            if wanted(msg):
                return msg
    return None

