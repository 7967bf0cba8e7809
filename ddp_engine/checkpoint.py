"""Checkpoints: written atomically by rank 0, loaded with ``weights_only=True``."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import torch

from ddp_engine.config import ConfigError

FORMAT = "rankscope-checkpoint"
FORMAT_VERSION = 1


def save_atomic(payload: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """torch.save to a temp file in the same folder, fsync, then os.replace.

    A kill at any moment leaves either the previous file or the new one, never a torn file.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        dir_fd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def load(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load one of our checkpoints with ``weights_only=True``.

    Raises:
        ConfigError: the file is missing or is not a Rankscope checkpoint.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"resume: checkpoint {str(path)!r} does not exist")
    try:
        data = torch.load(p, map_location=map_location, weights_only=True)
    except Exception as e:  # pickle, zip and weights_only errors all mean "not ours"
        raise ConfigError(f"resume: {str(path)!r} is not a Rankscope checkpoint "
                          f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"resume: {str(path)!r} is not a Rankscope checkpoint (no "
                          f"format={FORMAT!r} key)")
    if data.get("format_version") != FORMAT_VERSION:
        raise ConfigError(f"resume: {str(path)!r} has format version "
                          f"{data.get('format_version')!r}; this engine reads {FORMAT_VERSION}")
    return data


def capture_rng() -> dict[str, Any]:
    """This process's RNG states in weights_only-loadable types (tensors, lists, ints)."""
    version, state, gauss = random.getstate()
    out: dict[str, Any] = {"torch": torch.get_rng_state(),
                           "python": [version, list(state), gauss]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def restore_rng(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    version, state, gauss = states["python"]
    random.setstate((version, tuple(state), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])
