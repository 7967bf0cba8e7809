"""The launch form: RunConfig <-> widgets, validated inline by the engine's own RunConfig."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.devices import DevicePicker
from app.dialogs import Presets, error_label
from app.form_errors import FormErrors, field_of
from app.script_source import ScriptFields
from app.spec_field import BUILTIN, CUSTOM, SCRIPT, SourceSwitch, SpecField
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_files import load_config_file
from ddp_engine.common.config_values import (
    BUILTIN_DATASETS,
    BUILTIN_LOOP_ONLY,
    BUILTIN_LOSSES,
    BUILTIN_MODELS,
    LR_SCHEDULES,
    OPTIMIZERS,
    PRECISIONS,
)
from ddp_engine.common.gpus import GpuInfo
from ddp_engine.common.machine_checks import check_environment

DATASET_CHOICES = [*BUILTIN_DATASETS, "text file...", "image folder...", CUSTOM]
DEFAULT_MAX_STEPS = 200
BUILTIN_ONLY = ("model", "dataset", "loss", "model_args", "dataset_args", *BUILTIN_LOOP_ONLY)
"""RunConfig keys a script run leaves at their defaults (RunConfig refuses them otherwise)."""


class LaunchPanel(QWidget):
    """The form. ``validity_changed(bool)`` tells the window whether Start may be enabled."""

    validity_changed = Signal(bool)
    runs_dir_changed = Signal(str)
    told = Signal(str)
    """What the form did that the user should hear of (a preset loaded), for the status bar."""
    """The runs folder typed in the form, or set by a preset or a resume (the window follows)."""

    def __init__(self, runs_dir: str = "runs", gpus: list[GpuInfo] | None = None) -> None:
        super().__init__()
        self.fields: dict[str, QWidget] = {}
        # Fields the form does not show (model_args, eval_every, ...) from a preset or a resumed
        # run's config: kept as they were, so nothing the user set is lost.
        self._extra: dict[str, Any] = {}
        self.source = SourceSwitch()
        self.model = SpecField("model", [*BUILTIN_MODELS, CUSTOM], {CUSTOM: ""})
        self.dataset = SpecField("dataset", DATASET_CHOICES,
                                 {"text file...": "text:", "image folder...": "imagefolder:",
                                  CUSTOM: ""})
        self.loss = SpecField("loss", [*BUILTIN_LOSSES, CUSTOM], {CUSTOM: ""})
        self.script_fields = ScriptFields()
        self.script = self.script_fields.script
        self.script_args = self.script_fields.args
        self.script_cwd = self.script_fields.cwd
        self.max_steps = self._spin("max_steps", 0, 10**9, DEFAULT_MAX_STEPS,
                                    "0: no limit; a script stops after this many steps")
        self._steps = {BUILTIN: DEFAULT_MAX_STEPS, SCRIPT: 0}  # each source's own max steps
        self.epochs = self._spin("epochs", 0, 10**6, 0, "0: no limit (1 if max steps is 0)")
        self.batch_size = self._spin("batch_size", 0, 10**6, 32)
        self.lr = QLineEdit("0.001")
        self.lr_schedule = QComboBox()
        self.lr_schedule.addItems(LR_SCHEDULES)
        self.lr_schedule.setToolTip("constant; cosine or linear to 0; step: x0.1 at half and "
                                    "at three quarters of the steps (after the warm-up)")
        self.warmup_steps = self._spin("warmup_steps", 0, 10**9, 0,
                                       "steps of linear learning-rate warm-up from 0")
        self.optimizer = QComboBox()
        self.optimizer.addItems(OPTIMIZERS)
        self.optimizer.setCurrentText("adamw")
        self.precision = QComboBox()
        self.precision.addItems(PRECISIONS)
        self.grad_accum = self._spin("grad_accum", 0, 4096, 1)
        self.checkpoint_every = self._spin("checkpoint_every", 0, 10**9, 0, "0: at stop and end")
        self.seed = self._spin("seed", 0, 2**31 - 1, 0)
        self.name = QLineEdit()
        self.name.setPlaceholderText("<model>-<dataset>")
        self.name.setToolTip("the run folder's name; empty: automatic, <model>-<dataset> (a "
                             "script's name for a script) and the start time")
        self.runs_dir = QLineEdit(runs_dir)
        self.runs_dir.editingFinished.connect(
            lambda: self.runs_dir_changed.emit(self.runs_dir.text().strip()))
        self.resume = QLineEdit()
        self.resume.setPlaceholderText("none")
        self.resume.setToolTip("continue from this checkpoint (a run's checkpoints/last.pt); "
                               "Resume... in the Runs panel fills it in")
        self.devices = DevicePicker(gpus)
        self.nnodes = self._spin("nnodes", 1, 4096, 1, "machines in the run; this one is node 0")
        self.rdzv_endpoint = QLineEdit()
        self.rdzv_endpoint.setPlaceholderText("HOST:PORT, e.g. node0:29400")
        self.rdzv_endpoint.setToolTip("torchrun's c10d rendezvous: this machine's address, "
                                      "reachable from every node, and a free port")
        for key, widget in (("model", self.model), ("dataset", self.dataset),
                            ("loss", self.loss), ("script", self.script),
                            ("script_args", self.script_args), ("script_cwd", self.script_cwd),
                            ("lr", self.lr), ("lr_schedule", self.lr_schedule),
                            ("optimizer", self.optimizer), ("precision", self.precision),
                            ("name", self.name), ("runs_dir", self.runs_dir),
                            ("resume", self.resume), ("nproc", self.devices.count),
                            ("gpus", self.devices.table), ("device", self.devices),
                            ("rdzv_endpoint", self.rdzv_endpoint)):
            widget.setObjectName(key)
            self.fields[key] = widget

        form = QFormLayout()
        rows = (("Source", self.source), ("Model", self.model), ("Dataset", self.dataset),
                ("Loss", self.loss), *self.script_fields.rows(),
                ("Max steps", self.max_steps), ("Epochs", self.epochs),
                ("Batch size / device", self.batch_size), ("Learning rate", self.lr),
                ("LR schedule", self.lr_schedule), ("Warm-up steps", self.warmup_steps),
                ("Optimizer", self.optimizer), ("Precision", self.precision),
                ("Grad. accumulation", self.grad_accum),
                ("Checkpoint every", self.checkpoint_every), ("Seed", self.seed),
                ("Run name", self.name), ("Runs folder", self.runs_dir),
                ("Resume from", self.resume))
        for label, widget in rows:
            if label is not None:
                form.addRow(label, widget)
            else:  # a note across the whole row
                form.addRow(widget)
        self._training = form
        # The rows of one source only; the rest (devices, max steps, names...) are for both.
        self._builtin_rows: list[QWidget] = [
            self.model, self.dataset, self.loss, self.epochs, self.batch_size, self.lr,
            self.lr_schedule, self.warmup_steps, self.optimizer, self.precision,
            self.grad_accum, self.checkpoint_every, self.seed, self.resume]
        self._script_rows = [widget for _label, widget in self.script_fields.rows()]
        training = QGroupBox("Training")
        training.setLayout(form)
        devices = QGroupBox("Devices")
        QVBoxLayout(devices).addWidget(self.devices)
        nodes = QGroupBox("Nodes")
        nodes_form = QFormLayout(nodes)
        nodes_form.addRow("Nodes", self.nnodes)
        nodes_form.addRow("Rendezvous", self.rdzv_endpoint)
        self.nodes_hint = QLabel("Start sends this machine in as node 0 (global rank 0: the "
                                 "charts and Stop are here); start the others with the "
                                 "scripts of Cluster scripts...")
        self.nodes_hint.setWordWrap(True)
        nodes_form.addRow(self.nodes_hint)
        self.cluster_scripts = QPushButton("Cluster scripts...")
        self.cluster_scripts.setToolTip("each node's torchrun command, or a SLURM batch script, "
                                        "for this config")
        nodes_form.addRow(self.cluster_scripts)
        self.error = error_label("error")
        # The reason for a bad value, in the row under its field (the bottom line above keeps
        # the same text, and shows it only for a value no row of the form holds).
        self.field_error = error_label("field_error")
        self._forms = [form, nodes_form]
        for f in self._forms:  # a narrow panel puts a field under its label, never cut off
            f.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
            f.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self._presets = Presets(self, self.load_preset_from, self.save_preset_to,
                                self.error.setText)
        self.presets = self._presets.menu
        self.save_preset = self._presets.save_button
        self.load_preset = self._presets.load_button
        layout = QVBoxLayout(self)
        layout.addWidget(self.presets)
        layout.addWidget(training)
        layout.addWidget(devices)
        layout.addWidget(nodes)
        layout.addWidget(self.error)
        layout.addLayout(self._presets.buttons)
        layout.addStretch(1)
        self.cluster_scripts.clicked.connect(self.open_cluster_dialog)

        for w in (self.model, self.dataset, self.loss, self.devices, self.script,
                  self.script_cwd):
            w.changed.connect(self.validate)
        for line in (self.lr, self.name, self.runs_dir, self.resume, self.rdzv_endpoint,
                     self.script_args):
            line.textChanged.connect(self.validate)
        for combo in (self.optimizer, self.precision, self.lr_schedule):
            combo.currentTextChanged.connect(self.validate)
        self.valid = False
        self.last_error: str | None = None
        """Why Start is refused, in the form's words (None: it is not)."""
        self.problem: str | None = None
        """The same, as RunConfig words it (its keys: lr, batch_size, ...)."""
        labels = {key: label for label, widget in (*rows, ("CPU processes", self.devices.count),
                                                   ("GPUs", self.devices.table),
                                                   ("Devices", self.devices),
                                                   ("Nodes", self.nnodes),
                                                   ("Rendezvous", self.rdzv_endpoint))
                  for key, field in self.fields.items() if field is widget and label}
        self.errors = FormErrors(self, self._forms, self.fields, labels, self.field_error,
                                 self.error)
        self._shown_source = BUILTIN
        self._show_source()
        self.source.changed.connect(self._show_source)

    def _spin(self, key: str, lo: int, hi: int, value: int, tip: str = "") -> QSpinBox:
        spin = QSpinBox()
        spin.setObjectName(key)
        spin.setRange(lo, hi)
        spin.setValue(value)
        spin.setToolTip(tip)
        spin.valueChanged.connect(lambda _v: self.validate())
        self.fields[key] = spin
        return spin

    # ------------------------------------------------------------------------- source
    def _show_source(self) -> None:
        """Show the rows of the chosen source only (the others keep their values), and its max
        steps (a script's own end by default)."""
        source, before = self.source.value(), self._shown_source
        self._steps[before] = self.max_steps.value()
        self._shown_source = source
        if source != before:
            self.max_steps.setValue(self._steps[source])
        script = source == SCRIPT
        for widget in self._builtin_rows:
            self._training.setRowVisible(widget, not script)
        for widget in self._script_rows:
            self._training.setRowVisible(widget, script)
        self.validate()

    # ------------------------------------------------------------------------- form <-> dict
    def values(self) -> dict[str, Any]:
        """The form as RunConfig keys (values may be invalid: see :meth:`config`).

        Raises:
            ConfigError: the script's arguments do not split as a shell would split them.
        """
        out = self._shared_values()
        if self.source.value() == SCRIPT:
            out.update(self.script_fields.values())
        else:
            out.update(self._builtin_values())
        return out

    def _builtin_values(self) -> dict[str, Any]:
        lr_text = self.lr.text().strip()
        try:
            lr: Any = float(lr_text)
        except ValueError:
            lr = lr_text
        return {
            "model": self.model.value(), "dataset": self.dataset.value(),
            "loss": self.loss.value(), "epochs": self.epochs.value() or None,
            "batch_size": self.batch_size.value(), "lr": lr,
            "lr_schedule": self.lr_schedule.currentText(),
            "warmup_steps": self.warmup_steps.value(), "optimizer": self.optimizer.currentText(),
            "precision": self.precision.currentText(), "grad_accum": self.grad_accum.value(),
            "checkpoint_every": self.checkpoint_every.value(), "seed": self.seed.value(),
            "resume": self.resume.text().strip() or None,
        }

    def _shared_values(self) -> dict[str, Any]:
        """The fields of both sources."""
        out: dict[str, Any] = {
            "max_steps": self.max_steps.value() or None,
            "name": self.name.text().strip() or None, "runs_dir": self.runs_dir.text().strip(),
            "nnodes": self.nnodes.value(),
            "rdzv_endpoint": (self.rdzv_endpoint.text().strip() or None
                              if self.nnodes.value() > 1 else None),  # disabled: not used
        }
        out.update(self.devices.config_values())
        return out

    def set_config(self, cfg: RunConfig) -> None:
        """Fill the form from a config (a preset, the last settings, a run to resume). The
        fields of the other source keep what they hold (a script run's built-in fields are
        all defaults, and the other way round)."""
        self.source.set_value(SCRIPT if cfg.script else BUILTIN)
        if cfg.script:
            self.script_fields.set_config(cfg)
        else:
            self._set_builtin(cfg)
        self.max_steps.setValue(cfg.max_steps or 0)
        self.name.setText(cfg.name or "")
        if self.runs_dir.text().strip() != cfg.runs_dir:
            self.runs_dir.setText(cfg.runs_dir)
            self.runs_dir_changed.emit(cfg.runs_dir)
        self.nnodes.setValue(cfg.nnodes)
        self.rdzv_endpoint.setText(cfg.rdzv_endpoint or "")
        # node_rank: a launch from here is node 0 (the other nodes start from their scripts)
        shown = {*self._shared_values(), *self._builtin_values(), "script", "script_args",
                 "script_cwd", "device", "nproc", "gpus", "run_dir", "dry_run", "node_rank"}
        kept = {k: v for k, v in self._extra.items() if cfg.script and k in BUILTIN_ONLY}
        self._extra = {k: v for k, v in cfg.to_dict().items()
                       if k not in shown and k not in kept} | kept
        if self.devices.has_gpus:
            self.devices.set_gpus(cfg.gpus)
        elif cfg.nproc:
            self.devices.count.setValue(min(cfg.nproc, self.devices.count.maximum()))
        self.validate()

    def _set_builtin(self, cfg: RunConfig) -> None:
        self.model.set_value(cfg.model)
        self.dataset.set_value(cfg.dataset)
        self.loss.set_value(cfg.loss)
        self.epochs.setValue(cfg.epochs or 0)
        self.batch_size.setValue(cfg.batch_size)
        self.lr.setText(repr(cfg.lr))
        self.lr_schedule.setCurrentText(cfg.lr_schedule)
        self.warmup_steps.setValue(cfg.warmup_steps)
        self.optimizer.setCurrentText(cfg.optimizer)
        self.precision.setCurrentText(cfg.precision)
        self.grad_accum.setValue(cfg.grad_accum)
        self.checkpoint_every.setValue(cfg.checkpoint_every)
        self.seed.setValue(cfg.seed)
        self.resume.setText(cfg.resume or "")

    def config(self) -> RunConfig:
        """The validated config.

        Raises:
            ConfigError: the first problem, naming the field.
        """
        data = {**self.values(), **self._config_extra()}
        cfg = RunConfig.from_dict(data, source="form")
        check_environment(cfg, inventory=self.devices.inventory, cpu_count=self.devices.cpus)
        if cfg.device == "cuda" and not cfg.gpus:
            raise ConfigError("gpus: choose at least one GPU")
        return cfg

    def _config_extra(self) -> dict[str, Any]:
        """The fields the form does not show, less the built-in loop's for a script."""
        if self.source.value() == SCRIPT:
            return {k: v for k, v in self._extra.items() if k not in BUILTIN_ONLY}
        return self._extra

    # ------------------------------------------------------------------------- validation
    def validate(self) -> bool:
        self.rdzv_endpoint.setEnabled(self.nnodes.value() > 1)
        self.errors.edited()
        try:
            cfg = self.config()
        except ConfigError as e:
            message = str(e)
            self.errors.show(field_of(message, self.fields), message)
            self.problem = message
            self.last_error = self.errors.words(message)
            self._set_valid(False)
            self._name_hint(None)
            return False
        self._name_hint(cfg)
        self.errors.show(None, "")
        self.problem = self.last_error = None
        self._set_valid(True)
        return True

    def _name_hint(self, cfg: RunConfig | None) -> None:
        """The run name's placeholder: a script run's default name is the script's."""
        self.name.setPlaceholderText(
            "<model>-<dataset>" if self.source.value() == BUILTIN
            else dataclasses.replace(cfg, name=None).default_name() if cfg is not None
            else "<the script's name>")

    def _set_valid(self, valid: bool) -> None:
        self.valid = valid
        self.validity_changed.emit(valid)

    def open_cluster_dialog(self) -> QDialog | None:
        """The cluster scripts of this config (shown, not run: the dialog stays open)."""
        from app.cluster_dialog import ClusterDialog

        try:
            cfg = RunConfig.from_dict({**self.values(), **self._config_extra(), "nnodes": 1,
                                       "rdzv_endpoint": None}, source="form")
        except ConfigError as e:
            self.error.setText(f"no cluster scripts: {e}")
            return None
        dialog = ClusterDialog(cfg, self)
        dialog.nodes.setValue(max(2, self.nnodes.value()))
        if self.rdzv_endpoint.text().strip():
            host, _, port = self.rdzv_endpoint.text().strip().rpartition(":")
            dialog.host.setText(host)
            if port.isdigit() and 1 <= int(port) <= 65535:
                dialog.port.setValue(int(port))
        dialog.show()
        return dialog

    # ------------------------------------------------------------------------- presets
    def save_preset_to(self, path: str | Path) -> None:
        Path(path).write_text(self.config().to_toml(), encoding="utf-8")

    def load_preset_from(self, path: str | Path) -> None:
        """Fill the form with a preset; one that names no runs folder (Rankscope's own never
        do) keeps the form's."""
        data = load_config_file(path)
        data.setdefault("runs_dir", self.runs_dir.text().strip() or "runs")
        self.set_config(RunConfig.from_dict(data, source=f"preset {path}"))
        self.told.emit(f"the form is filled from the preset {Path(path).name}")
