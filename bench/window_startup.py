"""How long the Rankscope window takes to show: process start to the first painted frame,
and to the charts (built just after that frame) drawn.

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
shown = time.time() - psutil.Process().create_time()
w.dashboard.repaint()  # the charts, built just after the first frame
app.processEvents()
print(shown, time.time() - psutil.Process().create_time())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(REPO))
    shown, charts = [], []
    for _ in range(args.reps):
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                             env=env, cwd=REPO, check=True).stdout
        a, b = (float(v) for v in out.strip().splitlines()[-1].split())
        shown.append(a)
        charts.append(b)
        print(f"window shown after {a:.3f} s, charts drawn after {b:.3f} s", flush=True)
    for name, values in (("window shown", shown), ("charts drawn", charts)):
        print(f"{name}: median {statistics.median(values):.3f} s, min {min(values):.3f}, "
              f"max {max(values):.3f} ({args.reps} runs)")


if __name__ == "__main__":
    main()
