"""The launch form's nodes: a multi-node run from here is node 0, and names its rendezvous."""

from __future__ import annotations

from app.cluster_dialog import ClusterDialog
from app.launch_panel import ERROR_STYLE, LaunchPanel


def _panel(qtbot) -> LaunchPanel:
    panel = LaunchPanel(gpus=[])
    qtbot.addWidget(panel)
    panel.max_steps.setValue(50)
    return panel


def test_more_nodes_need_a_rendezvous_and_make_this_machine_node_0(qtbot) -> None:
    panel = _panel(qtbot)
    assert panel.valid and not panel.rdzv_endpoint.isEnabled()
    panel.nnodes.setValue(2)
    assert not panel.valid and panel.rdzv_endpoint.isEnabled()
    assert panel.error.text().startswith("rdzv_endpoint: nnodes is 2, so every node needs the "
                                         "rendezvous address")
    assert panel.rdzv_endpoint.styleSheet() == ERROR_STYLE
    panel.rdzv_endpoint.setText("node0")
    assert panel.error.text().startswith("rdzv_endpoint must be HOST:PORT with a port 1-65535")
    panel.rdzv_endpoint.setText("node0:29400")
    assert panel.valid and panel.error.text() == ""
    cfg = panel.config()
    assert (cfg.nnodes, cfg.node_rank, cfg.rdzv_endpoint) == (2, 0, "node0:29400")
    panel.set_config(cfg)  # a preset or the last settings: kept as they were
    assert panel.nnodes.value() == 2 and panel.rdzv_endpoint.text() == "node0:29400"


def test_cluster_scripts_open_for_the_forms_config_and_rendezvous(qtbot) -> None:
    panel = _panel(qtbot)
    panel.nnodes.setValue(3)
    panel.rdzv_endpoint.setText("10.1.2.3:29555")
    dialog = panel.open_cluster_dialog()
    assert isinstance(dialog, ClusterDialog)
    qtbot.addWidget(dialog)
    assert (dialog.nodes.value(), dialog.host.text(), dialog.port.value()) == (
        3, "10.1.2.3", 29555)
    script = dialog.text.toPlainText()
    assert '"max_steps": 50' in script and "--rdzv-endpoint 10.1.2.3:29555" in script
    dialog.close()
    panel.lr.setText("fast")  # a bad form: no scripts, and the form says why
    assert panel.open_cluster_dialog() is None
    assert panel.error.text().startswith("no cluster scripts: lr must be a number")


def test_a_default_preset_fills_the_form_and_keeps_its_runs_folder(qtbot, tmp_path) -> None:
    panel = _panel(qtbot)
    panel.runs_dir.setText(str(tmp_path / "my-runs"))
    titles = [panel.presets.itemText(i) for i in range(panel.presets.count())]
    assert titles[0] == "Presets..." and titles[2].startswith("Digits: a ConvNet")
    panel.presets.activated.emit(2)  # as a click on the second preset
    cfg = panel.config()
    assert (cfg.model, cfg.dataset, cfg.epochs, cfg.eval_every) == ("convnet", "digits", 5, 50)
    assert cfg.runs_dir == str(tmp_path / "my-runs") and panel.valid
    assert panel.presets.currentIndex() == 0  # the menu shows "Presets..." again
