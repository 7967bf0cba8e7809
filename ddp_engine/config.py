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

import argparse
import ast
import dataclasses
import importlib.util
import json
import math
import os
import re
import socket
import tomllib
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

BUILTIN_MODELS: tuple[str, ...] = ("mlp", "convnet", "resnet18", "gpt-tiny")
"""Model names the engine builds itself (ddp_engine/models.py)."""

BUILTIN_DATASETS: tuple[str, ...] = ("synthetic", "digits", "mnist", "cifar10")
"""Dataset names that need no path."""

PATH_DATASETS: tuple[str, ...] = ("text", "imagefolder")
"""Dataset kinds written ``KIND:PATH``."""

BUILTIN_LOSSES: tuple[str, ...] = ("cross_entropy", "mse")
OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adamw")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
NONFINITE_POLICIES: tuple[str, ...] = ("stop", "warn")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")

NODE_RANK_ENV = "RANKSCOPE_NODE_RANK"
"""Set by the launcher on each node of a multi-node run (``--node-rank``): the ranks are
numbered by it, ``node_rank * local_world_size + local_rank``. torchrun's c10d rendezvous
numbers the nodes in the order of their descriptors (host name, then launcher pid) instead,
so global rank 0 could land on any node; numbered by node rank it is on node 0, with the run
folder the user started there."""

_PLUGIN_RE = re.compile(r"^(?P<target>.+?):(?P<func>[A-Za-z_][A-Za-z0-9_]*)$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ConfigError(ValueError):
    """A config value is invalid. The message names the field, the value and what is allowed."""


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
    eval_every: int = _f("evaluate on the validation set every N steps (0: at the end only)",
                         100)
    """Validation interval in steps when the dataset has a validation split."""
    log_every: int = _f("write metrics every N steps (the terminal prints the latest up to 4 "
                        "times a second)", 10)
    """Metrics interval in steps."""
    stop_check_every: int = _f("at most N steps between agreed-stop checks (a tiny CPU "
                               "all-reduce); slow steps are checked every 0.5 s, down to every "
                               "step", 5)
    """How often ranks agree on whether to stop."""
    telemetry: bool = _f("per-rank timing (comm hook), device sampling and the live server",
                         True)
    """Measure and serve live telemetry; off leaves only loss and throughput in metrics.jsonl."""
    monitor_port: int = _f("TCP port of rank 0's telemetry server on 127.0.0.1 (0: a free one)",
                           0)
    """Port of the live telemetry server."""
    monitor_buffer_bytes: int = _f("bytes a viewer may fall behind before it is dropped",
                                   8 * 1024 * 1024)
    """Bound of each viewer's send buffer."""
    seed: int = _f("random seed (rank r uses seed + r for its own randomness)", 0)
    """Seed."""
    dist_timeout_s: float = _f("seconds before a collective with a dead peer fails", 120.0)
    """Timeout of init_process_group and collectives."""
    shutdown_timeout_s: int = _f("seconds torchrun waits for ranks after a stop before SIGKILL",
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
                                "--local-addr; default: its host name). With several network "
                                "interfaces also set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME")
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
        _check_type(self)
        self.model = self.model.strip()
        self.dataset = self.dataset.strip()
        self.loss = self.loss.strip()
        if not self.model:
            raise ConfigError(f"model must not be empty; known: {', '.join(BUILTIN_MODELS)} "
                              "or FILE.py:FUNC")
        if self.model not in BUILTIN_MODELS and not _PLUGIN_RE.match(self.model):
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
        if self.loss not in BUILTIN_LOSSES and not _PLUGIN_RE.match(self.loss):
            raise ConfigError(f"loss: unknown loss {self.loss!r}; known: "
                              f"{', '.join(BUILTIN_LOSSES)}, or FILE.py:FUNC")
        if self.model == "gpt-tiny" and kind not in ("text", "plugin"):
            raise ConfigError(f"model: gpt-tiny is a character language model and needs "
                              f"dataset text:PATH, got dataset {self.dataset!r}")
        if kind == "text" and self.model in ("mlp", "convnet", "resnet18"):
            raise ConfigError(f"dataset: {self.dataset!r} gives token sequences; use model "
                              f"gpt-tiny or a plugin, got model {self.model!r}")
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("nonfinite_loss", self.nonfinite_loss, NONFINITE_POLICIES)
        _choice("device", self.device, DEVICES)
        if self.gpus is not None:
            if not self.gpus:
                raise ConfigError("gpus must list at least one GPU index, e.g. 0 or 0,1; got an "
                                  "empty list")
            for g in self.gpus:
                if g < 0:
                    raise ConfigError(f"gpus: GPU index must be >= 0, got {g}")
            if len(set(self.gpus)) != len(self.gpus):
                raise ConfigError(f"gpus: each GPU may be listed once, got {_csv(self.gpus)}")
            if self.device == "cpu":
                raise ConfigError(f"gpus: {_csv(self.gpus)} given with device 'cpu'; drop "
                                  "--gpus or use --device cuda/auto")
            if self.nproc is not None and self.nproc != len(self.gpus):
                raise ConfigError(f"nproc must equal the number of GPUs in gpus "
                                  f"({len(self.gpus)}: {_csv(self.gpus)}), got {self.nproc}")
        if self.precision == "fp16" and self.device == "cpu":
            raise ConfigError("precision: fp16 needs CUDA; on CPU use fp32 or bf16")
        _at_least("nproc", self.nproc, 1)
        _at_least("max_steps", self.max_steps, 1)
        _at_least("epochs", self.epochs, 1)
        _at_least("batch_size", self.batch_size, 1)
        _at_least("grad_accum", self.grad_accum, 1)
        _at_least("checkpoint_every", self.checkpoint_every, 0)
        _at_least("eval_every", self.eval_every, 0)
        _at_least("log_every", self.log_every, 1)
        _at_least("stop_check_every", self.stop_check_every, 1)
        _at_least("num_workers", self.num_workers, 0)
        _at_least("shutdown_timeout_s", self.shutdown_timeout_s, 1)
        _at_least("monitor_buffer_bytes", self.monitor_buffer_bytes, 1024)
        _at_least("nnodes", self.nnodes, 1)
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"node_rank must be between 0 and nnodes - 1 "
                              f"({self.nnodes - 1}), got {self.node_rank}")
        if self.rdzv_endpoint is not None:
            split_endpoint("rdzv_endpoint", self.rdzv_endpoint)
        elif self.nnodes > 1:
            raise ConfigError(f"rdzv_endpoint: nnodes is {self.nnodes}, so every node needs "
                              "the rendezvous address, HOST:PORT (node 0's host and a free "
                              "port, e.g. node0.example.org:29400)")
        if self.local_addr is not None and (not self.local_addr.strip() or any(
                c.isspace() for c in self.local_addr.strip())):
            raise ConfigError(f"local_addr must be a host name or IP address, got "
                              f"{self.local_addr!r}")
        if self.rdzv_id is not None and not _NAME_RE.match(self.rdzv_id):
            raise ConfigError(f"rdzv_id: {self.rdzv_id!r} is not allowed; use 1-64 letters, "
                              "digits, '.', '_' or '-', starting with a letter or digit")
        if not 0 <= self.monitor_port <= 65535:
            raise ConfigError(f"monitor_port must be between 0 and 65535, got "
                              f"{self.monitor_port}")
        _positive("lr", self.lr)
        _positive("dist_timeout_s", self.dist_timeout_s)
        if self.grad_clip is not None:
            _positive("grad_clip", self.grad_clip)
        for name in ("momentum", "weight_decay"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {value}")
        if self.name is not None and not _NAME_RE.match(self.name):
            raise ConfigError(f"name: {self.name!r} is not allowed; use 1-64 letters, digits, "
                              "'.', '_' or '-', starting with a letter or digit")
        for name in ("run_dir", "runs_dir", "resume"):
            value = getattr(self, name)
            if value is not None and not str(value).strip():
                raise ConfigError(f"{name} must not be empty")

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

    def default_name(self) -> str:
        """The run name used when ``name`` is unset."""
        if self.name:
            return self.name
        parts = []
        for spec in (self.model, split_dataset(self.dataset)[0]):
            m = _PLUGIN_RE.match(spec)
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
        """TOML text that :func:`load_config_file` reads back to an equal config (written by
        tomli-w: any string, any character)."""
        top: dict[str, Any] = {}
        tables: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("model_args", "dataset_args") or value is None:
                continue
            args = getattr(self, f"{f.name}_args") if f.name in ("model", "dataset") else None
            if args:
                if "name" in args:  # the table's own key: it would replace the name silently
                    raise ConfigError(f"{f.name}_args: the key 'name' cannot be written to TOML "
                                      f"(the [{f.name}] table's name key is the {f.name} itself)")
                tables[f.name] = {"name": value, **args}
            else:
                top[f.name] = value
        try:
            return tomli_w.dumps({**top, **tables})
        except TypeError as e:  # a value TOML cannot hold (None inside model_args, ...)
            raise ConfigError(f"config: cannot write it as TOML: {e}") from None

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
            if f.name in ("model_args", "dataset_args"):
                for k, v in value.items():
                    argv += [f"--{f.name[:-5]}-arg", f"{k}={json.dumps(v)}"]
            elif isinstance(value, bool):
                argv.append(flag if value else "--no-" + f.name.replace("_", "-"))
            elif isinstance(value, list):
                argv += [flag, _csv(value)]
            else:
                argv += [flag, str(value)]
        return argv


# --------------------------------------------------------------------------------- helpers
def split_endpoint(name: str, value: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets: ``[::1]:29400``) as (host, port).

    Raises:
        ConfigError: naming ``name``, the value and the form allowed.
    """
    host, sep, port = value.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535 \
            or any(c.isspace() for c in host):
        raise ConfigError(f"{name} must be HOST:PORT with a port 1-65535 (e.g. "
                          f"node0.example.org:29400 or 10.0.0.1:29400), got {value!r}")
    return host, int(port)


def split_dataset(spec: str) -> tuple[str, str]:
    """Classify a dataset spec: ``("synthetic", "")``, ``("text", PATH)``, ``("plugin", spec)``."""
    for kind in PATH_DATASETS:
        if spec.startswith(kind + ":"):
            return kind, spec[len(kind) + 1:]
    if spec in BUILTIN_DATASETS:
        return spec, ""
    if _PLUGIN_RE.match(spec):
        return "plugin", spec
    return spec, ""


def split_plugin(spec: str) -> tuple[str, str]:
    """``"pkg/file.py:build"`` -> ``("pkg/file.py", "build")``."""
    m = _PLUGIN_RE.match(spec)
    if not m:
        raise ConfigError(f"{spec!r} is not FILE.py:FUNC or package.module:FUNC")
    return m.group("target"), m.group("func")


def _csv(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def _choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}: {value!r} is not allowed; choose one of {', '.join(allowed)}")


def _at_least(name: str, value: int | None, minimum: int) -> None:
    if value is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")


def _positive(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value}")


_FIELD_TYPES: dict[str, tuple[type, ...]] = {}


def _check_type(cfg: RunConfig) -> None:
    """Reject values of the wrong type (config files can hold anything)."""
    if not _FIELD_TYPES:
        for f in dataclasses.fields(RunConfig):
            t = str(f.type)
            if t.startswith("dict"):
                types: tuple[type, ...] = (dict,)
            elif t.startswith("list"):
                types = (list,)
            elif t.startswith("bool"):
                types = (bool,)
            elif t.startswith("int"):
                types = (int,)
            elif t.startswith("float"):
                types = (int, float)
            else:
                types = (str,)
            if "None" in t:
                types += (type(None),)
            _FIELD_TYPES[f.name] = types
    for name, types in _FIELD_TYPES.items():
        value = getattr(cfg, name)
        is_bool = isinstance(value, bool)
        if not isinstance(value, types) or (is_bool and bool not in types):
            words = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
                     list: "a list", dict: "a table", type(None): "unset"}
            names = [words[t] for t in types if not (t is int and float in types)]
            want = " or ".join(names)
            raise ConfigError(f"{name} must be {want}, got {value!r}")
        if float in types and isinstance(value, int) and not is_bool:
            setattr(cfg, name, float(value))  # TOML's `lr = 1` is the number 1.0
        if name == "gpus" and value is not None:
            for g in value:
                if not isinstance(g, int) or isinstance(g, bool):
                    raise ConfigError(f"gpus must be a list of GPU indices, got {value!r}")
        if name.endswith("_args"):
            for k in value:
                if not isinstance(k, str) or not k.isidentifier():
                    raise ConfigError(f"{name}: key {k!r} is not a valid keyword argument name")


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a TOML (``.toml``) or JSON (any other suffix) config file into a dict.

    Raises:
        ConfigError: file missing, or a parse error with its line.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config: file {str(p)!r} does not exist")
    text = p.read_text(encoding="utf-8")
    if p.suffix.lower() == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config: {p} does not parse as TOML: {e}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"config: {p} does not parse as JSON: {e.msg} (line {e.lineno}, "
                              f"column {e.colno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {p} must hold a table of keys, got {type(data).__name__}")
    return data


# ------------------------------------------------------------------------- command-line flags
def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per RunConfig field (plus --config, --model-arg, --dataset-arg).

    Flags default to ``None`` (``SUPPRESS``) so that only flags the user typed override the
    config file; ``--help`` still shows each field's default.
    """
    parser.add_argument("--config", metavar="FILE", help="TOML or JSON file of these keys; "
                        "flags given as well override it")
    defaults = RunConfig()
    for f in dataclasses.fields(RunConfig):
        if not f.metadata.get("flag", True):
            continue
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        help_text = f"{f.metadata['help']} (default: {default if default is not None else '-'})"
        t = str(f.type)
        if t.startswith("bool"):
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
            continue
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                                  "help": help_text}
        if t.startswith("list"):
            kwargs["type"] = _parse_int_list(f.name)
            kwargs["metavar"] = "I,J"
        elif t.startswith("int"):
            kwargs["type"] = _parse_number(f.name, int)
            kwargs["metavar"] = "N"
        elif t.startswith("float"):
            kwargs["type"] = _parse_number(f.name, float)
            kwargs["metavar"] = "X"
        else:
            kwargs["metavar"] = "PATH" if f.name in ("resume", "run_dir", "runs_dir") else "STR"
        parser.add_argument(flag, **kwargs)
    for kind in ("model", "dataset"):
        parser.add_argument(f"--{kind}-arg", dest=f"{kind}_args", action="append",
                            metavar="KEY=VALUE", default=argparse.SUPPRESS,
                            type=_parse_kwarg(f"{kind}_args"),
                            help=f"keyword argument for the {kind} (VALUE is JSON or a plain "
                            "string); repeatable")


def config_from_namespace(ns: argparse.Namespace,
                          fill: Mapping[str, Any] | None = None) -> RunConfig:
    """Merge ``--config FILE`` with the flags given on the command line (flags win); ``fill``
    gives values for keys that neither sets."""
    data: dict[str, Any] = {}
    source = "config"
    if getattr(ns, "config", None):
        data = load_config_file(ns.config)
        for key, value in (fill or {}).items():
            if getattr(ns, key, None) is None:
                data.setdefault(key, value)
        source = f"config {ns.config}"
        cfg = RunConfig.from_dict(data, source=source)
        data = cfg.to_dict()
    given = {k: v for k, v in vars(ns).items() if k in {f.name for f in dataclasses.fields(
        RunConfig)}}
    for key in ("model_args", "dataset_args"):
        if key in given:
            merged = dict(data.get(key) or {})
            merged.update(dict(given[key]))
            given[key] = merged
    data.update(given)
    for key, value in (fill or {}).items():
        data.setdefault(key, value)
    return RunConfig.from_dict(data, source=source)


def _parse_number(name: str, kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{name} must be {what}, got {text!r}") from None
    parse.__name__ = name
    return parse


def _parse_int_list(name: str) -> Any:
    def parse(text: str) -> list[int]:
        try:
            return [int(p) for p in text.split(",") if p.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be comma-separated GPU indices such as 0,2; got {text!r}") from None
    parse.__name__ = name
    return parse


def _parse_kwarg(name: str) -> Any:
    def parse(text: str) -> tuple[str, Any]:
        key, sep, raw = text.partition("=")
        if not sep or not key.isidentifier():
            raise argparse.ArgumentTypeError(f"{name}: expected KEY=VALUE, got {text!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        return key, value
    parse.__name__ = name
    return parse


# ------------------------------------------------------------------ checks against this machine
def check_environment(cfg: RunConfig, *, gpu_count: int, cpu_count: int) -> None:
    """Checks that need the file system or the device count (still no torch).

    Args:
        cfg: the config to check.
        gpu_count: GPUs visible to this process (NVML / CUDA_VISIBLE_DEVICES).
        cpu_count: CPU cores usable by this process.

    Raises:
        ConfigError: naming the field, the value and what is allowed.
    """
    device = resolved_device(cfg, gpu_count)
    if cfg.device == "cuda" and gpu_count == 0:
        raise ConfigError("device: 'cuda' asked for but no GPU is visible on this machine; "
                          "use --device cpu")
    if cfg.gpus is not None:
        for g in cfg.gpus:
            if g >= gpu_count:
                allowed = f"0..{gpu_count - 1}" if gpu_count else "none: no GPU is visible"
                raise ConfigError(f"gpus: GPU {g} does not exist; allowed: {allowed}")
    if cfg.nproc is not None:
        limit = gpu_count if device == "cuda" else cpu_count
        what = "GPUs" if device == "cuda" else "CPU cores"
        if cfg.nproc > limit:
            raise ConfigError(f"nproc must be between 1 and the number of {what} ({limit}), "
                              f"got {cfg.nproc}")
    if cfg.precision == "fp16" and device != "cuda":
        raise ConfigError("precision: fp16 needs CUDA and no GPU is in use; use fp32 or bf16")
    for field_name in ("model", "dataset", "loss"):
        spec = getattr(cfg, field_name)
        kind, path = split_dataset(spec) if field_name == "dataset" else ("", "")
        if kind in PATH_DATASETS:
            if not Path(path).exists():
                raise ConfigError(f"dataset: path {path!r} of {spec!r} does not exist")
            if kind == "text" and not Path(path).is_file():
                raise ConfigError(f"dataset: {spec!r} must name a text file, {path!r} is not "
                                  "a file")
            if kind == "imagefolder" and not Path(path).is_dir():
                raise ConfigError(f"dataset: {spec!r} must name a folder, {path!r} is not one")
        elif spec not in BUILTIN_MODELS + BUILTIN_DATASETS + BUILTIN_LOSSES:
            check_plugin(field_name, spec)
    if cfg.resume is not None:
        check_checkpoint_file(cfg.resume)
    if cfg.run_dir is not None and Path(cfg.run_dir).exists() and not Path(cfg.run_dir).is_dir():
        raise ConfigError(f"run_dir: {cfg.run_dir!r} is a file, not a folder")
    if Path(cfg.runs_dir).exists() and not Path(cfg.runs_dir).is_dir():
        raise ConfigError(f"runs_dir: {cfg.runs_dir!r} is a file, not a folder")
    if cfg.telemetry and cfg.monitor_port and cfg.node_rank == 0:  # rank 0 serves, on node 0
        check_port_free("monitor_port", cfg.monitor_port)


def check_port_free(field_name: str, port: int) -> None:
    """Raise ConfigError if nothing can listen on 127.0.0.1:``port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise ConfigError(f"{field_name}: port {port} on 127.0.0.1 is not free "
                              f"({e.strerror or e}); choose another, or 0 for a free one") \
                from None


def resolved_device(cfg: RunConfig, gpu_count: int) -> str:
    """``"cuda"`` or ``"cpu"``: what ``device`` means on a machine with ``gpu_count`` GPUs."""
    if cfg.device == "cpu":
        return "cpu"
    if cfg.device == "cuda" or cfg.gpus is not None:
        return "cuda"
    return "cuda" if gpu_count > 0 else "cpu"


def check_plugin(field_name: str, spec: str) -> None:
    """Check that a plugin's file (or module) exists and defines the function, without running
    it: the source is parsed, not imported."""
    target, func = split_plugin(spec)
    if target.endswith(".py") or "/" in target or os.sep in target:
        path = Path(target)
        if not path.is_file():
            raise ConfigError(f"{field_name}: plugin file {target!r} of {spec!r} does not exist")
    else:
        if not _MODULE_RE.match(target):
            raise ConfigError(f"{field_name}: {target!r} of {spec!r} is neither a .py file nor a "
                              "module name")
        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise ConfigError(f"{field_name}: module {target!r} of {spec!r} cannot be found")
        if not found.origin or not found.origin.endswith(".py"):
            return  # compiled or namespace module: checked when the worker imports it
        path = Path(found.origin)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        raise ConfigError(f"{field_name}: plugin file {str(path)!r} has a syntax error at line "
                          f"{e.lineno}: {e.msg}") from None
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    if func not in names:
        defined = ", ".join(sorted(n for n in names if not n.startswith("_"))) or "nothing"
        raise ConfigError(f"{field_name}: {str(path)!r} has no function {func!r} (it defines: "
                          f"{defined})")


def check_checkpoint_file(path: str) -> None:
    """A cheap stdlib check that ``path`` looks like a torch checkpoint (a zip with data.pkl).

    The engine checks the contents with torch before the run starts.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"resume: checkpoint {path!r} does not exist")
    try:
        with zipfile.ZipFile(p) as z:
            ok = any(n.endswith("/data.pkl") for n in z.namelist())
    except (zipfile.BadZipFile, OSError):
        ok = False
    if not ok:
        raise ConfigError(f"resume: {path!r} is not a Rankscope checkpoint (not a torch.save file)")
