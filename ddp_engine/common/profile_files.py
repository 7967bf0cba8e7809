"""Where a run's profiles live (issue 31), torch-free: ``RUN_DIR/profiles/<time>-step<S>/``
holds ``rank-<N>.json.gz`` (a Chrome/Perfetto trace, torch.profiler's), ``rank-<N>.error.txt``
for a rank that has none (why), and ``summary.json``."""

from __future__ import annotations

import re
import time
from pathlib import Path

PROFILES_DIR = "profiles"
SUMMARY_FILE = "summary.json"
DEFAULT_STEPS = 5
MAX_STEPS = 50
"""At most this many steps per profile: a trace grows with every step (GPU runs: megabytes)."""

RECORDED_KEY = "rankscope_recorded_steps"
"""A trace's metadata key: how many of its step markers are steps, when training ended before
the profile's last step (the marker that torch closes after them spans no step)."""

_TRACE = re.compile(r"^rank-(\d+)\.json\.gz$")
_ERROR = re.compile(r"^rank-(\d+)\.error\.txt$")


def profile_folder_name(asked_at: float, step: int) -> str:
    """``20261207-031522-step120``: when it was asked for (rank 0's clock, the same name on
    every rank) and the step after which it started."""
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(asked_at)) + f"-step{step}"


def trace_file(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.json.gz"


def error_file(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.error.txt"


def traces(folder: Path) -> dict[int, Path]:
    """The whole traces in ``folder``, by rank."""
    found = {}
    for p in folder.iterdir() if folder.is_dir() else ():
        m = _TRACE.match(p.name)
        if m:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def errors(folder: Path) -> dict[int, str]:
    """Why a rank has no trace in ``folder``, by rank."""
    found = {}
    for p in folder.iterdir() if folder.is_dir() else ():
        m = _ERROR.match(p.name)
        if m:
            found[int(m.group(1))] = p.read_text(encoding="utf-8", errors="replace").strip()
    return dict(sorted(found.items()))


def wait_for_ranks(folder: Path, ranks: range, timeout_s: float, poll_s: float = 0.2,
                   ) -> list[int]:
    """Wait until every rank of ``ranks`` wrote its trace or its reason, at most ``timeout_s``.
    Returns the ranks still missing."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = set(traces(folder)) | set(errors(folder))
        missing = [r for r in ranks if r not in done]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(poll_s)


def profile_folders(run_dir: Path) -> list[Path]:
    """A run's profile folders, oldest first."""
    root = Path(run_dir) / PROFILES_DIR
    return sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name) \
        if root.is_dir() else []
