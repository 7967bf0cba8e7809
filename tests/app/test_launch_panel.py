"""The launch form: a multi-node run from here is node 0 and names its rendezvous; what to train
is the built-in loop or the user's own script."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, Qt

from app.cluster_dialog import ClusterDialog
from app.desktop import default_presets
from app.form_errors import refused
from app.launch_panel import LaunchPanel
from app.run_model import restored_form, save_form
from app.script_source import refill_config
from ddp_engine.common.config import ConfigError, RunConfig
from tests.conftest import REPO


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
    assert panel.problem.startswith("rdzv_endpoint: nnodes is 2, so every node needs the "
                                         "rendezvous address")
    panel.errors.reveal()  # as Start pressed: shown though the field was never touched
    assert refused(panel.rdzv_endpoint) and panel.rdzv_endpoint.styleSheet() == ""
    panel.rdzv_endpoint.setText("node0")
    assert panel.problem.startswith("rdzv_endpoint must be HOST:PORT with a port 1-65535")
    panel.rdzv_endpoint.setText("node0:29400")
    assert panel.valid and panel.problem is None
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
    with qtbot.waitSignal(panel.told) as told:  # the window's status bar says it
        panel.presets.activated.emit(2)  # as a click on the second preset
    assert told.args[0].startswith("the form is filled from the preset ")
    cfg = panel.config()
    assert (cfg.model, cfg.dataset, cfg.epochs, cfg.eval_every) == ("convnet", "digits", 5, 50)
    assert cfg.runs_dir == str(tmp_path / "my-runs") and panel.valid
    assert panel.presets.currentIndex() == 0  # the menu shows "Presets..." again


SCRIPT = REPO / "examples" / "ddp_train.py"


def _script_panel(qtbot, tmp_path: Path, panel: LaunchPanel | None = None) -> LaunchPanel:
    """A form (a new one, or ``panel``) switched to Your script with a click, and filled with
    the example script, arguments with a quoted one that has a space, and a working folder."""
    panel = panel or _panel(qtbot)
    _click(qtbot, panel, "script")
    panel.script.path.setText(str(SCRIPT))
    panel.script_args.setText(f"--epochs 3 --checkpoint '{tmp_path}/my ck.pt' --lr=0.1")
    panel.script_cwd.path.setText(str(tmp_path))
    return panel


def _click(qtbot, panel: LaunchPanel, source: str) -> None:
    """Click the source switch's ``source`` button, as a user would (in the shown form)."""
    if not panel.isVisible():
        panel.show()
        qtbot.waitExposed(panel)
    qtbot.mouseClick(getattr(panel.source, source), Qt.MouseButton.LeftButton)


def test_the_source_switch_shows_the_fields_of_one_source(qtbot) -> None:
    panel = _panel(qtbot)
    builtin_only = [panel.model, panel.dataset, panel.loss, panel.epochs, panel.batch_size,
                    panel.lr, panel.lr_schedule, panel.warmup_steps, panel.optimizer,
                    panel.precision, panel.grad_accum, panel.checkpoint_every, panel.seed,
                    panel.resume]
    script_only = [panel.script, panel.script_args, panel.script_cwd,
                   panel.script_fields.cwd_note, panel.script_fields.hint]
    both = [panel.max_steps, panel.name, panel.runs_dir, panel.devices, panel.nnodes]
    for source, shown, hidden in (("builtin", builtin_only, script_only),
                                  ("script", script_only, builtin_only),
                                  ("builtin", builtin_only, script_only)):
        _click(qtbot, panel, source)
        assert panel.source.value() == source
        assert all(w.isVisibleTo(panel) for w in shown + both), source
        assert not any(w.isVisibleTo(panel) for w in hidden), source
    assert panel.max_steps.value() == 50  # the built-in side's, kept across the switch


def test_the_form_builds_a_script_config(qtbot, tmp_path: Path) -> None:
    panel = _panel(qtbot)
    panel.model.combo.setCurrentText("convnet")  # set before the switch: not the script's
    panel.lr_schedule.setCurrentText("cosine")
    panel.warmup_steps.setValue(10)
    panel.set_config(RunConfig.from_dict({**panel.config().to_dict(), "eval_every": 7}))
    _script_panel(qtbot, tmp_path, panel)
    assert panel.valid, panel.problem
    cfg = panel.config()
    assert cfg.script == str(SCRIPT) and cfg.script_cwd == str(tmp_path)
    assert cfg.script_args == ["--epochs", "3", "--checkpoint", f"{tmp_path}/my ck.pt",
                               "--lr=0.1"]
    assert (cfg.model, cfg.lr_schedule, cfg.warmup_steps, cfg.eval_every, cfg.max_steps) == (
        "mlp", "constant", 0, 100, None)  # a script's own end: max steps 0 by default
    assert cfg.default_name() == "ddp_train" == panel.name.placeholderText()
    panel.script_cwd.path.setText("")
    assert panel.config().script_cwd == str(SCRIPT.parent)  # emptied: the script's, explicit
    panel.max_steps.setValue(30)
    assert panel.config().max_steps == 30  # stops the script after 30 optimizer steps
    _click(qtbot, panel, "builtin")
    cfg = panel.config()  # back to the built-in loop: its fields as they were
    assert (cfg.script, cfg.script_args, cfg.model, cfg.lr_schedule, cfg.warmup_steps,
            cfg.eval_every, cfg.max_steps) == (None, [], "convnet", "cosine", 10, 7, 50)


def test_the_working_folder_is_the_scripts_until_the_user_chooses_one(
        qtbot, tmp_path: Path) -> None:
    """The app has no caller's folder (torchrun's default): picking a script fills the field
    with the script's folder, the note under it says so, and the config always names it."""
    panel = _panel(qtbot)
    _click(qtbot, panel, "script")
    note = panel.script_fields.cwd_note
    assert note.isVisibleTo(panel) and "Relative paths in the arguments are read from here" in \
        note.text() and "torchrun would use the folder you start it in" in note.text()
    form = panel.script_cwd.parentWidget().layout()  # the note: the row under the field
    assert form.getWidgetPosition(note)[0] == form.getWidgetPosition(panel.script_cwd)[0] + 1
    assert panel.script_cwd.path.text() == ""
    panel.script.path.setText(str(SCRIPT))  # as the "..." button's file dialog sets it
    assert panel.script_cwd.path.text() == str(SCRIPT.parent)
    assert panel.valid and panel.config().script_cwd == str(SCRIPT.parent)
    other = tmp_path / "project" / "train.py"
    other.parent.mkdir()
    other.write_text("print('hi')\n")
    panel.script.path.setText(str(other))  # still the last script's folder: follows
    assert panel.config().script_cwd == str(other.parent)
    panel.script_cwd.path.setText(str(tmp_path))  # the user's own choice stays
    panel.script.path.setText(str(SCRIPT))
    assert panel.script_cwd.path.text() == str(tmp_path)
    assert panel.config().script_cwd == str(tmp_path)
    panel.script_cwd.path.setText("")  # emptied: the next script fills it again
    panel.script.path.setText(str(other))
    assert panel.config().script_cwd == str(other.parent)
    # A config without one (a preset written by hand): the script's folder, shown
    panel.set_config(RunConfig(script=str(SCRIPT), nproc=2))
    assert panel.script_cwd.path.text() == str(SCRIPT.parent)
    assert panel.config().script_cwd == str(SCRIPT.parent)
    preset = tmp_path / "saved.toml"
    panel.save_preset_to(preset)  # explicit in what the form saves, too
    assert f'script_cwd = "{SCRIPT.parent}"' in preset.read_text()


def test_a_script_run_again_keeps_the_working_folder_it_ran_in(qtbot, tmp_path: Path) -> None:
    """Resume... (the runs list, the app's Resume) of a script run: the folder recorded in its
    config.json, not the script's."""
    run = tmp_path / "runs" / "ddp_train-1"
    run.mkdir(parents=True)
    project = tmp_path / "project"
    project.mkdir()
    recorded = RunConfig(script=str(SCRIPT), script_args=["--data", "mydata/train.txt"],
                         script_cwd=str(project), nproc=2, run_dir=str(run))
    (run / "config.json").write_text(json.dumps(recorded.to_dict()))
    cfg, _text = refill_config(run, tmp_path / "runs")
    panel = _panel(qtbot)
    panel.set_config(cfg)
    assert panel.script_cwd.path.text() == str(project)
    assert panel.config().script_cwd == str(project)


def _refused(panel: LaunchPanel, field: str, message: str) -> None:
    """Start is refused with ``message``, which shows (Start pressed) under ``field``, in the
    form's words, the field's editors coloured."""
    assert not panel.valid and panel.problem == message
    panel.errors.reveal()
    worded = panel.errors.words(message)
    assert panel.field_error.isVisibleTo(panel) and panel.field_error.text() == worded
    assert panel.last_error == worded
    form = panel.fields[field].parentWidget().layout()
    row = form.getWidgetPosition(panel.fields[field])[0]
    assert form.getWidgetPosition(panel.field_error)[0] == row + 1
    assert refused(panel.fields[field]) and panel.fields[field].styleSheet() == ""
    with pytest.raises(ConfigError, match=re.escape(message)):
        panel.config()


def test_a_bad_argument_line_or_script_is_refused_naming_the_field(
        qtbot, tmp_path: Path) -> None:
    panel = _script_panel(qtbot, tmp_path)
    assert panel.valid, panel.problem
    panel.script_args.setText('--name "my run')
    _refused(panel, "script_args", """script_args: cannot split '--name "my run' into """
             "arguments as a shell would: a quote is not closed; close it, or put a "
             "backslash before a quote meant literally")
    panel.script_args.setText("--epochs 1 \\")
    assert panel.problem.endswith("the line ends in a backslash that escapes nothing; "
                                       "remove it, or double it for a backslash")
    panel.script_args.setText("--epochs 1")
    assert panel.valid
    missing = tmp_path / "nope.py"
    panel.script.path.setText(str(missing))
    _refused(panel, "script", f"script: {str(missing)!r} does not exist; give the path of "
             "your training script (a .py file)")
    panel.script.path.setText(str(tmp_path))
    assert panel.problem.startswith(f"script: {str(tmp_path)!r} is a folder")
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n\ndef main(:\n")
    panel.script.path.setText(str(broken))
    assert panel.problem.startswith(
        f"script: {str(broken)!r} is not a Python file Python can parse at line 3")
    panel.script.path.setText("")
    _refused(panel, "script", "script must not be empty; give the path of a .py file")
    panel.script.path.setText(str(SCRIPT))
    panel.script_cwd.path.setText(str(tmp_path / "no-such-folder"))
    assert panel.problem.startswith("script_cwd: ") and not panel.valid
    panel.errors.reveal()
    assert refused(panel.script_cwd) and panel.last_error.startswith("Working folder: ")


def test_presets_and_the_last_form_keep_the_script_fields(qtbot, tmp_path: Path) -> None:
    panel = _script_panel(qtbot, tmp_path)
    panel.max_steps.setValue(40)
    wanted = panel.config()
    preset = tmp_path / "script.toml"
    panel.save_preset_to(preset)
    assert 'script = "' in preset.read_text() and "model =" in preset.read_text()
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    save_form(settings, wanted)
    for load in (lambda p: p.load_preset_from(preset),
                 lambda p: p.set_config(restored_form(settings))):
        other = _panel(qtbot)
        other.model.combo.setCurrentText("convnet")
        load(other)
        assert other.source.value() == "script" and other.script.isVisibleTo(other)
        assert not other.model.isVisibleTo(other)
        assert other.script.path.text() == str(SCRIPT)
        assert other.script_args.text() == (f"--epochs 3 --checkpoint '{tmp_path}/my ck.pt' "
                                            "--lr=0.1")
        assert other.script_cwd.path.text() == str(tmp_path)
        assert other.config() == wanted and other.max_steps.value() == 40
        other.source.builtin.setChecked(True)  # the built-in side as the user left it
        assert other.config().model == "convnet" and other.config().script is None
        other.load_preset_from(default_presets()[0].path)  # a built-in preset: built-in again
        assert other.source.value() == "builtin" and other.config().model == "mlp"
        other.source.script.setChecked(True)  # ...and the script's side as it was
        assert other.config().script_args == wanted.script_args


def test_the_built_in_loop_offers_a_learning_rate_schedule_and_warm_up(qtbot) -> None:
    panel = _panel(qtbot)
    assert panel.lr_schedule.isVisibleTo(panel) and panel.warmup_steps.isVisibleTo(panel)
    assert [panel.lr_schedule.itemText(i) for i in range(panel.lr_schedule.count())] == [
        "constant", "cosine", "linear", "step"]
    panel.lr_schedule.setCurrentText("linear")
    panel.warmup_steps.setValue(20)
    cfg = panel.config()
    assert (cfg.lr_schedule, cfg.warmup_steps) == ("linear", 20)
    other = _panel(qtbot)
    other.set_config(cfg)
    assert other.lr_schedule.currentText() == "linear" and other.warmup_steps.value() == 20
