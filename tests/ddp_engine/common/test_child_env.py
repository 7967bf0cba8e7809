"""The environment of a child process: the package is importable from the PYTHONPATH it gets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ddp_engine.common.child_env import REPO_ROOT, build_env


def test_a_child_imports_the_package_from_its_pythonpath_alone(tmp_path: Path) -> None:
    """With site-packages off (-S: no editable install to fall back on) and its working folder
    elsewhere, a child finds ddp_engine through the PYTHONPATH build_env gives it. (After the
    layout change REPO_ROOT pointed at ddp_engine/ itself, one folder too deep, and only the
    editable install hid it.)"""
    env = build_env({"PATH": "/usr/bin:/bin"})
    assert env["PYTHONPATH"].split(":")[0] == str(REPO_ROOT)
    done = subprocess.run([sys.executable, "-S", "-c",
                           "import ddp_engine; print(ddp_engine.__file__)"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == REPO_ROOT / "ddp_engine" / "__init__.py"
    assert "QT_QPA_PLATFORM" not in build_env({"QT_QPA_PLATFORM": "offscreen"})
