"""The app on the desktop: its icon, the default presets the launch form offers, and its entry
in the desktop's application menu (freedesktop: a .desktop file and hicolor icons). Qt only in
:func:`app_icon` (``--install-desktop`` runs without it).

Everything here reads ``resources/`` (beside ``app/`` in a checkout, and in site-packages after
``pip install .``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PySide6.QtGui import QIcon

RESOURCES = Path(__file__).resolve().parents[1] / "resources"
ICONS = RESOURCES / "icons"
PRESETS = RESOURCES / "presets"
DESKTOP_ENTRY = RESOURCES / "rankscope.desktop"
APP_ID = "rankscope"
"""The desktop file's and the icon's name (Qt's desktopFileName, for Wayland's taskbar)."""


def icon_files() -> list[Path]:
    """The app icon: the SVG first, then the PNGs from small to large."""
    pngs = sorted(ICONS.glob(f"{APP_ID}-*.png"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    return [ICONS / f"{APP_ID}.svg", *pngs]


def app_icon() -> QIcon:
    """Rankscope's icon at every PNG size (as pixmaps, so that X11 lists the sizes in the
    window's _NET_WM_ICON for the taskbar; an SVG icon engine would list none)."""
    from PySide6.QtGui import QIcon

    icon = QIcon()
    for path in icon_files():
        if path.suffix == ".png":
            icon.addFile(str(path))
    return icon


@dataclass(frozen=True)
class Preset:
    """A preset the launch form offers: a config file, titled by its first comment line."""

    title: str
    path: Path


def default_presets(folder: Path = PRESETS) -> list[Preset]:
    """The presets shipped in resources/presets, in file-name order."""
    out = []
    for path in sorted(folder.glob("*.toml")):
        first = path.read_text(encoding="utf-8").splitlines()[:1]
        title = first[0].lstrip("#").strip() if first and first[0].startswith("#") else ""
        out.append(Preset(title or path.stem, path))
    return out


def launch_command() -> str:
    """The command that opens this app as installed now: the ``rankscope`` script beside this
    Python when there is one (pip install), else this Python running main.py (a checkout)."""
    script = Path(sys.executable).with_name(APP_ID)
    if script.is_file() and os.access(script, os.X_OK):
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(RESOURCES.parent / 'main.py'))}"


def install_desktop_entry(data_home: Path | None = None) -> list[Path]:
    """Add Rankscope to the desktop's application menu for this user: the .desktop entry (its
    Exec line the command that opens this installation) in ``data_home``/applications and the
    icons in ``data_home``/icons/hicolor. ``data_home`` defaults to $XDG_DATA_HOME, else
    ~/.local/share. Returns the files written."""
    home = data_home or Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share")
    written = []
    entry = home / "applications" / f"{APP_ID}.desktop"
    entry.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"Exec={launch_command()}" if line.startswith("Exec=") else line
             for line in DESKTOP_ENTRY.read_text(encoding="utf-8").splitlines()]
    entry.write_text("\n".join(lines) + "\n", encoding="utf-8")
    written.append(entry)
    for icon in icon_files():
        size = "scalable" if icon.suffix == ".svg" else "{0}x{0}".format(icon.stem.rsplit("-")[1])
        dest = home / "icons" / "hicolor" / size / "apps" / f"{APP_ID}{icon.suffix}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(icon, dest)
        written.append(dest)
    return written
