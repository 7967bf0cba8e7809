"""How long the Rankscope window takes to show: process start to the first painted frame,
and to the charts (built just after that frame) drawn.

    .venv/bin/python bench/window_startup.py [--reps 5]

Each repetition starts a fresh Python process (offscreen Qt platform, so it runs without a
display) that imports the app, builds MainWindow, shows it and processes events until the window
is exposed; it prints the seconds since this script started it (a time.time() taken just before
the process is spawned, passed in RANKSCOPE_BENCH_T0). Not psutil's create_time: on Linux it is
counted from /proc/stat's boot time, which is whole seconds, so it can be up to 1 s early.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import os, sys, tempfile, time
t0 = float(os.environ["RANKSCOPE_BENCH_T0"])
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.main_window import MainWindow
settings = QSettings(tempfile.mktemp(suffix=".ini"), QSettings.Format.IniFormat)
w = MainWindow(runs_dir=tempfile.mkdtemp(), settings=settings)
w.show()
while not w.isVisible() or not w.windowHandle().isExposed():
    app.processEvents()
w.repaint()
shown = time.time() - t0
w.dashboard.repaint()  # the charts, built just after the first frame
app.processEvents()
print(shown, time.time() - t0)
print("torch" in sys.modules, len(sys.modules))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(REPO))
    shown, charts = [], []
    for _ in range(args.reps):
        env["RANKSCOPE_BENCH_T0"] = repr(time.time())
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                             env=env, cwd=REPO, check=True).stdout
        times, modules = out.strip().splitlines()[-2:]
        a, b = (float(v) for v in times.split())
        if modules.split()[0] != "False":
            sys.exit("the GUI process imported torch: it must never")
        shown.append(a)
        charts.append(b)
        print(f"window shown after {a:.3f} s, charts drawn after {b:.3f} s", flush=True)
    for name, values in (("window shown", shown), ("charts drawn", charts)):
        print(f"{name}: median {statistics.median(values):.3f} s, min {min(values):.3f}, "
              f"max {max(values):.3f} ({args.reps} runs)")
    import_profile(env)


def import_profile(env: dict[str, str], top: int = 10) -> None:
    """One more start under ``python -X importtime``: what the start-up imports cost, by
    top-level package, and proof that torch is not among them."""
    env = dict(env, RANKSCOPE_BENCH_T0=repr(time.time()))
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", PROBE], capture_output=True,
                         text=True, env=env, cwd=REPO, check=True).stderr
    by_package: dict[str, int] = {}
    for line in err.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _self, cumulative, name = line.removeprefix("import time:").split("|")
        if name.startswith("  ") or not cumulative.strip().isdigit():
            continue  # nested: counted in its top-level import
        package = name.strip().split(".")[0]
        by_package[package] = by_package.get(package, 0) + int(cumulative)
    total = sum(by_package.values())
    print(f"imports at start-up: {total / 1e6:.2f} s in all (-X importtime, one run); "
          f"torch imported: {'yes' if 'torch' in by_package else 'no'}")
    for package, us in sorted(by_package.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {package:<24} {us / 1e6:6.3f} s")


if __name__ == "__main__":
    main()
