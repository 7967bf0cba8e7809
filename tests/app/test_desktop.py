"""The desktop install (app/desktop.py, resources/): the icon, the presets, the menu entry and
the ``rankscope`` command of a real ``pip install``."""

from __future__ import annotations

import configparser
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from app import desktop
from ddp_engine.common.config import RunConfig
from ddp_engine.common.config_files import load_config_file
from tests.conftest import REPO


def test_the_icon_is_an_svg_and_pngs_at_the_usual_sizes() -> None:
    files = desktop.icon_files()
    assert files[0].name == "rankscope.svg" and files[0].read_text().startswith("<svg")
    sizes = [int(p.stem.rsplit("-", 1)[1]) for p in files[1:]]
    assert sizes == [16, 24, 32, 48, 64, 128, 256]
    for png in files[1:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_default_preset_is_a_valid_config_with_a_title() -> None:
    presets = desktop.default_presets()
    assert [p.title.split(":")[0] for p in presets] == ["Quick test", "Digits", "Long run"]
    for preset in presets:
        cfg = RunConfig.from_dict(load_config_file(preset.path), source=str(preset.path))
        assert cfg.runs_dir == "runs"  # a preset leaves the runs folder to the form


def test_the_desktop_entry_is_valid_and_installs_with_this_installations_command(
        tmp_path: Path) -> None:
    entry = configparser.ConfigParser(interpolation=None)
    entry.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    entry.read(desktop.DESKTOP_ENTRY)
    section = entry["Desktop Entry"]
    assert (section["Type"], section["Name"], section["Icon"]) == ("Application", "Rankscope",
                                                                    "rankscope")
    assert section["Categories"].endswith(";") and section["Exec"] == "rankscope"
    written = desktop.install_desktop_entry(tmp_path)
    installed = (tmp_path / "applications" / "rankscope.desktop").read_text()
    assert f"Exec={desktop.launch_command()}\n" in installed and "Icon=rankscope\n" in installed
    icons = {p.relative_to(tmp_path).as_posix() for p in written[1:]}
    assert "icons/hicolor/scalable/apps/rankscope.svg" in icons
    assert "icons/hicolor/48x48/apps/rankscope.png" in icons and len(icons) == 8


def test_the_window_shows_the_icon(open_window, tmp_path: Path) -> None:
    window = open_window(tmp_path / "runs")
    sizes = {s.width() for s in window.windowIcon().availableSizes()}
    assert {16, 32, 48, 256} <= sizes


@pytest.mark.slow
def test_a_wheel_carries_the_app_the_engine_the_resources_and_both_commands(
        tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = next(tmp_path.glob("rankscope-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for expected in ("app/cli.py", "app/charts/panels.py", "ddp_engine/common/config.py",
                     "ddp_engine/launch/launcher.py", "ddp_engine/rank/worker.py",
                     "ddp_engine/worker.py", "resources/rankscope.desktop",
                     "resources/icons/rankscope.svg", "resources/icons/rankscope-48.png",
                     "resources/presets/1-quick-test.toml"):
        assert expected in names, f"{expected} is not in {wheel.name}"
    assert not any(n.startswith("tests/") for n in names)
    assert "rankscope = app.cli:main" in entry_points
    assert "rankscope-engine = ddp_engine.launch.cli:main" in entry_points


def test_make_install_gives_the_rankscope_command() -> None:
    script = Path(sys.executable).with_name("rankscope")
    assert script.is_file(), "make install (pip install -e .) writes .venv/bin/rankscope"
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--install-desktop" in proc.stdout, proc.stderr
