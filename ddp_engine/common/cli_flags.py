"""Command-line flags: one per RunConfig field, generated from the dataclass, and back."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_files import load_config_file


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
        help_text = f.metadata["help"]
        if "default" not in help_text:  # a help text that names its default says it once
            help_text += f" (default: {default if default is not None else '-'})"
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
    script = given.get("script", data.get("script"))
    typed = [k for k in ("model", "dataset", "loss", "model_args", "dataset_args") if k in given]
    if script and typed:
        raise ConfigError(f"script: {script!r} was given together with --"
                          f"{typed[0].replace('_args', '-arg').replace('_', '-')}; a script run "
                          "trains what the script builds: drop one of them")
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
