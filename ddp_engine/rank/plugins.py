"""Loading user code named ``FILE.py:FUNC`` or ``package.module:FUNC``."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddp_engine.common.config import ConfigError
from ddp_engine.common.config_values import split_plugin


def load_callable(spec: str, field_name: str) -> Callable[..., Any]:
    """Import the plugin and return its function.

    Raises:
        ConfigError: the file or module is missing, or lacks the function.
    """
    target, func = split_plugin(spec)
    if target.endswith(".py") or "/" in target:
        path = Path(target).resolve()
        if not path.is_file():
            raise ConfigError(f"{field_name}: plugin file {target!r} does not exist")
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
        mod_name = f"rankscope_plugin_{path.stem}_{digest}"
        module = sys.modules.get(mod_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise ConfigError(f"{field_name}: cannot import {target!r}")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[mod_name] = module
            # The plugin's own folder is importable, so it can import its neighbours.
            sys.path.insert(0, str(path.parent))
            try:
                loader_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[mod_name]
                raise
            finally:
                sys.path.remove(str(path.parent))
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            raise ConfigError(f"{field_name}: module {target!r} cannot be imported ({e})") from None
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ConfigError(f"{field_name}: {target!r} has no function {func!r}")
    return fn
