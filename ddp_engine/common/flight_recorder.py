"""NCCL's flight recorder, on for every NCCL run, and its dumps read into one verdict.

PyTorch's ProcessGroupNCCL keeps a ring buffer of each rank's recent collectives (what, which
sequence number, scheduled, started or completed, since when) when
``TORCH_NCCL_TRACE_BUFFER_SIZE`` (``TORCH_FR_BUFFER_SIZE`` in newer releases) is set, and with
``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` its watchdog writes the buffer, pickled, to
``<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>`` when a collective times out. The launcher sets
these for the ranks of a run on GPUs (:func:`recorder_env`; a variable the user set is left
alone), so the dumps land in the run folder as ``ranks/nccl_trace_rank_<N>``, and reads them
after a failure (:func:`read_dumps`, :func:`verdict`): "rank 1 never joined all_reduce #412;
ranks 0, 2, 3 waited in it for 120 s".

Torch-free: the dumps are read with a restricted unpickler that builds only plain containers,
strings and numbers (the format of PyTorch's own reader, torch.distributed.flight_recorder).
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DUMP_PREFIX = "nccl_trace_rank_"
BUFFER_ENTRIES = 2000
"""Collectives each rank remembers (a few steps of a large model's gradient buckets)."""
_DONE = "completed"


def recorder_env(run_dir: str | os.PathLike[str],
                 environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that turn the flight recorder on for a run's ranks, dumping on a timeout
    into ``run_dir/ranks``; those already set in ``environ`` (the launcher's) are kept as the
    user set them."""
    env = os.environ if environ is None else environ
    prefix = str(Path(run_dir) / "ranks" / DUMP_PREFIX)
    wanted = {"TORCH_NCCL_TRACE_BUFFER_SIZE": str(BUFFER_ENTRIES),
              "TORCH_FR_BUFFER_SIZE": str(BUFFER_ENTRIES),
              "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
              "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
              "TORCH_FR_DUMP_TEMP_FILE": prefix}
    return {k: v for k, v in wanted.items() if k not in env}


_PLAIN = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset")}


class _PlainUnpickler(pickle.Unpickler):
    """Builds containers, strings and numbers only: any other class a file names is refused
    (a dump names none; a file that does is not one, and must run no code)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a flight-recorder dump names {module}.{name}")


def read_dump(path: Path) -> dict[str, Any] | None:
    """One rank's dump, or None when it is missing, cut short or not a dump."""
    try:
        data = _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        return None
    data["dumped_at"] = path.stat().st_mtime
    return data


def read_dumps(run_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Every rank's dump in ``run_dir/ranks`` (by rank); empty when the recorder wrote none."""
    found: dict[int, dict[str, Any]] = {}
    for path in sorted((Path(run_dir) / "ranks").glob(f"{DUMP_PREFIX}*")):
        suffix = path.name[len(DUMP_PREFIX):]
        if suffix.isdigit():
            dump = read_dump(path)
            if dump is not None:
                found[int(suffix)] = dump
    return found


def collectives(dump: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The default process group's collectives of one dump, by sequence number (point-to-point
    operations and other groups aside: DDP's gradient all-reduces are on the default one)."""
    out: dict[int, dict[str, Any]] = {}
    for e in dump.get("entries") or []:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        group = e.get("process_group")
        name = group[0] if isinstance(group, list | tuple) and group else group
        seq = e.get("collective_seq_id")
        if str(name) == "0" and isinstance(seq, int):
            out[seq] = e
    return out


def op_name(entry: dict[str, Any]) -> str:
    """``nccl:all_reduce`` -> ``all_reduce``."""
    return str(entry.get("profiling_name") or "collective").split(":")[-1]


def _waited_s(entry: dict[str, Any], dumped_at: float) -> float | None:
    began = entry.get("time_discovered_started_ns") or entry.get("time_created_ns")
    return max(0.0, dumped_at - began / 1e9) if isinstance(began, int) and began > 0 else None


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, sorted(ranks)))}"


def verdict(dumps: dict[int, dict[str, Any]]) -> str | None:
    """One line from the ranks' dumps: the first collective some rank is stuck in, who never
    joined it, who waited in it and how long; or the ranks' disagreement on what it is. None
    when there are no dumps or nothing in them is unfinished."""
    per_rank = {r: collectives(d) for r, d in dumps.items()}
    stuck = [seq for ops in per_rank.values() for seq, e in ops.items()
             if e.get("state") != _DONE]
    if not stuck:
        return None
    seq = min(stuck)
    inside = {r: ops[seq] for r, ops in per_rank.items() if seq in ops}
    names = {r: op_name(e) for r, e in inside.items()}
    if len(set(names.values())) > 1:
        said = "; ".join(f"rank {r} in {n}" for r, n in sorted(names.items()))
        return (f"the ranks disagree on collective #{seq}: {said} (their code took different "
                "paths: each waits for a collective the others never call)")
    op = next(iter(names.values()))
    waiting = [r for r, e in inside.items() if e.get("state") != _DONE]
    absent = sorted(r for r, ops in per_rank.items()
                    if seq not in ops and max(ops, default=-1) < seq)
    waits = [w for r in waiting
             if (w := _waited_s(inside[r], float(dumps[r]["dumped_at"]))) is not None]
    how_long = f" for {max(waits):.0f} s" if waits else ""
    if absent:
        return (f"{_ranks(absent)} never joined {op} #{seq}; {_ranks(waiting)} waited in it"
                f"{how_long}")
    missing = sorted(set(range(max(dumps) + 1)) - set(dumps))
    if missing:
        return (f"{_ranks(waiting)} waited in {op} #{seq}{how_long}; no dump from "
                f"{_ranks(missing)} (that process died or hung before its watchdog wrote)")
    return (f"every rank is in {op} #{seq}{how_long} and it never completed: not a rank that "
            "stayed away but the collective itself (NCCL, the GPUs' links, a peer-to-peer "
            "setting: run python -m ddp_engine doctor)")
