"""RunConfig: the single description of a training run (standard library only).

The app validates a form with it, the launcher validates it again, and every worker reads it
back from ``RUN_DIR/config.json``. It must never import torch: the GUI process imports it.

Every field is a command-line flag of the same name with dashes (``max_steps`` is
``--max-steps``) and a key of a TOML or JSON config file. In TOML, ``model`` and ``dataset`` may
also be tables whose ``name`` key is the model or dataset and whose other keys are keyword
arguments for it::

    [model]
    name = "examples/custom_model.py:build_model"
    hidden = 128
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_engine.common.config_files import toml_text
from ddp_engine.common.config_values import (
    BUILTIN_DATASETS,
    BUILTIN_LOOP_ONLY,
    BUILTIN_LOSSES,
    BUILTIN_MODELS,
    DEVICES,
    LR_SCHEDULES,
    NAME_RE,
    NONFINITE_POLICIES,
    OPTIMIZERS,
    PATH_DATASETS,
    PLUGIN_RE,
    PRECISIONS,
    SYNC_TIMINGS,
    ConfigError,
    check_at_least,
    check_choice,
    check_field_types,
    check_network,
    check_positive,
    join_ints,
    split_dataset,
)


def _f(help_text: str, default: Any = None, *, flag: bool = True, **kw: Any) -> Any:
    """A dataclass field carrying its help text (shown by ``--help``) in metadata."""
    meta = {"help": help_text, "flag": flag}
    if "default_factory" in kw:
        return field(default_factory=kw.pop("default_factory"), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class RunConfig:
    """A training run: what to train, on which devices, for how long, and where to write."""

    model: str = _f("mlp, convnet, resnet18, gpt-tiny, or FILE.py:FUNC / package.module:FUNC",
                    "mlp")
    """Built-in model name, or a plugin ``FILE.py:FUNC`` / ``package.module:FUNC``."""
    model_args: dict[str, Any] = _f("keyword arguments for the model (TOML [model] table)",
                                    flag=False, default_factory=dict)
    """Keyword arguments passed to the model factory."""
    dataset: str = _f("synthetic, digits, mnist, cifar10, text:PATH, imagefolder:PATH, "
                      "or FILE.py:FUNC / package.module:FUNC", "synthetic")
    """Built-in dataset, ``text:PATH``, ``imagefolder:PATH`` or a plugin."""
    dataset_args: dict[str, Any] = _f("keyword arguments for the dataset (TOML [dataset] table)",
                                      flag=False, default_factory=dict)
    """Keyword arguments passed to the dataset factory."""
    loss: str = _f("cross_entropy, mse, or FILE.py:FUNC", "cross_entropy")
    """Loss: ``cross_entropy``, ``mse`` or a plugin returning a callable (output, target)."""

    script: str | None = _f("your own torchrun training script (FILE.py), run unchanged as "
                            "__main__ on every rank; its arguments go after --, e.g. launch "
                            "--script train.py --nproc 2 -- --epochs 3")
    """A user's own training script, run instead of the built-in loop (model, dataset, loss and
    the other fields of the built-in loop stay unset). See ``ddp_engine/rank/script_run.py``."""
    script_args: list[str] = _f("the script's arguments (on the command line: after --)",
                                flag=False, default_factory=list)
    """The script's ``sys.argv[1:]``."""
    script_cwd: str | None = _f("the script's working folder (default: the folder you launch "
                                "from, as with torchrun)")
    """Where the script runs (its relative paths start there). Unset: the launcher's own, as
    torchrun keeps its caller's; config.json gets it absolute (:meth:`with_script_paths`)."""

    device: str = _f("auto (GPUs when present), cpu (gloo processes) or cuda", "auto")
    """Where ranks run; ``auto`` picks CUDA when a GPU is visible."""
    nproc: int | None = _f("processes (one per GPU); default: every chosen GPU, or 2 on CPU")
    """Number of worker processes on this machine. Resolved by the launcher when unset."""
    gpus: list[int] | None = _f("GPU indices, e.g. 0,2 (implies --device cuda)")
    """Indices of the GPUs to use (as listed by NVML / nvidia-smi). Implies ``device="cuda"``."""

    max_steps: int | None = _f("stop after this many optimizer steps (loops over epochs)")
    """Optimizer steps to train for; training loops over epochs until reached."""
    epochs: int | None = _f("passes over the training data; default 1 unless --max-steps is set")
    """Epochs to train for. With ``max_steps`` too, whichever ends first."""
    batch_size: int = _f("samples per process per micro-step", 32)
    """Per-process batch size (the global batch is batch_size * nproc * grad_accum)."""
    lr: float = _f("learning rate", 1e-3)
    """Learning rate."""
    lr_schedule: str = _f("constant, cosine (to 0), linear (to 0) or step (x0.1 at half "
                          "and at three quarters of the steps), after --warmup-steps", "constant")
    """Learning-rate schedule of the built-in loop over its total steps; its learning rate is
    reported as the logged series ``lr``."""
    warmup_steps: int = _f("steps of linear learning-rate warm-up from 0", 0)
    """Linear warm-up before the schedule (its steps count towards the total)."""
    optimizer: str = _f("sgd, adam or adamw", "adamw")
    """Optimizer."""
    momentum: float = _f("SGD momentum", 0.9)
    """Momentum for SGD."""
    weight_decay: float = _f("weight decay", 0.0)
    """Weight decay."""
    precision: str = _f("fp32, bf16 or fp16 (fp16 needs CUDA)", "fp32")
    """Autocast precision; fp16 uses a gradient scaler and needs CUDA."""
    grad_accum: int = _f("micro-steps per optimizer step (no_sync on all but the last)", 1)
    """Gradient accumulation: micro-batches per optimizer step."""
    grad_clip: float | None = _f("clip the gradient norm to this value")
    """Max gradient norm, or None for no clipping."""
    nonfinite_loss: str = _f("a NaN or infinite loss: stop (an agreed stop that keeps the last "
                             "good checkpoint) or warn (a warning event, training goes on)",
                             "stop")
    """What a non-finite loss does; checked on reporting steps (every log_every)."""
    loss_spike_mads: float = _f("warn when the loss (mean over ranks) is above its median of "
                                "the last 50 reports by more than X median absolute "
                                "deviations for --loss-spike-reports reports in a row "
                                "(0: no such warning)", 6.0)
    """Rank 0's loss-spike warning: a report is far above the recent loss when its mean loss
    over ranks exceeds ``median + loss_spike_mads * spread`` of the reports before it (the last
    50, once there are 10), where spread is the scaled median absolute deviation (1.4826 MAD,
    the standard deviation of normal noise) but at least 5% of the median, so that a flat loss
    does not warn on tiny noise. ``0`` turns the warning off. See
    ``ddp_engine/rank/loss_watch.py``."""
    loss_spike_reports: int = _f("reports in a row that must be far above the recent loss "
                                 "before the loss-spike warning", 3)
    """Consecutive reports above the threshold that make one ``warning`` event (cause
    ``loss_spike``); the next one comes only after as many reports back under it."""
    find_unused_parameters: bool = _f("DDP find_unused_parameters", False)
    """Passed to DistributedDataParallel."""
    num_workers: int = _f("DataLoader worker processes per rank", 0)
    """DataLoader workers per rank."""

    checkpoint_every: int = _f("save checkpoints/last.pt every N steps (0: only at stop and "
                               "finish)", 0)
    """Checkpoint interval in steps; 0 saves only at stop and at the end."""
    keep_step_checkpoints: bool = _f("also keep checkpoints/step-N.pt for each save", False)
    """Keep a step-numbered copy of every periodic checkpoint."""
    resume: str | None = _f("continue from this checkpoint (PATH to a .pt of ours)")
    """Checkpoint to resume from."""
    eval_every: int = _f("evaluate on validation data every N steps (0: at the end only)", 100)
    """Validation interval in steps when the dataset has a validation split."""
    log_every: int = _f("write metrics every N steps (0: every 10 steps, or a multiple of 10 "
                        "so that reports are at least 0.2 s apart)", 0)
    """Metrics interval in steps; 0 paces reports by time (rank/report_pace.py)."""
    stop_check_every: int = _f("at most N steps between agreed-stop checks (0: at every "
                               "report and at least every 0.5 s)", 0)
    """How often ranks agree on whether to stop, beyond the round each report makes."""
    telemetry: bool = _f("per-rank timing, device sampling and the live server", True)
    """Measure and serve live telemetry; off leaves only loss and throughput in metrics.jsonl."""
    sync_timing: str = _f("sync timing from reducer (DDP's own timers, sampled) "
                          "or hook (a comm hook, every step)", "reducer")
    """rank/reducer_timing.py, or rank/sync_timing.py's hook (also a torch's without timers)."""
    monitor_port: int = _f("TCP port of rank 0's telemetry server (0: a free one)", 0)
    """Port of the live telemetry server."""
    monitor_host: str = _f("address rank 0's telemetry server listens on: 127.0.0.1 (this "
                           "machine only), an address of node 0's, or 0.0.0.0 (all of them); "
                           "other machines attach to it with the run's token", "127.0.0.1")
    """Bind address of the live telemetry server (rank 0 is on node 0)."""
    monitor_buffer_bytes: int = _f("bytes a viewer may fall behind before it is dropped",
                                   8 * 1024 * 1024)
    """Bound of each viewer's send buffer."""
    seed: int = _f("random seed (rank r uses seed + r for its own randomness)", 0)
    """Seed."""
    dist_timeout_s: float = _f("seconds before a collective with a dead peer fails", 120.0)
    """Timeout of init_process_group and collectives."""
    shutdown_timeout_s: int = _f("seconds the launcher waits for ranks after a stop before "
                                 "SIGKILL (not counting a checkpoint save)",
                                 30)
    """Grace period given to ranks after a stop signal."""

    nnodes: int = _f("machines (nodes) in the run; start `launch` on each with its own "
                     "--node-rank", 1)
    """Nodes in the run, each running ``nproc`` ranks (torchrun's --nnodes)."""
    node_rank: int = _f("this machine's place among the nodes, 0..nnodes-1; node 0 holds "
                        "global rank 0, the run folder's metrics and checkpoints, and the "
                        "telemetry server", 0)
    """This node: its ranks are node_rank * nproc + local rank."""
    rdzv_endpoint: str | None = _f("HOST:PORT of torchrun's c10d rendezvous, reachable from "
                                   "every node (node 0's address); needed when nnodes > 1")
    """Where the nodes meet (torchrun's --rdzv-endpoint, c10d backend)."""
    rdzv_id: str | None = _f("rendezvous id, the same on every node (default: rankscope-<run "
                             "name>)")
    """torchrun's --rdzv-id: nodes with the same id and endpoint form one run."""
    local_addr: str | None = _f("this node's address as the other nodes reach it (torchrun's "
                                "--local-addr; default: its host name); gloo and NCCL use the "
                                "interface holding it unless GLOO_SOCKET_IFNAME / "
                                "NCCL_SOCKET_IFNAME are set")
    """Node 0's is where the ranks' store is: it must be reachable from every node."""

    run_dir: str | None = _f("write this run into exactly this folder")
    """Run folder; when unset, ``runs_dir/<name>-<timestamp>``."""
    runs_dir: str = _f("parent folder of auto-named runs", "runs")
    """Where auto-named run folders go."""
    name: str | None = _f("run name (default: <model>-<dataset>)")
    """Run name: letters, digits, '.', '_' and '-'."""
    dry_run: bool = _f("print the torchrun command and resolved config; start nothing", False)
    """Print what would run and exit."""

    def __post_init__(self) -> None:
        self.validate()

    # ----------------------------------------------------------------------------- validation
    def validate(self) -> None:
        """Check every value on its own and against the others (no file system, no devices).

        Raises:
            ConfigError: naming the field, the value and what is allowed.
        """
        check_field_types(self)
        self.model = self.model.strip()
        self.dataset = self.dataset.strip()
        self.loss = self.loss.strip()
        if not self.model:
            raise ConfigError(f"model must not be empty; known: {', '.join(BUILTIN_MODELS)} "
                              "or FILE.py:FUNC")
        if self.model not in BUILTIN_MODELS and not PLUGIN_RE.match(self.model):
            raise ConfigError(f"model: unknown model {self.model!r}; known: "
                              f"{', '.join(BUILTIN_MODELS)}, or FILE.py:FUNC / "
                              "package.module:FUNC")
        kind, _path = split_dataset(self.dataset)
        if kind == "plugin":
            pass
        elif kind in PATH_DATASETS:
            if not _path:
                raise ConfigError(f"dataset: {self.dataset!r} needs a path, e.g. {kind}:PATH")
        elif kind not in BUILTIN_DATASETS:
            raise ConfigError(f"dataset: unknown dataset {self.dataset!r}; known: "
                              f"{', '.join(BUILTIN_DATASETS)}, "
                              f"{', '.join(k + ':PATH' for k in PATH_DATASETS)}, "
                              "or FILE.py:FUNC / package.module:FUNC")
        if self.loss not in BUILTIN_LOSSES and not PLUGIN_RE.match(self.loss):
            raise ConfigError(f"loss: unknown loss {self.loss!r}; known: "
                              f"{', '.join(BUILTIN_LOSSES)}, or FILE.py:FUNC")
        if self.model == "gpt-tiny" and kind not in ("text", "plugin"):
            raise ConfigError(f"model: gpt-tiny is a character language model and needs "
                              f"dataset text:PATH, got dataset {self.dataset!r}")
        if kind == "text" and self.model in ("mlp", "convnet", "resnet18"):
            raise ConfigError(f"dataset: {self.dataset!r} gives token sequences; use model "
                              f"gpt-tiny or a plugin, got model {self.model!r}")
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_at_least("warmup_steps", self.warmup_steps, 0)
        if self.script is not None:
            self._check_script()
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("nonfinite_loss", self.nonfinite_loss, NONFINITE_POLICIES)
        check_choice("sync_timing", self.sync_timing, SYNC_TIMINGS)
        check_choice("device", self.device, DEVICES)
        if self.gpus is not None:
            if not self.gpus:
                raise ConfigError("gpus must list at least one GPU index, e.g. 0 or 0,1; got an "
                                  "empty list")
            for g in self.gpus:
                if g < 0:
                    raise ConfigError(f"gpus: GPU index must be >= 0, got {g}")
            if len(set(self.gpus)) != len(self.gpus):
                raise ConfigError(f"gpus: each GPU may be listed once, got {join_ints(self.gpus)}")
            if self.device == "cpu":
                raise ConfigError(f"gpus: {join_ints(self.gpus)} given with device 'cpu'; drop "
                                  "--gpus or use --device cuda/auto")
            if self.nproc is not None and self.nproc != len(self.gpus):
                raise ConfigError(f"nproc must equal the number of GPUs in gpus "
                                  f"({len(self.gpus)}: {join_ints(self.gpus)}), got {self.nproc}")
        if self.precision == "fp16" and self.device == "cpu":
            raise ConfigError("precision: fp16 needs CUDA; on CPU use fp32 or bf16")
        check_at_least("nproc", self.nproc, 1)
        check_at_least("max_steps", self.max_steps, 1)
        check_at_least("epochs", self.epochs, 1)
        check_at_least("batch_size", self.batch_size, 1)
        check_at_least("grad_accum", self.grad_accum, 1)
        check_at_least("checkpoint_every", self.checkpoint_every, 0)
        check_at_least("eval_every", self.eval_every, 0)
        check_at_least("log_every", self.log_every, 0)
        check_at_least("stop_check_every", self.stop_check_every, 0)
        check_at_least("loss_spike_reports", self.loss_spike_reports, 1)
        check_at_least("num_workers", self.num_workers, 0)
        check_at_least("shutdown_timeout_s", self.shutdown_timeout_s, 1)
        check_at_least("monitor_buffer_bytes", self.monitor_buffer_bytes, 1024)
        check_network(self)
        check_positive("lr", self.lr)
        check_positive("dist_timeout_s", self.dist_timeout_s)
        if self.grad_clip is not None:
            check_positive("grad_clip", self.grad_clip)
        for name in ("momentum", "weight_decay", "loss_spike_mads"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {value}")
        if self.name is not None and not NAME_RE.match(self.name):
            raise ConfigError(f"name: {self.name!r} is not allowed; use 1-64 letters, digits, "
                              "'.', '_' or '-', starting with a letter or digit")
        for name in ("run_dir", "runs_dir", "resume"):
            value = getattr(self, name)
            if value is not None and not str(value).strip():
                raise ConfigError(f"{name} must not be empty")

    def _check_script(self) -> None:
        """A script run: the script path, and none of the built-in loop's fields."""
        assert self.script is not None
        self.script = self.script.strip()
        if not self.script:
            raise ConfigError("script must not be empty; give the path of a .py file")
        defaults = RunConfig()
        for name in ("model", "dataset", "loss", "model_args", "dataset_args"):
            if getattr(self, name) != getattr(defaults, name):
                raise ConfigError(f"script: a script run trains what the script builds; drop "
                                  f"{name} (got {getattr(self, name)!r}) or drop script")
        for name in BUILTIN_LOOP_ONLY:
            value = getattr(self, name)
            if value != getattr(defaults, name):
                raise ConfigError(f"script: {name} = {value!r} applies to the built-in loop "
                                  "only; pass the script its own setting after --")
        if self.script_cwd is not None and not self.script_cwd.strip():
            raise ConfigError("script_cwd must not be empty; give a folder, or leave it unset "
                              "for the folder you launch from")

    # ------------------------------------------------------------------------- derived values
    @property
    def total_epochs(self) -> int | None:
        """Epoch limit: ``epochs``, else 1 when ``max_steps`` is unset, else none."""
        if self.epochs is not None:
            return self.epochs
        return None if self.max_steps is not None else 1

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    def rendezvous_id(self) -> str:
        """``rdzv_id``, or one every node derives alike from the run name."""
        return self.rdzv_id or f"rankscope-{self.default_name()}"[:64]

    def with_script_paths(self) -> RunConfig:
        """A script run with ``script`` and ``script_cwd`` absolute, ``script_cwd`` by default
        this process's folder (as torchrun keeps its caller's); a built-in run as it is."""
        if self.script is None:
            return self
        return dataclasses.replace(self, script=str(Path(self.script).resolve()),
                                   script_cwd=str(Path(self.script_cwd or os.getcwd()).resolve()))

    def default_name(self) -> str:
        """The run name used when ``name`` is unset."""
        if self.name:
            return self.name
        if self.script:
            stem = self.script.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
            return re.sub(r"[^A-Za-z0-9._-]", "_", stem).lstrip("._-")[:64] or "script"
        parts = []
        for spec in (self.model, split_dataset(self.dataset)[0]):
            m = PLUGIN_RE.match(spec)
            parts.append(m.group("func") if m and spec not in BUILTIN_MODELS else spec)
        return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(parts))[:64]

    # ---------------------------------------------------------------------- (de)serialization
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> RunConfig:
        """Build from a dict such as a parsed TOML or JSON file.

        ``model`` and ``dataset`` may be tables with a ``name`` key; their other keys become
        ``model_args`` / ``dataset_args``.
        """
        data = dict(data)
        for key in ("model", "dataset"):
            value = data.get(key)
            if isinstance(value, Mapping):
                table = dict(value)
                if "name" not in table:
                    raise ConfigError(f"{source}: table [{key}] needs a name key, e.g. "
                                      f'name = "{"mlp" if key == "model" else "synthetic"}"')
                data[key] = table.pop("name")
                args = dict(data.get(f"{key}_args") or {})
                args.update(table)
                data[f"{key}_args"] = args
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown key {unknown[0]!r}; allowed keys: "
                              f"{', '.join(sorted(known))}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_toml(self) -> str:
        """TOML text that :func:`~ddp_engine.common.config_files.load_config_file` reads back to
        an equal config (written by tomli-w: any string, any character)."""
        return toml_text(self)

    def to_argv(self) -> list[str]:
        """Command-line flags that reproduce this config (fields left at default are omitted).

        ``model_args`` / ``dataset_args`` are given as ``--model-arg KEY=JSON``.
        """
        argv: list[str] = []
        defaults = RunConfig()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == getattr(defaults, f.name):
                continue
            flag = "--" + f.name.replace("_", "-")
            if f.name == "script_args":
                continue  # last, after "--"
            if f.name in ("model_args", "dataset_args"):
                for k, v in value.items():
                    argv += [f"--{f.name[:-5]}-arg", f"{k}={json.dumps(v)}"]
            elif isinstance(value, bool):
                argv.append(flag if value else "--no-" + f.name.replace("_", "-"))
            elif isinstance(value, list):
                argv += [flag, join_ints(value)]
            else:
                argv += [flag, str(value)]
        if self.script_args:
            argv += ["--", *self.script_args]
        return argv
