"""Cluster scripts for the launch form's config: each node's launch script, or a SLURM batch
script (ddp_engine.common.cluster writes them; this dialog picks the nodes and the rendezvous)."""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path

from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from ddp_engine.common.cluster import DEFAULT_RDZV_PORT, node_script, slurm_script
from ddp_engine.common.config import ConfigError, RunConfig

SLURM = "SLURM batch script (all nodes)"


class ClusterDialog(QDialog):
    """Shows the script for one node (or SLURM) of ``cfg`` spread over the chosen nodes;
    Copy and Save. Each script runs Rankscope's launcher with ``$RANKSCOPE_PYTHON`` (default
    python3), so Rankscope must be installed on every node."""

    def __init__(self, cfg: RunConfig, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Cluster scripts")
        self.cfg = cfg
        self.nodes = QSpinBox()
        self.nodes.setRange(2, 4096)
        self.nodes.setValue(max(2, cfg.nnodes))
        self.host = QLineEdit(socket.gethostname())
        self.host.setToolTip("node 0's address, reachable from every node: the rendezvous")
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(DEFAULT_RDZV_PORT)
        self.which = QComboBox()
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setMinimumSize(760, 420)
        self.error = QLabel("")
        self.error.setObjectName("cluster_error")
        self.error.setStyleSheet("color: #b00020;")
        self.error.setWordWrap(True)
        form = QFormLayout()
        form.addRow("nodes", self.nodes)
        form.addRow("node 0 address", self.host)
        form.addRow("rendezvous port", self.port)
        form.addRow("script", self.which)
        hint = QLabel("Every node runs the same config; each node's script names its node rank. "
                      "Rank 0, with the metrics, checkpoints and telemetry, is on node 0 (with "
                      "SLURM: the allocation's first node). Every node needs Rankscope installed "
                      "(pip install): the scripts run it with $RANKSCOPE_PYTHON, default "
                      "python3 (set it to a virtualenv's python if Rankscope is in one).")
        hint.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.copy_button = QPushButton("Copy")
        self.save_button = QPushButton("Save...")
        buttons.addButton(self.copy_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.addButton(self.save_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        self.copy_button.clicked.connect(
            lambda: QGuiApplication.clipboard().setText(self.text.toPlainText()))
        self.save_button.clicked.connect(self._save_dialog)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(hint)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.nodes.valueChanged.connect(self._choices)
        for signal in (self.host.textChanged, self.port.valueChanged,
                       self.which.currentIndexChanged):
            signal.connect(self.refresh)
        self._choices()

    def _choices(self) -> None:
        """One entry per node, then SLURM; the choice kept where it still exists."""
        kept = self.which.currentText()
        self.which.blockSignals(True)
        self.which.clear()
        self.which.addItems([f"node {k}" for k in range(self.nodes.value())] + [SLURM])
        self.which.setCurrentIndex(max(0, self.which.findText(kept)))
        self.which.blockSignals(False)
        self.refresh()

    def config(self) -> RunConfig:
        """The form's config spread over the chosen nodes.

        Raises:
            ConfigError: the address is not usable (naming the field and the value).
        """
        host = self.host.text().strip()
        if not host or any(c.isspace() for c in host):
            raise ConfigError(f"node 0 address must be a host name or IP address that every "
                              f"node can reach, got {self.host.text()!r}")
        return dataclasses.replace(self.cfg, nnodes=self.nodes.value(), node_rank=0,
                                   rdzv_endpoint=f"{host}:{self.port.value()}")

    def script(self) -> str:
        """The script chosen, as the engine writes it."""
        cfg = self.config()
        if self.which.currentText() == SLURM:
            return slurm_script(cfg, port=self.port.value())
        return node_script(cfg, self.which.currentIndex())

    def refresh(self) -> None:
        try:
            text = self.script()
        except ConfigError as e:
            self.error.setText(str(e))
            self.text.setPlainText("")
            self.save_button.setEnabled(False)
            return
        self.error.setText("")
        self.text.setPlainText(text)
        self.save_button.setEnabled(True)

    def default_file_name(self) -> str:
        name = self.cfg.default_name()
        if self.which.currentText() == SLURM:
            return f"{name}.sbatch"
        return f"{name}-node-{self.which.currentIndex()}.sh"

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the script shown to ``path``, executable."""
        out = Path(path)
        out.write_text(self.script(), encoding="utf-8")
        out.chmod(0o755)
        return out

    def _save_dialog(self) -> None:
        path, _chosen = QFileDialog.getSaveFileName(self, "Save script", self.default_file_name())
        if not path:
            return
        try:
            self.save(path)
        except (OSError, ConfigError) as e:
            QMessageBox.warning(self, "Script not saved", str(e))
