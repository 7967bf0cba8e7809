"""The environment of a child ``python -m ddp_engine ...`` process (standard library only).

Used by the app (it starts the launcher) and by the scaling sweep (it starts one launcher per
process count). The caller's own ``os.environ`` is never changed.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The folder holding the ``ddp_engine`` package: put on the child's PYTHONPATH."""


def build_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """A fresh environment for one child (``base``, default ``os.environ``, is not changed).

    Args:
        base: the variables to start from.

    Returns:
        ``base`` plus unbuffered output and the repository on PYTHONPATH, without
        QT_QPA_PLATFORM (the run has no window).
    """
    env = dict(os.environ if base is None else base)
    env["PYTHONUNBUFFERED"] = "1"
    repo = str(REPO_ROOT)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("QT_QPA_PLATFORM", None)
    return env
