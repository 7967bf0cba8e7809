"""The values a run config may hold: the choices, the names, and the parsing of specs
(standard library only). :class:`ConfigError` is what every check raises.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

BUILTIN_MODELS: tuple[str, ...] = ("mlp", "convnet", "resnet18", "gpt-tiny")
"""Model names the engine builds itself (ddp_engine/rank/models.py)."""

BUILTIN_DATASETS: tuple[str, ...] = ("synthetic", "digits", "mnist", "cifar10")
"""Dataset names that need no path."""

PATH_DATASETS: tuple[str, ...] = ("text", "imagefolder")
"""Dataset kinds written ``KIND:PATH``."""

BUILTIN_LOSSES: tuple[str, ...] = ("cross_entropy", "mse")
OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adamw")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
NONFINITE_POLICIES: tuple[str, ...] = ("stop", "warn")
SYNC_TIMINGS: tuple[str, ...] = ("reducer", "hook")
"""Where gradient-sync timing comes from: DDP's reducer timers, or Rankscope's comm hook."""
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
LR_SCHEDULES: tuple[str, ...] = ("constant", "cosine", "linear", "step")
BUILTIN_LOOP_ONLY: tuple[str, ...] = (
    "epochs", "batch_size", "lr", "lr_schedule", "warmup_steps", "optimizer", "momentum",
    "weight_decay", "precision", "grad_accum", "grad_clip", "find_unused_parameters",
    "num_workers", "checkpoint_every", "keep_step_checkpoints", "resume", "eval_every", "seed")
"""RunConfig fields that only the built-in loop reads: a script run must leave them unset
(the script has its own). ``max_steps`` applies to both: a script is stopped after that many
optimizer steps, as the scaling sweep needs."""

SYNTHETIC_SAMPLES = 4096
"""The synthetic dataset's training samples unless ``num_samples`` says otherwise."""
DIGITS_SAMPLES = 1797
"""scikit-learn's digits: 1,797 images, of which ``val_fraction`` (default below) validate."""
DIGITS_VAL_FRACTION = 0.2

NODE_RANK_ENV = "RANKSCOPE_NODE_RANK"
"""Set by the launcher on each node of a multi-node run (``--node-rank``): the ranks are
numbered by it, ``node_rank * local_world_size + local_rank``. torchrun's c10d rendezvous
numbers the nodes in the order of their descriptors (host name, then launcher pid) instead,
so global rank 0 could land on any node; numbered by node rank it is on node 0, with the run
folder the user started there."""

PLUGIN_RE = re.compile(r"^(?P<target>.+?):(?P<func>[A-Za-z_][A-Za-z0-9_]*)$")
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ConfigError(ValueError):
    """A config value is invalid. The message names the field, the value and what is allowed."""


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


def check_host(name: str, value: str | None) -> None:
    """A host name or IP address: not empty, no spaces (None: unset)."""
    if value is not None and (not value.strip() or any(c.isspace() for c in value.strip())):
        raise ConfigError(f"{name} must be a host name or IP address, got {value!r}")


def check_network(cfg: Any) -> None:
    """A RunConfig's nodes, rendezvous and telemetry server address.

    Raises:
        ConfigError: naming the field, the value and what is allowed.
    """
    check_at_least("nnodes", cfg.nnodes, 1)
    if not 0 <= cfg.node_rank < cfg.nnodes:
        raise ConfigError(f"node_rank must be between 0 and nnodes - 1 "
                          f"({cfg.nnodes - 1}), got {cfg.node_rank}")
    if cfg.rdzv_endpoint is not None:
        split_endpoint("rdzv_endpoint", cfg.rdzv_endpoint)
    elif cfg.nnodes > 1:
        raise ConfigError(f"rdzv_endpoint: nnodes is {cfg.nnodes}, so every node needs "
                          "the rendezvous address, HOST:PORT (node 0's host and a free "
                          "port, e.g. node0.example.org:29400)")
    check_host("local_addr", cfg.local_addr)
    check_host("monitor_host", cfg.monitor_host)
    if ":" in cfg.monitor_host:  # an IPv6 socket would not take the 127.0.0.1 monitor.json names
        raise ConfigError(f"monitor_host: IPv4 only, got {cfg.monitor_host.strip()!r}: give "
                          "127.0.0.1 (this machine only), one of its IPv4 addresses or 0.0.0.0 "
                          "(all of them)")
    cfg.monitor_host = cfg.monitor_host.strip()
    if cfg.rdzv_id is not None and not NAME_RE.match(cfg.rdzv_id):
        raise ConfigError(f"rdzv_id: {cfg.rdzv_id!r} is not allowed; use 1-64 letters, "
                          "digits, '.', '_' or '-', starting with a letter or digit")
    if not 0 <= cfg.monitor_port <= 65535:
        raise ConfigError(f"monitor_port must be between 0 and 65535, got {cfg.monitor_port}")


def split_dataset(spec: str) -> tuple[str, str]:
    """Classify a dataset spec: ``("synthetic", "")``, ``("text", PATH)``, ``("plugin", spec)``."""
    for kind in PATH_DATASETS:
        if spec.startswith(kind + ":"):
            return kind, spec[len(kind) + 1:]
    if spec in BUILTIN_DATASETS:
        return spec, ""
    if PLUGIN_RE.match(spec):
        return "plugin", spec
    return spec, ""


def split_plugin(spec: str) -> tuple[str, str]:
    """``"pkg/file.py:build"`` -> ``("pkg/file.py", "build")``."""
    m = PLUGIN_RE.match(spec)
    if not m:
        raise ConfigError(f"{spec!r} is not FILE.py:FUNC or package.module:FUNC")
    return m.group("target"), m.group("func")


def join_ints(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}: {value!r} is not allowed; choose one of {', '.join(allowed)}")


def check_at_least(name: str, value: int | None, minimum: int) -> None:
    if value is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")


def check_positive(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value}")


def batch_exceeds_data(batch_size: int, grad_accum: int, nproc: int, samples: int) -> str | None:
    """Why no step can be made, or None: each rank's shard of ``samples`` must hold at least
    one step's ``batch_size x grad_accum`` samples (the loader drops a last partial batch)."""
    if (samples // nproc) // batch_size // grad_accum > 0:
        return None
    return (f"batch_size: {batch_size} x grad_accum {grad_accum} x nproc {nproc} samples per "
            f"step exceed the {samples} training samples; lower batch_size, grad_accum or "
            "nproc")


_FIELD_TYPES: dict[str, tuple[type, ...]] = {}


def check_field_types(cfg: Any) -> None:
    """Reject values of the wrong type (config files can hold anything)."""
    if not _FIELD_TYPES:
        for f in dataclasses.fields(cfg):
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
        if name == "script_args":
            for a in value:
                if not isinstance(a, str):
                    raise ConfigError(f"script_args must be a list of strings (the script's "
                                      f"arguments), got {value!r}")
        if name in ("model_args", "dataset_args"):
            for k in value:
                if not isinstance(k, str) or not k.isidentifier():
                    raise ConfigError(f"{name}: key {k!r} is not a valid keyword argument name")


