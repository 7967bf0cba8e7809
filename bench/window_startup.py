"""How long the Rankscope window takes to show: process start to the first painted frame.

    .venv/bin/python bench/window_startup.py [--reps 5]

Each repetition starts a fresh Python process (offscreen Qt platform, so it runs without a
display) that imports the app, builds MainWindow, shows it and processes events until the window
is exposed; it prints the seconds since its own interpreter started (psutil create_time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import sys, tempfile, time, psutil
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
print(time.time() - psutil.Process().create_time())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(REPO))
    times = []
    for _ in range(args.reps):
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                             env=env, cwd=REPO, check=True).stdout
        times.append(float(out.strip().splitlines()[-1]))
        print(f"window shown after {times[-1]:.3f} s", flush=True)
    print(f"median {statistics.median(times):.3f} s, min {min(times):.3f}, "
          f"max {max(times):.3f} ({args.reps} runs)")


if __name__ == "__main__":
    main()
