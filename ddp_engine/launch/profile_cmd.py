"""``python -m ddp_engine profile RUN_DIR [--steps N] [--wait]``: every rank of a live run
profiles the same steps (see :mod:`ddp_engine.rank.profiling`); with ``--wait``, the summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ddp_engine.common.profile_client import (
    ProfileError,
    ask_profile,
    check_steps,
    follow_profile,
)
from ddp_engine.common.profile_files import DEFAULT_STEPS, MAX_STEPS, PROFILES_DIR
from ddp_engine.common.profile_summary import write_summary
from ddp_engine.common.profile_text import summary_text
from ddp_engine.common.protocol import Connection, ProtocolError
from ddp_engine.common.run_dir import FINAL_STATES, read_status
from ddp_engine.common.stacks import NotARunFolder, check_run_folder


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="?")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                        help=f"steps to record, 1-{MAX_STEPS} (default: {DEFAULT_STEPS})")
    parser.add_argument("--wait", action="store_true",
                        help="wait until the traces are written and print the summary")
    parser.add_argument("--shapes", action="store_true",
                        help="record operators' input shapes (collectives' sizes on gloo)")
    parser.add_argument("--stacks", action="store_true", help="record Python stacks")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="seconds --wait waits for the profile (default: 300)")
    parser.add_argument("--read", metavar="FOLDER", type=Path,
                        help="instead of asking a run: read the traces in a profile folder "
                        "(RUN_DIR/profiles/<time>-step<S>) again into its summary.json, and "
                        "print it (after copying in other nodes' rank-N.json.gz)")


def run_profile(ns: argparse.Namespace) -> int:
    """0 asked (and, with --wait, written and summarized); 1 no live run, refused, or not
    written in time; 2 bad input."""
    if ns.read is not None:
        return _read_again(ns.read) if ns.run_dir is None else _bad(
            "give RUN_DIR (to profile a live run) or --read FOLDER, not both")
    if ns.run_dir is None:
        return _bad("RUN_DIR: the run folder of a live run is needed (or --read FOLDER)")
    try:
        check_steps(ns.steps)
        if not ns.timeout > 0 or ns.timeout == float("inf"):
            raise ValueError(f"timeout must be a number of seconds > 0, got {ns.timeout:g}")
        check_run_folder(ns.run_dir)
    except (ValueError, NotARunFolder) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    status = read_status(ns.run_dir) or {}
    if status.get("state") in FINAL_STATES:
        print(f"error: the run has ended ({status['state']} at step {status.get('step')}): "
              "a profile is taken of a live run", file=sys.stderr)
        return 1
    try:
        with Connection(ns.run_dir) as conn:
            asked = ask_profile(conn, ns.steps, shapes=ns.shapes, stacks=ns.stacks)
            print(f"profile of {ns.steps} steps asked for: every rank starts at the next agreed "
                  f"round; traces go to {ns.run_dir}/{PROFILES_DIR}/", flush=True)
            if not ns.wait:
                return 0
            summary = follow_profile(conn, asked, ns.timeout, on_started=_started)
    except (ProtocolError, ProfileError, OSError, ValueError) as e:  # the run went away, or
        print(f"error: {e}", file=sys.stderr)  # its traces cannot be read
        return 1
    print(summary_text(summary), end="")
    return 0


def _read_again(folder: Path) -> int:
    try:
        summary = write_summary(folder)
    except (OSError, ValueError) as e:
        return _bad(f"--read: {e}")
    print(summary_text(summary), end="")
    return 0


def _bad(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _started(msg: dict[str, Any]) -> None:
    print(f"recording steps {msg['first_step']}-{msg['first_step'] + msg['steps'] - 1} on "
          f"every rank, into {msg['folder']}", flush=True)
