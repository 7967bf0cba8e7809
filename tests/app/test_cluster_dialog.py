"""The cluster scripts dialog shows, copies and saves what the engine writes for each node."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtGui import QGuiApplication

from app.cluster_dialog import SLURM, ClusterDialog
from ddp_engine.common.cluster import node_script, slurm_script
from ddp_engine.common.config import RunConfig

CFG = RunConfig(model="mlp", dataset="synthetic", device="cpu", nproc=2, max_steps=50)


def _dialog(qtbot) -> ClusterDialog:
    dialog = ClusterDialog(CFG)
    qtbot.addWidget(dialog)
    return dialog


def test_each_node_and_slurm_get_the_engines_script(qtbot) -> None:
    dialog = _dialog(qtbot)
    dialog.nodes.setValue(3)
    dialog.host.setText("10.0.0.5")
    dialog.port.setValue(29500)
    choices = [dialog.which.itemText(i) for i in range(dialog.which.count())]
    assert choices == ["node 0", "node 1", "node 2", SLURM]
    spread = RunConfig(**{**CFG.to_dict(), "nnodes": 3, "rdzv_endpoint": "10.0.0.5:29500"})
    dialog.which.setCurrentIndex(2)
    shown = dialog.text.toPlainText()
    assert shown == node_script(spread, 2)
    assert "--node-rank 2 --rdzv-endpoint 10.0.0.5:29500" in shown
    assert dialog.default_file_name() == "mlp-synthetic-node-2.sh"
    dialog.which.setCurrentText(SLURM)
    assert dialog.text.toPlainText() == slurm_script(spread, port=29500)
    assert "#SBATCH --nodes=3" in dialog.text.toPlainText()
    dialog.nodes.setValue(2)  # fewer nodes: SLURM stays chosen
    assert dialog.which.currentText() == SLURM and dialog.which.count() == 3
    dialog.copy_button.click()
    assert QGuiApplication.clipboard().text() == dialog.text.toPlainText()


def test_a_bad_address_names_the_field_and_saves_nothing(qtbot) -> None:
    dialog = _dialog(qtbot)
    dialog.host.setText("node 0")
    assert dialog.error.text() == ("node 0 address must be a host name or IP address that "
                                   "every node can reach, got 'node 0'")
    assert dialog.text.toPlainText() == "" and not dialog.save_button.isEnabled()
    dialog.host.setText("node0")
    assert dialog.error.text() == "" and dialog.save_button.isEnabled()


def test_save_writes_an_executable_script(qtbot, tmp_path: Path) -> None:
    dialog = _dialog(qtbot)
    out = dialog.save(tmp_path / dialog.default_file_name())
    assert out.read_text() == dialog.text.toPlainText()
    assert out.read_text().startswith("#!/bin/bash") and os.access(out, os.X_OK)
