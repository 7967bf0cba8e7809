"""Checkpoints: written atomically by rank 0, loaded memory-mapped with ``weights_only=True``."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path
from typing import Any, BinaryIO

import torch

from ddp_engine.common.config import ConfigError
from ddp_engine.common.run_dir import atomic_write

FORMAT = "rankscope-checkpoint"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the message names the path, the cause and which
    checkpoint the run keeps."""


def save_atomic(payload: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """torch.save to a temp file in the same folder, fsync, then os.replace (and fsync the
    folder). A kill at any moment leaves either the previous file or the new one, never a torn
    file; the temp file a killed save leaves is removed by the next save of the same path.

    Raises:
        OSError: the file could not be written (full disk, permissions); ``path`` is untouched.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, lambda f: write_to(payload, f), sole_writer=True, durable=True)


def write_error(e: OSError, step: int, path: Path, kept: str) -> CheckpointError:
    """What to raise when the checkpoint of ``step`` could not be written to ``path``: the
    OS's reason (full disk, quota, permissions) and ``kept``, what the run still has."""
    why = e.strerror or str(e)
    code = f"{errno.errorcode.get(e.errno, e.errno)}, " if e.errno else ""
    return CheckpointError(f"the checkpoint of step {step} could not be written to {path} "
                           f"({code}{why}); {kept}")


class _Recording:
    """A file's ``write`` that remembers the OSError it raised: torch's zip writer turns it into
    a RuntimeError ("unexpected pos 147520 vs 147472") that no longer says the disk is full."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def write_to(payload: dict[str, Any], f: BinaryIO) -> None:
    """torch.save into an open file.

    Raises:
        OSError: the file could not be written (ENOSPC, EDQUOT, EIO), as the OS said it.
    """
    out = _Recording(f)
    try:
        torch.save(payload, out)  # type: ignore[arg-type]
    except RuntimeError as e:
        if out.error is not None:
            raise out.error from e
        raise


ZIP_MAGIC = b"PK\x03\x04"
"""How torch.save's zipfile format (the default since torch 1.6, and the only one that can be
memory-mapped) begins."""


def load(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load one of our checkpoints with ``weights_only=True``, memory-mapped.

    With ``mmap=True`` torch reads only the pickled index: each tensor is a view of the mapped
    file, paged in from the page cache when it is first read (and never, if it is not). Loading
    costs no memory of its own, and the ranks of one machine share one cached copy of the file
    instead of each holding a private one. A file of torch's old (pre-1.6) format cannot be
    mapped and is read whole, as before. The mapping goes when the last tensor of the result
    does.

    Raises:
        ConfigError: the file is missing, cut short or is not a Rankscope checkpoint.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"resume: checkpoint {str(path)!r} does not exist")
    try:
        with p.open("rb") as f:
            mappable = f.read(len(ZIP_MAGIC)) == ZIP_MAGIC
        data = torch.load(p, map_location=map_location, weights_only=True, mmap=mappable)
    except Exception as e:  # pickle, zip and weights_only errors all mean "not ours"
        raise ConfigError(f"resume: {str(path)!r} is not a Rankscope checkpoint "
                          f"({type(e).__name__}: {_why(e)})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"resume: {str(path)!r} is not a Rankscope checkpoint (no "
                          f"format={FORMAT!r} key)")
    if data.get("format_version") != FORMAT_VERSION:
        raise ConfigError(f"resume: {str(path)!r} has format version "
                          f"{data.get('format_version')!r}; this engine reads {FORMAT_VERSION}")
    return data


def _why(e: Exception) -> str:
    """The first sentence of a load error, without miniz's advice paragraph; an empty file's
    EOFError has no message at all."""
    first = str(e).strip().split(". This is an internal miniz error")[0].splitlines()
    return first[0][:200] if first else "the file is empty or cut short"


def recorded_step(path: str | os.PathLike[str]) -> Any:
    """The step a checkpoint was saved at (None if it recorded none), after the checks of
    :func:`load`: what the launcher needs, read without reading the tensors (the file may be
    as large as the model and its optimizer state, and the ranks map it again anyway).

    Raises:
        ConfigError: as :func:`load`.
    """
    return load(path).get("step")


def load_into(path: str | os.PathLike[str], model: torch.nn.Module,
              optimizer: torch.optim.Optimizer, scaler: Any = None) -> dict[str, Any]:
    """Resume ``model``, ``optimizer`` and ``scaler`` (a GradScaler, or None) from the
    checkpoint at ``path``; returns the rest of it (step, epoch, step_in_epoch, rng, ...).

    The file is mapped, not read (:func:`load`): ``load_state_dict`` copies each tensor from
    the page cache straight into the existing parameters, on their device, so no rank holds a
    private copy of the checkpoint. The optimizer's state is moved to the parameters' devices
    by torch; what stays on the CPU (all of it on a CPU rank, the step counts on a GPU one)
    would still be a view of the file, so it is copied into memory of its own, and so is the
    small rest that is returned: the mapping is gone when this returns.

    Raises:
        ConfigError: as :func:`load`.
    """
    state = load(path, map_location="cpu")
    model.load_state_dict(state.pop("model"))
    optimizer.load_state_dict(state.pop("optimizer"))
    for values in optimizer.state.values():
        values.update(_owned(values))
    scaler_state = state.pop("scaler", None)
    if scaler is not None and scaler_state:
        scaler.load_state_dict(scaler_state)
    return _owned(state)


def _owned(obj: Any) -> Any:
    """``obj`` with every CPU tensor in it (in dicts, lists and tuples) copied out of the
    mapped file into memory of its own."""
    if isinstance(obj, torch.Tensor):
        return obj.clone() if obj.device.type == "cpu" else obj
    if isinstance(obj, dict):
        return {k: _owned(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_owned(v) for v in obj)
    return obj


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
