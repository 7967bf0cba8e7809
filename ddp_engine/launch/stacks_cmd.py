"""``python -m ddp_engine stacks RUN_DIR``: every live rank's stack, grouped by where the ranks
stand (see :mod:`ddp_engine.common.stacks`)."""

from __future__ import annotations

import argparse
import sys

from ddp_engine.common.stacks import NotARunFolder, take_stacks


def add_stacks_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="S",
                        help="seconds to wait for each rank's stacks (default: 10)")


def run_stacks(ns: argparse.Namespace) -> int:
    """Print the grouped stacks; 0 when some rank answered, 1 when none is live (or none
    answered), 2 for a folder that is not a run folder."""
    if ns.timeout <= 0:
        print(f"error: --timeout must be > 0 seconds, got {ns.timeout:g}", file=sys.stderr)
        return 2
    try:
        report = take_stacks(ns.run_dir, timeout_s=ns.timeout)
    except NotARunFolder as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not report.ranks:
        why = "; ".join(report.notes)
        print(f"no live rank to take stacks from in {ns.run_dir}" + (f": {why}" if why else
              " (the run has ended, or not started its ranks yet)"), file=sys.stderr)
        return 1
    print(report.text, end="")
    print(f"\nsaved, with every thread of every rank: {report.path}")
    return 0
