"""The launch form's "Your script" source: the rows of a user's own script
(:class:`ScriptFields`), its argument line split as a shell would (:func:`split_args`), and the
config a past run puts back in the form (:func:`refill_config`).

The app has no caller's folder to give a script (the CLI, like torchrun, runs it in the folder
``launch`` is started in): the working folder is a field of its own, filled with the script's
folder when a script is picked, and the config the form makes always names it.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QLabel, QLineEdit, QWidget

from app.run_model import resume_config
from app.spec_field import PathField
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.run_dir import CONFIG_FILE, read_json

CWD_NOTE = ("Relative paths in the arguments are read from here: the script's folder when you "
            "pick a script (torchrun would use the folder you start it in).")
NOTE_STYLE = "color: #6b6b6b;"


def script_folder(script: str | None) -> str:
    """The folder of the script at ``script`` as an absolute path ("" for no script)."""
    script = (script or "").strip()
    return os.path.dirname(os.path.abspath(os.path.expanduser(script))) if script else ""


class ScriptFields:
    """The form's rows for a user's own script: the .py file, its arguments in one line (split
    as a shell would) and its working folder (filled with the script's folder when the script
    changes, if it was empty or held the previous script's folder)."""

    def __init__(self) -> None:
        self.script = PathField("script", file_filter="Python (*.py)",
                                placeholder="train.py, as you give it to torchrun")
        self.args = QLineEdit()
        self.args.setObjectName("script_args")
        self.args.setPlaceholderText("e.g. --epochs 3 --lr 0.1")
        self.args.setToolTip("the script's arguments, split as a shell would: quote an "
                             "argument with spaces in it")
        self.cwd = PathField("script_cwd", folder=True, placeholder="the script's folder")
        self.cwd.setToolTip("the folder every rank runs the script in (its working folder)")
        self.cwd_note = QLabel(CWD_NOTE)
        self.cwd_note.setObjectName("script_cwd_note")
        self.cwd_note.setWordWrap(True)
        self.cwd_note.setStyleSheet(NOTE_STYLE)
        self.hint = QLabel("Every rank runs it, unchanged, as torchrun would; Rankscope sees "
                           "its steps, loss and gradient sync. Stop ends it at an agreed step "
                           "and keeps its model in checkpoints/last.pt.")
        self.hint.setObjectName("script_hint")
        self.hint.setWordWrap(True)
        self._folder = ""  # the folder of the script the field holds now
        self.script.changed.connect(self._follow_script)

    def rows(self) -> list[tuple[str | None, QWidget]]:
        """(label, widget) rows; "": under the fields above it, None: the whole row."""
        return [("Script", self.script), ("Arguments", self.args),
                ("Working folder", self.cwd), ("", self.cwd_note), (None, self.hint)]

    def _follow_script(self) -> None:
        """A new script: its folder in the working folder, unless the user chose another."""
        folder = script_folder(self.script.value())
        if self.cwd.value() in ("", self._folder):
            self.cwd.path.setText(folder)
        self._folder = folder

    def values(self) -> dict[str, Any]:
        """RunConfig's script fields; the working folder always explicit (an emptied field:
        the script's folder).

        Raises:
            ConfigError: the arguments do not split as a shell would split them.
        """
        script = self.script.value()
        return {"script": script, "script_args": split_args(self.args.text()),
                "script_cwd": self.cwd.value() or script_folder(script) or None}

    def set_config(self, cfg: RunConfig) -> None:
        """The script's rows from ``cfg``; a config with no working folder (a preset written
        by hand, settings of an older version) gets the script's folder."""
        self.script.path.setText(cfg.script or "")
        self.args.setText(shlex.join(cfg.script_args))
        self.cwd.path.setText(cfg.script_cwd or script_folder(cfg.script))


_SPLIT_HINTS = {"No closing quotation": "a quote is not closed; close it, or put a backslash "
                                        "before a quote meant literally",
                "No escaped character": "the line ends in a backslash that escapes nothing; "
                                        "remove it, or double it for a backslash"}


def split_args(line: str) -> list[str]:
    """A script's arguments from one line, split as a shell would (quotes keep spaces).

    Raises:
        ConfigError: naming script_args, the line and what is wrong with it.
    """
    try:
        return shlex.split(line)
    except ValueError as e:
        raise ConfigError(f"script_args: cannot split {line!r} into arguments as a shell "
                          f"would: {_SPLIT_HINTS.get(str(e), str(e))}") from None


def refill_config(path: Path, runs_dir: Path) -> tuple[RunConfig, str]:
    """The config Resume... puts in the form for the run in ``path``, and the line that says
    so: a built-in run resumes from its last checkpoint (:func:`app.run_model.resume_config`);
    a script run is run again as a new run (only a script can load its own checkpoints), in
    the working folder it ran in.

    Raises:
        ValueError: why not (no config, a config that no longer validates, ...).
    """
    data = read_json(path / CONFIG_FILE)
    if not (isinstance(data, dict) and data.get("script")):
        return resume_config(path, runs_dir)
    try:
        cfg = RunConfig.from_dict(data, source=str(path / CONFIG_FILE))
    except ConfigError as e:
        raise ValueError(f"cannot run {path.name} again: {e}") from None
    cfg = dataclasses.replace(cfg, run_dir=None, dry_run=False, runs_dir=str(runs_dir))
    ckpt = path / "checkpoints" / "last.pt"
    kept = (f"; its model at the stop is in {ckpt}: pass that to the script's arguments if it "
            "can load one" if ckpt.is_file() else "")
    return cfg, (f"{path.name} ran your script {Path(cfg.script or '').name}: it is in the form "
                 f"with its arguments, to run again as a new run{kept}; edit if needed, then "
                 "Start (F5)")
