"""The desktop app's command, ``rankscope`` (or ``python main.py``): the flags, then the window."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.main_window import MainWindow


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rankscope", description="Rankscope desktop app: "
                                     "launch PyTorch DDP training and watch every rank live")
    parser.add_argument("--runs-dir", default=None,
                        help="folder of run folders (default: the one the --config preset "
                        "names, else the one used last, else ./runs)")
    parser.add_argument("--config", help="a TOML preset to fill the launch form with")
    parser.add_argument("--start", action="store_true",
                        help="start the run at once (the --config preset, else the last form)")
    parser.add_argument("--stop-grace-s", type=float, default=30.0, metavar="S",
                        help="after Stop, seconds to wait for the agreed stop before SIGTERM "
                        "(then SIGKILL 10 s later); default 30")
    parser.add_argument("--settings", metavar="FILE",
                        help="keep the window's settings (the last form) in this INI file "
                        "instead of the user's (~/.config/Rankscope/Rankscope.conf)")
    parser.add_argument("--install-desktop", action="store_true",
                        help="add Rankscope to this user's application menu (a .desktop entry "
                        "and its icons under $XDG_DATA_HOME, default ~/.local/share), then exit")
    return parser.parse_args(argv)


def open_window(args: argparse.Namespace) -> MainWindow:
    """The window the flags ask for, shown (a QApplication must exist)."""
    from PySide6.QtCore import QSettings

    from app.main_window import MainWindow

    settings = (QSettings(args.settings, QSettings.Format.IniFormat) if args.settings
                else None)  # None: the user's own
    window = MainWindow(runs_dir=args.runs_dir, preset=args.config, settings=settings,
                        grace_s=args.stop_grace_s)
    window.show()
    return window


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from app import desktop
    from ddp_engine.common.config import ConfigError, RunConfig
    from ddp_engine.common.config_files import load_config_file

    if args.config:  # a bad preset: one line and exit 2, before any window
        try:
            RunConfig.from_dict(load_config_file(args.config), source=f"preset {args.config}")
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

    if args.install_desktop:
        for path in desktop.install_desktop_entry():
            print(path)
        return 0

    from PySide6.QtCore import QSocketNotifier
    from PySide6.QtWidgets import QApplication

    app = QApplication(sys.argv[:1])
    app.setApplicationName("Rankscope")
    app.setOrganizationName("Rankscope")
    app.setDesktopFileName(desktop.APP_ID)  # Wayland matches the window to the menu entry by it
    app.setWindowIcon(desktop.app_icon())  # every window and the taskbar
    # Ctrl+C in the terminal: Python sees the signal only when it runs, and the Qt loop keeps it
    # in C++; a wake-up fd makes the loop notice, then the window closes as if asked.
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGINT, lambda *_: window.close())
    notifier = QSocketNotifier(wake_r.fileno(), QSocketNotifier.Type.Read)
    notifier.activated.connect(lambda *_: wake_r.recv(64))
    window = open_window(args)
    if args.start:
        window.start_run()
    return app.exec()
