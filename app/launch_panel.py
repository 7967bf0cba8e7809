"""The launch form: RunConfig <-> widgets, validated inline by the engine's own RunConfig."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.desktop import default_presets
from app.devices import DevicePicker
from app.dialogs import save_folder, tell
from app.spec_field import CUSTOM, SpecField
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_files import load_config_file
from ddp_engine.common.config_values import (
    BUILTIN_DATASETS,
    BUILTIN_LOSSES,
    BUILTIN_MODELS,
    OPTIMIZERS,
    PRECISIONS,
)
from ddp_engine.common.gpus import GpuInfo
from ddp_engine.common.machine_checks import check_environment

DATASET_CHOICES = [*BUILTIN_DATASETS, "text file...", "image folder...", CUSTOM]
ERROR_STYLE = "border: 1px solid #d62728; background: #fff0f0;"
DEFAULT_MAX_STEPS = 200


class LaunchPanel(QWidget):
    """The form. ``validity_changed(bool)`` tells the window whether Start may be enabled."""

    validity_changed = Signal(bool)
    runs_dir_changed = Signal(str)
    """The runs folder typed in the form, or set by a preset or a resume (the window follows)."""

    def __init__(self, runs_dir: str = "runs", gpus: list[GpuInfo] | None = None) -> None:
        super().__init__()
        self.fields: dict[str, QWidget] = {}
        # Fields the form does not show (model_args, eval_every, ...) from a preset or a resumed
        # run's config: kept as they were, so nothing the user set is lost.
        self._extra: dict[str, Any] = {}
        self.model = SpecField("model", [*BUILTIN_MODELS, CUSTOM], {CUSTOM: ""})
        self.dataset = SpecField("dataset", DATASET_CHOICES,
                                 {"text file...": "text:", "image folder...": "imagefolder:",
                                  CUSTOM: ""})
        self.loss = SpecField("loss", [*BUILTIN_LOSSES, CUSTOM], {CUSTOM: ""})
        self.max_steps = self._spin("max_steps", 0, 10**9, DEFAULT_MAX_STEPS, "0: no limit")
        self.epochs = self._spin("epochs", 0, 10**6, 0, "0: no limit (1 if max steps is 0)")
        self.batch_size = self._spin("batch_size", 0, 10**6, 32)
        self.lr = QLineEdit("0.001")
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
        self.name.setToolTip("the run folder's name; empty: automatic, <model>-<dataset> and "
                             "the start time")
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
                            ("loss", self.loss), ("lr", self.lr), ("optimizer", self.optimizer),
                            ("precision", self.precision), ("name", self.name),
                            ("runs_dir", self.runs_dir), ("resume", self.resume),
                            ("nproc", self.devices.count),
                            ("gpus", self.devices.table), ("device", self.devices),
                            ("rdzv_endpoint", self.rdzv_endpoint)):
            widget.setObjectName(key)
            self.fields[key] = widget

        form = QFormLayout()
        form.addRow("Model", self.model)
        form.addRow("Dataset", self.dataset)
        form.addRow("Loss", self.loss)
        form.addRow("Max steps", self.max_steps)
        form.addRow("Epochs", self.epochs)
        form.addRow("Batch size / device", self.batch_size)
        form.addRow("Learning rate", self.lr)
        form.addRow("Optimizer", self.optimizer)
        form.addRow("Precision", self.precision)
        form.addRow("Grad. accumulation", self.grad_accum)
        form.addRow("Checkpoint every", self.checkpoint_every)
        form.addRow("Seed", self.seed)
        form.addRow("Run name", self.name)
        form.addRow("Runs folder", self.runs_dir)
        form.addRow("Resume from", self.resume)
        training = QGroupBox("Training")
        training.setLayout(form)
        devices = QGroupBox("Devices")
        dl = QVBoxLayout(devices)
        dl.addWidget(self.devices)
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
        self.error = QLabel("")
        self.error.setObjectName("error")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #d62728;")
        # The reason for a bad value, in the row under its field (the bottom line above keeps
        # the same text, and shows it only for a value no row of the form holds).
        self.field_error = QLabel("")
        self.field_error.setObjectName("field_error")
        self.field_error.setWordWrap(True)
        self.field_error.setStyleSheet("color: #d62728;")
        self._forms = [form, nodes_form]
        for f in self._forms:  # a narrow panel puts a field under its label, never cut off
            f.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
            f.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self._field_error_in: QFormLayout | None = None
        self.presets = QComboBox()
        self.presets.setObjectName("presets")
        self.presets.setToolTip("fill the form with one of Rankscope's presets (the runs "
                                "folder stays as it is)")
        # Sized by a short text, not the longest title (the popup shows the titles whole).
        self.presets.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.presets.setMinimumContentsLength(12)
        self.presets.addItem("Presets...")
        for preset in default_presets():
            self.presets.addItem(preset.title, str(preset.path))
        self.presets.activated.connect(self._preset_chosen)
        self.save_preset = QPushButton("Save preset...")
        self.load_preset = QPushButton("Load preset...")
        buttons = QHBoxLayout()
        buttons.addWidget(self.load_preset)
        buttons.addWidget(self.save_preset)
        layout = QVBoxLayout(self)
        layout.addWidget(self.presets)
        layout.addWidget(training)
        layout.addWidget(devices)
        layout.addWidget(nodes)
        layout.addWidget(self.error)
        layout.addLayout(buttons)
        layout.addStretch(1)
        self.save_preset.clicked.connect(self._save_preset_dialog)
        self.load_preset.clicked.connect(self._load_preset_dialog)
        self.cluster_scripts.clicked.connect(self.open_cluster_dialog)

        for w in (self.model, self.dataset, self.loss, self.devices):
            w.changed.connect(self.validate)
        for line in (self.lr, self.name, self.runs_dir, self.resume, self.rdzv_endpoint):
            line.textChanged.connect(self.validate)
        for combo in (self.optimizer, self.precision):
            combo.currentTextChanged.connect(self.validate)
        self.valid = False
        self.last_error: str | None = None
        self.validate()

    def _spin(self, key: str, lo: int, hi: int, value: int, tip: str = "") -> QSpinBox:
        spin = QSpinBox()
        spin.setObjectName(key)
        spin.setRange(lo, hi)
        spin.setValue(value)
        if tip:
            spin.setToolTip(tip)
        spin.valueChanged.connect(lambda _v: self.validate())
        self.fields[key] = spin
        return spin

    # ------------------------------------------------------------------------- form <-> dict
    def values(self) -> dict[str, Any]:
        """The form as RunConfig keys (values may be invalid: see :meth:`config`)."""
        lr_text = self.lr.text().strip()
        try:
            lr: Any = float(lr_text)
        except ValueError:
            lr = lr_text
        out: dict[str, Any] = {
            "model": self.model.value(), "dataset": self.dataset.value(),
            "loss": self.loss.value(), "max_steps": self.max_steps.value() or None,
            "epochs": self.epochs.value() or None, "batch_size": self.batch_size.value(),
            "lr": lr, "optimizer": self.optimizer.currentText(),
            "precision": self.precision.currentText(), "grad_accum": self.grad_accum.value(),
            "checkpoint_every": self.checkpoint_every.value(), "seed": self.seed.value(),
            "name": self.name.text().strip() or None, "runs_dir": self.runs_dir.text().strip(),
            "resume": self.resume.text().strip() or None, "nnodes": self.nnodes.value(),
            "rdzv_endpoint": (self.rdzv_endpoint.text().strip() or None
                              if self.nnodes.value() > 1 else None),  # disabled: not used
        }
        out.update(self.devices.config_values())
        return out

    def set_config(self, cfg: RunConfig) -> None:
        """Fill the form from a config (a preset, or the last settings)."""
        self.model.set_value(cfg.model)
        self.dataset.set_value(cfg.dataset)
        self.loss.set_value(cfg.loss)
        self.max_steps.setValue(cfg.max_steps or 0)
        self.epochs.setValue(cfg.epochs or 0)
        self.batch_size.setValue(cfg.batch_size)
        self.lr.setText(repr(cfg.lr))
        self.optimizer.setCurrentText(cfg.optimizer)
        self.precision.setCurrentText(cfg.precision)
        self.grad_accum.setValue(cfg.grad_accum)
        self.checkpoint_every.setValue(cfg.checkpoint_every)
        self.seed.setValue(cfg.seed)
        self.name.setText(cfg.name or "")
        if self.runs_dir.text().strip() != cfg.runs_dir:
            self.runs_dir.setText(cfg.runs_dir)
            self.runs_dir_changed.emit(cfg.runs_dir)
        self.resume.setText(cfg.resume or "")
        self.nnodes.setValue(cfg.nnodes)
        self.rdzv_endpoint.setText(cfg.rdzv_endpoint or "")
        # node_rank: a launch from here is node 0 (the other nodes start from their scripts)
        shown = set(self.values()) | {"device", "nproc", "gpus", "run_dir", "dry_run",
                                      "node_rank"}
        self._extra = {k: v for k, v in cfg.to_dict().items() if k not in shown}
        if self.devices.has_gpus:
            self.devices.set_gpus(cfg.gpus)
        elif cfg.nproc:
            self.devices.count.setValue(min(cfg.nproc, self.devices.count.maximum()))
        self.validate()

    def config(self) -> RunConfig:
        """The validated config.

        Raises:
            ConfigError: the first problem, naming the field.
        """
        data = {**self.values(), **self._extra}
        cfg = RunConfig.from_dict(data, source="form")
        check_environment(cfg, gpu_count=len(self.devices.gpus), cpu_count=self.devices.cpus)
        if cfg.device == "cuda" and not cfg.gpus:
            raise ConfigError("gpus: choose at least one GPU")
        return cfg

    # ------------------------------------------------------------------------- validation
    def validate(self) -> bool:
        self.rdzv_endpoint.setEnabled(self.nnodes.value() > 1)
        for w in self.fields.values():
            w.setStyleSheet("")
            w.setToolTip("")
        try:
            self.config()
        except ConfigError as e:
            message = str(e)
            key = _field_of(message, self.fields)
            if key is not None:
                self.fields[key].setStyleSheet(ERROR_STYLE)
                self.fields[key].setToolTip(message)
            self.error.setText(message)
            self.error.setVisible(not self._show_under(self.fields.get(key or ""), message))
            self.last_error = message
            self._set_valid(False)
            return False
        self.error.setText("")
        self._show_under(None, "")
        self.last_error = None
        self._set_valid(True)
        return True

    def _show_under(self, field: QWidget | None, message: str) -> bool:
        """Put ``message`` in a row under ``field`` (None: take the row away). False when no
        row of the form holds that field (the devices, a field the form does not show)."""
        if self._field_error_in is not None:
            self._field_error_in.takeRow(self.field_error)
            self._field_error_in = None
        self.field_error.setText(message)
        for form in self._forms:
            row, _role = form.getWidgetPosition(field) if field is not None else (-1, None)
            if row >= 0:
                form.insertRow(row + 1, self.field_error)
                self.field_error.show()
                self._field_error_in = form
                return True
        self.field_error.hide()
        return False

    def _set_valid(self, valid: bool) -> None:
        if valid != self.valid:
            self.valid = valid
        self.validity_changed.emit(valid)

    def open_cluster_dialog(self) -> QDialog | None:
        """The cluster scripts of this config (shown, not run: the dialog stays open)."""
        from app.cluster_dialog import ClusterDialog

        try:
            cfg = RunConfig.from_dict({**self.values(), **self._extra, "nnodes": 1,
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

    def _preset_chosen(self, index: int) -> None:
        path = self.presets.itemData(index)
        self.presets.setCurrentIndex(0)  # a menu of presets, not a state of the form
        if path:
            try:
                self.load_preset_from(path)
            except ConfigError as e:
                self.error.setText(str(e))

    def _save_preset_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save preset",
                                              str(save_folder(self) / "run.toml"),
                                              "TOML (*.toml)")
        if path:
            try:
                self.save_preset_to(path)
                tell(self, f"preset saved to {path}")
            except (ConfigError, OSError) as e:
                self.error.setText(f"not saved: {e}")

    def _load_preset_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load preset", str(save_folder(self)),
                                              "TOML (*.toml)")
        if path:
            try:
                self.load_preset_from(path)
            except ConfigError as e:
                self.error.setText(str(e))


def _field_of(message: str, fields: dict[str, QWidget]) -> str | None:
    """The field a ConfigError message is about: messages start with the field's name."""
    m = re.match(r"^([a-z_]+)", message)
    if not m:
        return None
    key = m.group(1)
    if key in fields:
        return key
    if key in ("model_args",):
        return "model"
    if key in ("dataset_args",):
        return "dataset"
    return None

