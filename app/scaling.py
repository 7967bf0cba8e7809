"""The Scaling tab: run the current config on 1, 2, ... N devices and plot how it scales.

The sweep itself is ``python -m ddp_engine sweep`` (ddp_engine/launch/sweep.py), started as a
child in a session of its own like the launcher, so it outlives the window too. This view only
starts it, reads its group.json and draws samples/s and scaling efficiency against the device
count.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.charts.base import Chart
from app.doctor_tables import WARNING_STYLE
from app.launcher_process import LauncherProcess
from app.run_model import plural
from ddp_engine.common.child_env import build_env
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.inventory import GpuInventory
from ddp_engine.common.run_dir import FINAL_STATES, atomic_write_text, new_run_dir, read_status
from ddp_engine.common.runs import sweep_process
from ddp_engine.common.sweep_plan import DEFAULT_STEPS, parse_counts, plan_sweep, read_group

SWEEP_CONFIG = "sweep.toml"


class ScalingView(QWidget):
    started = Signal(object)  # the group folder
    current_run = Signal(object)
    """The run folder of the count that started training now (the dashboard follows it)."""
    said = Signal(str)
    """The sweep's state in a line, whenever it changes (the window's status bar shows it)."""

    def __init__(self, poll_ms: int = 1000) -> None:
        super().__init__()
        self.group_dir: Path | None = None
        self.live = False  # the group shown is a sweep training now
        self.group: dict[str, Any] | None = None
        self._current: str | None = None  # group.json's current run, as last seen
        self.sweep: LauncherProcess | None = None
        self.counts = QLineEdit()
        self.counts.setObjectName("sweep_counts")
        self.counts.setPlaceholderText("1..N (every device)")
        self.counts.setToolTip("process counts, e.g. 1,2,4; empty: 1 up to the devices chosen")
        self.steps = QSpinBox()
        self.steps.setObjectName("sweep_steps")
        self.steps.setRange(1, 10**6)
        self.steps.setValue(DEFAULT_STEPS)
        self.start_button = QPushButton("Run scaling sweep")
        self.start_button.setObjectName("sweep_start")
        self.start_button.setToolTip("train the launch form's config on each count in turn")
        self.stop_button = QPushButton("Stop sweep")
        self.stop_button.setObjectName("sweep_stop")
        self.stop_button.setEnabled(False)
        self.label = QLabel("no sweep yet: the launch form's config, K steps per device count")
        self.label.setObjectName("sweep_label")
        self.label.setWordWrap(True)
        self.warnings = QLabel()  # counts whose numbers are not to be trusted, and why
        self.warnings.setObjectName("sweep_warnings")
        self.warnings.setWordWrap(True)
        self.warnings.setStyleSheet(WARNING_STYLE)
        self.warnings.hide()
        self.throughput = Chart("Throughput by device count", "samples/s", x_label="devices",
                                x_counts=True)
        self.efficiency = Chart("Scaling efficiency", "efficiency (1 = linear)",
                                x_label="devices", from_zero=True, x_counts=True)
        row = QHBoxLayout()
        row.addWidget(QLabel("counts"))
        row.addWidget(self.counts)
        row.addWidget(QLabel("steps per count"))
        row.addWidget(self.steps)
        row.addWidget(self.start_button)
        row.addWidget(self.stop_button)
        row.addStretch(1)
        charts = QHBoxLayout()
        charts.addWidget(self.throughput)
        charts.addWidget(self.efficiency)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.label)
        layout.addWidget(self.warnings)
        layout.addLayout(charts, 1)
        self.stop_button.clicked.connect(self.stop)
        self.timer = QTimer(self)
        self.timer.setInterval(poll_ms)
        self.timer.timeout.connect(self.poll_once)

    @property
    def busy(self) -> bool:
        """A sweep is training: the one shown, or the one this tab started."""
        return self.live or (self.sweep is not None and not self.sweep.ended())

    # ------------------------------------------------------------------------------ running
    def start(self, cfg: RunConfig, inventory: GpuInventory | None = None,
              cpu_count: int | None = None) -> Path:
        """Start a sweep of ``cfg`` (the launch form's config) in a new group folder.

        Raises:
            ConfigError: bad counts or steps, or more devices than this machine has; nothing
                is written or started then.
        """
        if self.busy:
            raise ConfigError("a scaling sweep is already training; stop it first")
        text = self.counts.text().strip()
        try:
            counts = parse_counts(text) if text else None
        except argparse.ArgumentTypeError as e:
            raise ConfigError(str(e)) from None
        plan_sweep(dataclasses.replace(cfg, run_dir=None), counts, self.steps.value(),
                   inventory=inventory, cpu_count=cpu_count)
        group = new_run_dir(cfg.runs_dir, cfg.default_name() + "-sweep").resolve()
        config_path = group / SWEEP_CONFIG
        atomic_write_text(config_path, dataclasses.replace(cfg, run_dir=str(group)).to_toml())
        argv = [sys.executable, "-m", "ddp_engine", "sweep", "--config", str(config_path),
                "--steps", str(self.steps.value())]
        if counts:
            argv += ["--counts", ",".join(map(str, counts))]
        self.sweep = LauncherProcess(config_path, group / "sweep.log", build_env(), argv=argv)
        self.sweep.start()
        self.show_group(group)
        self.started.emit(group)
        return group

    def stop(self) -> None:
        """Stop the sweep shown: its current count stops at an agreed step, no further count
        starts (SIGTERM to the sweep process, which forwards it to its launcher)."""
        proc = sweep_process(self.group) if self.group else None
        if proc is not None:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
            self.label.setText("stopping the sweep...")

    def show_group(self, group_dir: Path) -> None:
        self.group_dir = Path(group_dir)
        self._current = None
        for chart in (self.throughput, self.efficiency):
            chart.reset()
        self.poll_once()
        self.timer.start()

    # ------------------------------------------------------------------------------ drawing
    def poll_once(self) -> bool:
        """Read group.json and redraw. True once the sweep has ended."""
        if self.group_dir is None:
            return True
        if self.sweep is not None and self.sweep.ended():
            self.sweep.poll()  # reaped
        group = read_group(self.group_dir)
        live = bool(group) and group.get("state") not in FINAL_STATES and sweep_process(
            group) is not None
        self.live = live
        self.stop_button.setEnabled(live)
        self.start_button.setEnabled(not self.busy)
        if group is None:
            self.label.setText(f"{self.group_dir.name}: starting the sweep..." if self.sweep
                               and not self.sweep.ended() else
                               f"{self.group_dir.name}: no group.json (see sweep.log)")
            return self.sweep is None or self.sweep.ended()
        self.group = group
        self._draw(group, live)
        current = group.get("current") if live else None
        if (isinstance(current, str) and current != self._current
                and read_status(self.group_dir / current) is None):
            # The sweep names a count as it starts its launcher, which writes the count's
            # status a moment later: until then there is nothing to attach to (the dashboard
            # would show a record of it and never the live run). Asked again at the next poll.
            current = self._current
        if current != self._current:
            self._current = current if isinstance(current, str) else None
            if self._current:
                self.current_run.emit(self.group_dir / self._current)
        ended = not live and (self.sweep is None or self.sweep.ended())
        if ended:
            self.timer.stop()
        return ended

    def _draw(self, group: dict[str, Any], live: bool) -> None:
        rows = [r for r in group.get("results") or [] if isinstance(r.get("nproc"), int)]
        measured = [r for r in rows if isinstance(r.get("samples_per_s"), int | float)]
        n = np.array([r["nproc"] for r in measured], dtype=float)
        thr = np.array([r["samples_per_s"] for r in measured], dtype=float)
        eff = np.array([r.get("efficiency") if isinstance(r.get("efficiency"), int | float)
                        else np.nan for r in measured], dtype=float)
        self.throughput.set_data("measured", n, thr, "#1f77b4", symbol="o")
        self.efficiency.set_data("measured", n, eff, "#1f77b4", symbol="o")
        counts = np.array([c for c in group.get("counts") or [] if isinstance(c, int)],
                          dtype=float)
        if len(n) and len(counts):
            ideal = thr[0] * counts / n[0]  # linear scaling from the smallest count measured
            self.throughput.set_data("ideal (linear)", counts, ideal, "#7f7f7f", dashed=True)
            self.efficiency.set_data("ideal (linear)", counts, np.ones_like(counts), "#7f7f7f",
                                     dashed=True)
        parts = [f"{self.group_dir.name if self.group_dir else ''}: {group.get('state')}"
                 + (" (live)" if live else "")]
        warnings = []
        for r in rows:
            thr_r, eff_r = r.get("samples_per_s"), r.get("efficiency")
            parts.append(f"{plural(r['nproc'], 'device')}: "
                         + (f"{thr_r:,.0f} samples/s" if thr_r is not None else r.get("state")
                            or "?")
                         + (f", efficiency {eff_r:.2f}" if eff_r is not None else "")
                         + (" (\u26a0)" if r.get("warning") else ""))
            if r.get("warning"):
                warnings.append(f"\u26a0 {plural(r['nproc'], 'device')}: {r['warning']}")
        self.warnings.setText("\n".join(warnings))
        self.warnings.setVisible(bool(warnings))
        if live and group.get("current"):
            parts.append(f"training {group['current']}...")
        if group.get("reason"):
            parts.append(str(group["reason"]))
        text = "scaling sweep " + " | ".join(parts)
        if text != self.label.text():
            self.label.setText(text)
            self.said.emit(text)
