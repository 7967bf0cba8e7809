"""What ``python -m ddp_engine doctor`` measured, kept in ``<runs_dir>/doctor.json`` so that the
app and the dashboard can put a run's all-reduce speed next to what the machine showed it can do
(standard library only: the app imports this).

The file is one JSON object (``schema`` 1)::

    schema          1
    time            unix time the measurement ended
    device          "cuda" or "cpu"
    backend         "nccl" or "gloo"
    world_size      processes that all-reduced (one per GPU on CUDA)
    gpus            [{"index": NVML index as nvidia-smi names it, "uuid": ..., "name": ...}],
                    in rank order; [] on CPU
    sizes           [{"size_bytes", "iterations", "time_s", "algbw_gbs", "busbw_gbs"}], one per
                    message size, smallest first; time_s is one all-reduce (mean over
                    ``iterations``, the slowest rank's)
    best_busbw_gbs  the largest busbw_gbs
    link_allows_gbs what the slowest link between the GPUs allows per direction (NVML: PCIe
                    generation and width, NVLink), or null (CPU, or unknown)
    versions        {"python", "torch", "cuda", "nccl", "driver"}: strings, null where unknown

Bandwidths are in GB/s (10^9 bytes per second) with nccl-tests' definitions (its
PERFORMANCE.md): algbw = size / time, and for an all-reduce busbw = algbw * 2(n-1)/n, which is
what each link carries and so compares with the links' speed whatever the process count.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddp_engine.common.run_dir import atomic_write_json, read_json

DOCTOR_FILE = "doctor.json"
SCHEMA = 1

GPU_SIZES = [2**20 * k for k in (1, 4, 16, 64, 256)]
"""Message sizes on GPUs: 1 MiB (latency starts to matter less) to 256 MiB (a large DDP
bucket is 25 MiB; the links are saturated well before 256 MiB)."""
CPU_SIZES = [2**10 * k for k in (64, 256, 1024, 4096, 16384)]
"""On CPU (gloo over loopback): 64 KiB to 16 MiB, a few seconds in all on two cores."""
SIZE_STARTED = "rankscope-doctor: all-reduce size"
"""Rank 0 of the measurement prints ``f"{SIZE_STARTED} {i}/{n} {size_bytes}"`` as it starts
each size: ``doctor --progress`` follows these lines in torchrun's log."""


def sizes_for(device: str) -> list[int]:
    """The message sizes measured on ``device`` ("cuda" or "cpu")."""
    return GPU_SIZES if device == "cuda" else CPU_SIZES


def busbw_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus factor, 2(n-1)/n: 0 for one process (nothing crosses a link),
    1 for two, approaching 2 for many."""
    return 2.0 * (world_size - 1) / world_size


def bandwidths_gbs(size_bytes: int, time_s: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of an all-reduce of ``size_bytes`` that took ``time_s``."""
    algbw = size_bytes / time_s / 1e9
    return algbw, algbw * busbw_factor(world_size)


@dataclass(frozen=True)
class GpuRef:
    """A GPU a measurement ran on, named as everywhere else in Rankscope."""

    index: int
    """NVML index, as nvidia-smi and ``--gpus`` name it."""
    uuid: str
    name: str


@dataclass(frozen=True)
class SizeResult:
    """All-reduces of one message size."""

    size_bytes: int
    iterations: int
    time_s: float
    """One all-reduce: the slowest rank's time for all ``iterations``, divided by them."""
    algbw_gbs: float
    busbw_gbs: float


@dataclass(frozen=True)
class DoctorResult:
    """One measurement, as doctor.json holds it (see the module docstring)."""

    time: float
    device: str
    backend: str
    world_size: int
    gpus: list[GpuRef]
    sizes: list[SizeResult]
    link_allows_gbs: float | None = None
    versions: dict[str, str | None] = field(default_factory=dict)

    @property
    def best_busbw_gbs(self) -> float:
        """The largest bus bandwidth of any size (0 when nothing was measured)."""
        return max((s.busbw_gbs for s in self.sizes), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["schema"] = SCHEMA
        data["best_busbw_gbs"] = self.best_busbw_gbs
        return data

    @classmethod
    def from_dict(cls, data: Any) -> DoctorResult:
        """The result of a doctor.json's contents.

        Raises:
            ValueError: naming the key, the value and what is allowed.
        """
        if not isinstance(data, dict):
            raise ValueError(f"doctor.json must hold a JSON object, got {type(data).__name__}")
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema: doctor.json schema {data.get('schema')!r} is not "
                             f"supported; allowed: {SCHEMA}")
        device = _choice(data, "device", ("cuda", "cpu"))
        backend = _choice(data, "backend", ("nccl", "gloo"))
        world = _number(data, "world_size", int, minimum=1)
        gpus = [GpuRef(_number(g, f"gpus[{i}].index", int, minimum=0, key="index"),
                       _text(g, f"gpus[{i}].uuid", "uuid"), _text(g, f"gpus[{i}].name", "name"))
                for i, g in enumerate(_items(data, "gpus"))]
        sizes = [SizeResult(_number(s, f"sizes[{i}].size_bytes", int, 1, "size_bytes"),
                            _number(s, f"sizes[{i}].iterations", int, 1, "iterations"),
                            _number(s, f"sizes[{i}].time_s", float, 0, "time_s"),
                            _number(s, f"sizes[{i}].algbw_gbs", float, 0, "algbw_gbs"),
                            _number(s, f"sizes[{i}].busbw_gbs", float, 0, "busbw_gbs"))
                 for i, s in enumerate(_items(data, "sizes"))]
        link = data.get("link_allows_gbs")
        versions = data.get("versions") or {}
        if not isinstance(versions, dict):
            raise ValueError(f"versions must be a JSON object, got {versions!r}")
        return cls(time=_number(data, "time", float, 0), device=device, backend=backend,
                   world_size=world, gpus=gpus, sizes=sizes,
                   link_allows_gbs=None if link is None else _number(data, "link_allows_gbs",
                                                                     float, 0),
                   versions={str(k): None if v is None else str(v) for k, v in versions.items()})


# ------------------------------------------------------------------------------- wording
def fmt_bytes(n: int) -> str:
    """A message size as doctor names it: 64 KiB, 16 MiB (bytes when not whole)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def fmt_gbs(x: float) -> str:
    """GB/s with three significant digits or more: 0.0744, 0.910, 1.90, 145.2."""
    return f"{x:.1f} GB/s" if x >= 100 else f"{x:.2f} GB/s" if x >= 1 else f"{x:#.3g} GB/s"


def fmt_time(s: float) -> str:
    """One all-reduce's time: 812.5 µs, 1.42 ms."""
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def doctor_file(runs_dir: str | os.PathLike[str]) -> Path:
    return Path(runs_dir) / DOCTOR_FILE


def write_doctor(runs_dir: str | os.PathLike[str], result: DoctorResult) -> Path:
    """Keep ``result`` as ``<runs_dir>/doctor.json`` (the folder is made; the file replaced
    whole, so a reader never sees half of it). Returns the file's path.

    Raises:
        OSError: the folder or the file cannot be written.
    """
    path = doctor_file(runs_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, result.to_dict())
    return path


def load_doctor(runs_dir: str | os.PathLike[str]) -> DoctorResult | None:
    """The last measurement kept under ``runs_dir``; None when there is none, or the file is
    unreadable or of another schema (the app then shows no machine bandwidth)."""
    data = read_json(doctor_file(runs_dir))
    if data is None:
        return None
    try:
        return DoctorResult.from_dict(data)
    except ValueError:
        return None


# ------------------------------------------------------------------------------- checks
def _items(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = data.get(key)
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise ValueError(f"{key} must be a list of JSON objects, got {items!r}")
    return items


def _choice(data: dict[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    value = data.get(key)
    if value not in allowed:
        raise ValueError(f"{key}: {value!r} is not allowed; allowed: {', '.join(allowed)}")
    return str(value)


def _text(data: dict[str, Any], name: str, key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {value!r}")
    return value


def _number(data: dict[str, Any], name: str, kind: type, minimum: float = 0,
            key: str | None = None) -> Any:
    value = data.get(name if key is None else key)
    ok = (isinstance(value, int | float) and not isinstance(value, bool)
          and math.isfinite(value) and value >= minimum
          and (kind is not int or float(value).is_integer()))
    if not ok:
        what = "an integer" if kind is int else "a finite number"
        raise ValueError(f"{name} must be {what} >= {minimum:g}, got {value!r}")
    return kind(value)
