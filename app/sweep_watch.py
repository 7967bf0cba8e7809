"""The window's side of a scaling sweep (the Scaling tab trains it): start it from the launch
form, say where it is in the status bar, show the count training now on the dashboard, and
tell Stop that the run watched is one of its counts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ddp_engine.common.config import ConfigError

if TYPE_CHECKING:
    from app.main_window import MainWindow


class SweepWatch:
    """What ``window`` does about the sweep its Scaling tab shows."""

    def __init__(self, window: MainWindow) -> None:
        self.window = window

    def _watched_elsewhere(self) -> bool:
        """The window watches a run that is not a count of the sweep shown (the user's own:
        it keeps the dashboard and the status bar)."""
        w = self.window
        run = w.controller.run_dir if w.controller.active else None
        return run is not None and run.parent != w.scaling.group_dir

    def watching_sweep(self) -> bool:
        """The run watched is a count of the sweep training now."""
        w = self.window
        return (w.controller.active and w._scaling is not None and w._scaling.live
                and not self._watched_elsewhere())

    def start(self) -> Path | None:
        """Run the launch form's config on 1, 2, ... N devices (Scaling tab)."""
        w = self.window
        if w.controller.active:
            w.scaling.label.setText("not started: a run is training; a sweep beside it "
                                    "would measure nothing useful. Stop it first.")
            return None
        try:
            cfg = w.panel.config()
            group = w.scaling.start(cfg, inventory=w.panel.devices.inventory,
                                    cpu_count=w.panel.devices.cpus)
        except ConfigError as e:
            w.scaling.label.setText(f"not started: {e}")
            return None
        w.runs.set_runs_dir(group.parent)
        w.tabs.setCurrentWidget(w.scaling)
        return group

    def said(self, text: str) -> None:
        """The sweep's state in the status bar, not an old message of the last run."""
        if not self._watched_elsewhere():
            self.window.message_label.setText(text)

    def end_text(self, run_dir: Path | None, text: str) -> str:
        """What the status bar says as the watched run ends (``text``): for a count of the
        sweep shown once that sweep has ended, the sweep's own words, said before the last
        count's end reached the window."""
        view = self.window._scaling
        if (run_dir is not None and view is not None and view.group_dir is not None
                and run_dir.resolve().parent == view.group_dir.resolve() and not view.live):
            return view.label.text()
        return text

    def follow(self, run_dir: Path) -> None:
        """The dashboard shows the count that is training now (the tab on screen stays)."""
        w = self.window
        if self._watched_elsewhere():
            return
        tab = w.tabs.currentWidget()
        w.open_run(run_dir)
        w.tabs.setCurrentWidget(tab)
