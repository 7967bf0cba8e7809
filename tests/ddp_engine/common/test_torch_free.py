"""The shared part of the engine is what the GUI process imports: none of it may pull in torch."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import ddp_engine.common
from tests.conftest import REPO


def test_every_shared_module_imports_without_torch() -> None:
    names = sorted(m.name for m in pkgutil.iter_modules(ddp_engine.common.__path__,
                                                         "ddp_engine.common."))
    assert "ddp_engine.common.config" in names and "ddp_engine.common.processes" in names
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            "from ddp_engine.common import gpus\n"
            "gpus.list_gpus()\n"  # NVML's inventory, where there is one, without torch too
            "sys.exit(1 if 'torch' in sys.modules else 0)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, "a module of ddp_engine.common imported torch " + proc.stderr
