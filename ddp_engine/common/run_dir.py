"""The run directory: the durable record of a run (standard library only).

Layout::

    RUN_DIR/config.json      the fully resolved RunConfig
    RUN_DIR/status.json      state, step, epoch, pids, per-rank exit codes, failure reason
    RUN_DIR/metrics.jsonl    one JSON object per line ("type", "time", ...), written by rank 0
    RUN_DIR/ranks/rank-N.json  what rank N reports about itself (pid, final state, step)
    RUN_DIR/logs/            torchrun's per-rank logs (<id>/attempt_0/<rank>/stderr.log)
    RUN_DIR/checkpoints/     last.pt and, if configured, step-N.pt

status.json has a single writer, the launcher; rank files have one writer each.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

STATES = ("starting", "running", "stopping", "completed", "stopped", "failed")
FINAL_STATES = ("completed", "stopped", "failed")

CONFIG_FILE = "config.json"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object], *,
                 sole_writer: bool = False, durable: bool = False, sync: bool = True) -> None:
    """Write a file so that readers see the old or the new one, never a torn one.

    ``write`` fills a temporary file in the same folder (``.NAME.XXXX.tmp``), which is fsynced
    (unless ``sync`` is False: a snapshot soon rewritten, which a power cut may leave empty)
    and renamed over ``path``; on any error the temporary file is removed. A SIGKILL cannot run
    that cleanup, so with ``sole_writer`` (nobody else ever writes ``path``) temporary files that
    an earlier, killed write of ``path`` left are removed first: they cannot accumulate.
    ``durable`` also fsyncs the folder, so that the rename survives a power cut.
    """
    p = Path(path)
    if sole_writer:
        remove_partial_writes(p.parent, p.name)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, p)
        if durable:
            dir_fd = os.open(p.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def remove_partial_writes(folder: str | os.PathLike[str], name: str = "*") -> list[Path]:
    """Remove the temporary files of interrupted :func:`atomic_write` calls for ``name`` (all
    names by default) in ``folder``. Only safe when no write of those files is in progress."""
    removed = []
    for tmp in Path(folder).glob(f".{name}.*.tmp"):
        try:
            tmp.unlink()
            removed.append(tmp)
        except OSError:
            pass
    return removed


def atomic_write_text(path: str | os.PathLike[str], text: str, *, sync: bool = True) -> None:
    """:func:`atomic_write` of a UTF-8 text."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")), sync=sync)


def atomic_write_json(path: str | os.PathLike[str], data: Any, *, sync: bool = True) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n", sync=sync)


def read_json(path: str | os.PathLike[str]) -> Any | None:
    """The parsed file, or None when it is missing or (being replaced) unreadable."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_status(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    data = read_json(Path(run_dir) / STATUS_FILE)
    return data if isinstance(data, dict) else None


def rank_file(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / "ranks" / f"rank-{rank}.json"


def read_rank_files(run_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Every ``ranks/rank-N.json`` that parses, by rank."""
    out: dict[int, dict[str, Any]] = {}
    folder = Path(run_dir) / "ranks"
    if not folder.is_dir():
        return out
    for p in folder.glob("rank-*.json"):
        data = read_json(p)
        if isinstance(data, dict) and isinstance(data.get("rank"), int):
            out[data["rank"]] = data
    return out


def rank_log_files(run_dir: str | os.PathLike[str]) -> dict[int, Path]:
    """Each rank's log (torchrun's stderr.log of the newest attempt), by rank as the run
    numbers it: torchrun names them by local rank, so a node K's folder (its config.json)
    starts at rank K * nproc."""
    cfg = read_json(Path(run_dir) / CONFIG_FILE)
    node, nproc = (cfg.get("node_rank"), cfg.get("nproc")) if isinstance(cfg, dict) else (0, 0)
    first = node * nproc if isinstance(node, int) and isinstance(nproc, int) else 0
    out: dict[int, tuple[float, Path]] = {}
    for p in (Path(run_dir) / "logs").glob("*/attempt_*/*/stderr.log"):
        try:
            rank = first + int(p.parent.name)
            mtime = p.stat().st_mtime
        except (ValueError, OSError):
            continue
        if rank not in out or mtime > out[rank][0]:
            out[rank] = (mtime, p)
    return {rank: p for rank, (_, p) in sorted(out.items())}


def tail_lines(path: str | os.PathLike[str], n: int = 20, max_bytes: int = 64 * 1024) -> list[str]:
    """The last ``n`` lines of a text file (empty if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return data.splitlines()[-n:]


def failed_rank_log(run_dir: str | os.PathLike[str], status: dict[str, Any],
                    n: int = 20) -> tuple[int | None, Path | None, list[str]]:
    """The log to show for a failed run: the root-cause rank's (else the first failed rank's,
    else rank 0's), as (rank, path, its last ``n`` lines)."""
    logs = rank_log_files(run_dir)
    failed = [int(r) for r in (status.get("ranks") or {})] or sorted(logs)
    rank = status.get("root_rank", failed[0] if failed else None)
    if rank not in logs:
        return rank, None, []
    return rank, logs[rank], tail_lines(logs[rank], n)


def iter_metrics(run_dir: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every complete JSON line of metrics.jsonl (a partly written last line is skipped)."""
    path = Path(run_dir) / METRICS_FILE
    try:
        f = open(path, encoding="utf-8")
    except OSError:
        return
    with f:
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                yield obj


class MetricsTail:
    """Follows metrics.jsonl as it grows: ``poll()`` returns the complete lines added since."""

    def __init__(self, run_dir: str | os.PathLike[str], from_end: bool = False) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self._offset = 0
        if from_end:  # follow only what is appended from now on
            try:
                self._offset = self.path.stat().st_size
            except OSError:
                pass
        self._partial = b""
        self.at_end = False
        """Whether the last poll read up to the end of the file (as it was then)."""

    def poll(self, max_bytes: int = -1) -> list[dict[str, Any]]:
        """The complete lines appended since the last poll (at most ``max_bytes`` read)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(max_bytes)
                self.at_end = max_bytes < 0 or len(data) < max_bytes
        except OSError:
            self.at_end = True
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out


def new_run_dir(runs_dir: str | os.PathLike[str], name: str) -> Path:
    """Create ``runs_dir/<name>-<YYYYmmdd-HHMMSS>`` (with a suffix if that exists)."""
    parent = Path(runs_dir)
    parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        candidate = parent / (f"{name}-{stamp}" + (f"-{i}" if i else ""))
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"runs_dir: no free run folder name under {parent}")


def prepare_run_dir(path: str | os.PathLike[str]) -> Path:
    """Create the run folder and its sub-folders; keep what a previous run left."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    for sub in ("ranks", "logs", "checkpoints"):
        (p / sub).mkdir(exist_ok=True)
    return p
