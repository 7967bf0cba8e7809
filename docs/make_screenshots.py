"""The screenshots in docs/screenshots/: the real window under Xvfb, at 1000x700 and 1600x1000,
in each state a user meets: the first window, the remote attach dialog, a live run, a stopped
run, a failed run, a user's own script, Compare and a scaling sweep. The runs shown are real
(2 CPU processes).

    .venv/bin/python docs/make_screenshots.py [OUT_DIR]     (what `make screenshot` runs)

Needs Debian's xvfb and the X libraries Qt's xcb platform loads (`make screenshot` installs
them). The window is driven in-process; each picture is the X screen (QScreen.grabWindow)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
SIZES = ((1000, 700), (1600, 1000))
STATES = ("first-window", "live", "stopped", "failed", "script", "compare", "sweep")
CRASH = '''import os
import torch.nn.functional as F

_calls = 0


def crash_at_step_250(output, target):
    """Rank 1 raises at its 250th call: what a failed run looks like."""
    global _calls
    _calls += 1
    if os.environ.get("RANK") == "1" and _calls == 250:
        raise RuntimeError("a loss that fails on purpose (docs/make_screenshots.py)")
    return F.cross_entropy(output, target)
'''


def engine(*args: str) -> None:
    subprocess.run([PY, "-m", "ddp_engine", *args], cwd=REPO, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)


def newest(runs: Path, prefix: str) -> Path:
    return max(runs.glob(prefix + "*"), key=lambda p: p.stat().st_mtime)


def make_runs(runs: Path) -> dict[str, Path]:
    """Real runs to photograph: completed, stopped, failed, a script's, and a sweep."""
    common = ("--nproc", "2", "--device", "cpu", "--runs-dir", str(runs))
    engine("launch", "--model", "mlp", "--dataset", "digits", "--max-steps", "300",
           "--name", "mlp-digits", *common)
    engine("launch", "--model", "convnet", "--dataset", "digits", "--max-steps", "600",
           "--lr", "0.003", "--name", "convnet-digits", *common)
    proc = subprocess.Popen([PY, "-m", "ddp_engine", "launch", "--model", "convnet",
                             "--dataset", "digits", "--max-steps", "50000", "--name",
                             "convnet-long", *common], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    time.sleep(25)  # a few hundred steps of a run that would take an hour, then Stop
    engine("stop", str(newest(runs, "convnet-long")))
    proc.wait(timeout=120)
    crash = runs / "crash.py"
    crash.write_text(CRASH)
    engine("launch", "--model", "mlp", "--dataset", "digits", "--max-steps", "300",
           "--loss", f"{crash}:crash_at_step_250", "--name", "mlp-crash", *common)
    engine("launch", "--script", "examples/ddp_train.py", "--name", "ddp-train-script",
           *common, "--", "--epochs", "3", "--hidden", "512", "--checkpoint",
           str(runs / "script.pt"))
    engine("sweep", "--model", "mlp", "--dataset", "synthetic", "--max-steps", "100",
           "--log-every", "10", "--name", "sweep-mlp", *common)
    return {"completed": newest(runs, "convnet-digits"), "earlier": newest(runs, "mlp-digits"),
            "stopped": newest(runs, "convnet-long"), "failed": newest(runs, "mlp-crash"),
            "script": newest(runs, "ddp-train-script"), "sweep": newest(runs, "sweep-mlp")}


def shoot(out: Path, runs: Path, found: dict[str, Path], width: int, height: int) -> None:
    """One window at ``width`` x ``height`` on the X display in DISPLAY, every state."""
    from PySide6.QtCore import QCoreApplication, QEvent, QSettings
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow

    app = QApplication.instance() or QApplication([])

    def settle(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            # What the event loop does between events (this script drives it by hand).
            QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
            time.sleep(0.02)

    def grab(state: str) -> None:
        settle(1.5)
        path = out / f"{state}-{width}x{height}.png"
        app.primaryScreen().grabWindow(0).save(str(path))
        print("wrote", path)

    def window(folder: Path, name: str) -> MainWindow:
        settings = QSettings(str(runs / f"{name}.ini"), QSettings.Format.IniFormat)
        w = MainWindow(runs_dir=str(folder), settings=settings, gpus=[])
        w.resize(width, height)
        w.move(0, 0)
        w.show()
        settle(1.0)
        return w

    empty = runs.parent / "first-window-runs"
    empty.mkdir(exist_ok=True)
    w = window(empty, f"first-{width}")
    grab("first-window")
    from app import remote_attach

    dialog = remote_attach.show_dialog(w)  # Attach to remote rank 0: how to reach it
    dialog.host.setText("10.0.0.1")
    dialog.port.setText("29600")
    grab("remote-attach")
    dialog.reject()
    w.close()

    w = window(runs, f"main-{width}")
    w.panel.max_steps.setValue(3000)
    w.panel.model.combo.setCurrentText("convnet")
    w.panel.dataset.combo.setCurrentText("digits")
    live = w.start_run()
    assert live is not None
    end = time.monotonic() + 120
    while w.store.info.step < 400 and time.monotonic() < end:
        settle(0.2)
    grab("live")
    w.dashboard.profile.take()  # Profile 5 steps: the reading under the charts
    while w.dashboard.profile.summary is None and time.monotonic() < end + 120:
        settle(0.2)
    grab("profile")
    w.stop_run()
    while w.controller.active and time.monotonic() < end + 60:
        settle(0.2)
    for state in ("stopped", "failed", "script"):
        w.open_run(found[state])
        grab(state)
    w.compare_runs([found["earlier"], found["completed"], found["stopped"]])
    grab("compare")
    w.open_run(found["sweep"])
    grab("sweep")
    w.close()


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    if os.environ.get("SCREENSHOT_SIZE"):  # the child: one size on the display given
        width, height = map(int, os.environ["SCREENSHOT_SIZE"].split("x"))
        runs = Path(os.environ["SCREENSHOT_RUNS"])
        found = {k: runs / v for k, v in (line.split("=", 1) for line in
                                          os.environ["SCREENSHOT_FOUND"].split(";"))}
        shoot(out, runs, found, width, height)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        runs.mkdir()
        found = make_runs(runs)
        for i, (width, height) in enumerate(SIZES):
            display = f":{90 + i}"
            xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", f"{width}x{height}x24",
                                     "-nolisten", "tcp"], stderr=subprocess.DEVNULL)
            try:
                time.sleep(1.0)
                env = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb",
                       "SCREENSHOT_SIZE": f"{width}x{height}", "SCREENSHOT_RUNS": str(runs),
                       "SCREENSHOT_FOUND": ";".join(f"{k}={v.name}" for k, v in found.items()),
                       "HOME": tmp}
                subprocess.run([PY, __file__, str(out)], cwd=REPO, env=env, check=True,
                               timeout=900)
            finally:
                xvfb.send_signal(signal.SIGTERM)
                xvfb.wait()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
