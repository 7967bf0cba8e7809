"""The Rankscope desktop app: ``python main.py [--runs-dir DIR] [--config FILE] [--start]``."""

from __future__ import annotations

import argparse
import signal
import socket
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rankscope", description="Rankscope desktop app")
    parser.add_argument("--runs-dir", default="runs", help="folder of run folders (default: runs)")
    parser.add_argument("--config", help="a TOML preset to fill the launch form with")
    parser.add_argument("--start", action="store_true",
                        help="start the run at once (the --config preset, else the last form)")
    parser.add_argument("--stop-grace-s", type=float, default=30.0, metavar="S",
                        help="after Stop, seconds to wait for the agreed stop before SIGTERM "
                        "(then SIGKILL 10 s later); default 30")
    args = parser.parse_args(argv)

    from PySide6.QtCore import QSocketNotifier
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow

    app = QApplication(sys.argv[:1])
    app.setApplicationName("Rankscope")
    app.setOrganizationName("Rankscope")
    # Ctrl+C in the terminal: Python sees the signal only when it runs, and the Qt loop keeps it
    # in C++; a wake-up fd makes the loop notice, then the window closes as if asked.
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGINT, lambda *_: window.close())
    notifier = QSocketNotifier(wake_r.fileno(), QSocketNotifier.Type.Read)
    notifier.activated.connect(lambda *_: wake_r.recv(64))
    window = MainWindow(runs_dir=args.runs_dir, preset=args.config, grace_s=args.stop_grace_s)
    window.show()
    if args.start:
        window.start_run()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
