"""What the dashboard says before there is anything to chart: on the first window, a page
that says what Start will do with the form as it is, how to run one's own script and where
runs are kept; while a run starts, where the start-up is (launching torchrun, the ranks up,
waiting for the first report)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject

from ddp_engine.common.config import ConfigError, RunConfig

if TYPE_CHECKING:
    from app.main_window import MainWindow

SCRIPT_COMMAND = "python -m ddp_engine launch --script train.py --nproc 2 -- ARGS"


def what_start_does(cfg: RunConfig) -> str:
    """"mlp on synthetic data with 2 CPU processes for 200 steps" (plain text)."""
    what = (f"your script {cfg.script}" if cfg.script
            else f"{cfg.model} on {cfg.dataset} data")
    if cfg.gpus:
        where = "GPU " + ", ".join(str(g) for g in cfg.gpus)
        where = ("GPUs " + where[4:]) if len(cfg.gpus) > 1 else where
    else:
        n = cfg.nproc or 2
        where = f"{n} CPU process{'es' if n != 1 else ''}"
    length = (f" for {cfg.max_steps} steps" if cfg.max_steps
              else f" for {cfg.epochs} epoch{'s' if cfg.epochs != 1 else ''}" if cfg.epochs
              else " until it ends" if cfg.script else "")
    nodes = f" on each of {cfg.nnodes} machines" if cfg.nnodes > 1 else ""
    return f"{what} with {where}{nodes}{length}"


def welcome_html(cfg: RunConfig | None, problem: str | None, runs_dir: str) -> str:
    """The first window's page (rich text)."""
    if cfg is not None:
        start = (f"<b>Start (F5)</b> trains {html.escape(what_start_does(cfg))}. The charts "
                 "fill in as the ranks report; <b>Stop (Shift+F5)</b> stops every rank at the "
                 "same step and saves a checkpoint.")
    else:
        start = (f"<b>Start</b> waits for the launch form: "
                 f"{html.escape(problem or 'a value is missing')}.")
    return (
        "<h3>Nothing is running yet</h3>"
        f"<p>{start}</p>"
        "<p><b>Your own training script</b>: in the launch panel, choose Source <i>Your "
        "script</i> and pick the .py file you run with torchrun; it runs unchanged. From a "
        f"terminal: <code>{html.escape(SCRIPT_COMMAND)}</code></p>"
        f"<p><b>Runs are kept in</b> {html.escape(runs_dir)}: the Runs panel lists them; "
        "double-click one to see its charts again.</p>"
        "<p>Help &gt; User guide (F1). Tools &gt; Check devices (Ctrl+Shift+D) measures this "
        "machine's devices and links first.</p>")


class FirstRun(QObject):
    """Keeps the first window's page true to the form, and words the start-up of a run."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        window.panel.validity_changed.connect(lambda _valid: self.update())
        window.panel.runs_dir_changed.connect(lambda _folder: self.update())
        window.controller.state_changed.connect(self._state)
        window.controller.welcomed.connect(lambda _message: self._say(
            "rank 0 is connected: waiting for the first report..."))

    def update(self) -> None:
        """The page from the form as it is now (once the dashboard is built)."""
        dash = self.window._dashboard
        if dash is None:
            return
        panel = self.window.panel
        try:
            cfg: RunConfig | None = panel.config() if panel.valid else None
        except ConfigError:
            cfg = None
        dash.set_welcome(welcome_html(cfg, panel.last_error, panel.runs_dir.text().strip()
                                      or "runs"))

    def _state(self, state: str) -> None:
        if state == "starting":
            self._say("launching torchrun: starting the ranks...")
        elif state == "running":
            self._say("the ranks are up: waiting for the first report...")

    def _say(self, text: str) -> None:
        dash = self.window._dashboard
        if dash is not None:
            dash.startup_text = text
            dash.labels_version = -1  # said at the next frame
