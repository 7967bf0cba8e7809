"""Config files: TOML or JSON read into a dict, and a config written as TOML (tomli-w)."""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from pathlib import Path
from typing import Any

from ddp_engine.common.config_values import ConfigError


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


def toml_text(cfg: Any) -> str:
    """``cfg`` (a RunConfig) as TOML text that :func:`load_config_file` reads back to an equal
    config: ``model_args`` / ``dataset_args`` as ``[model]`` / ``[dataset]`` tables, unset
    values left out. Written by tomli-w: any string, any character.

    Raises:
        ConfigError: a value TOML cannot hold, or an argument called ``name``.
    """
    import tomli_w  # here, not at the top: reading configs and training need no tomli-w
    # (make gpu-check runs on machines where nothing can be installed)

    top: dict[str, Any] = {}
    tables: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in ("model_args", "dataset_args") or value is None:
            continue
        args = getattr(cfg, f"{f.name}_args") if f.name in ("model", "dataset") else None
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
