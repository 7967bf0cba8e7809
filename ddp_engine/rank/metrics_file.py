"""RUN_DIR/metrics.jsonl as rank 0's telemetry thread writes it: whole lines, numbers JSON can
hold."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ddp_engine.common.run_dir import METRICS_FILE


class MetricsWriter:
    """Appends one JSON object per line to RUN_DIR/metrics.jsonl.

    Each line is written whole and flushed, so a reader never sees half an object except at
    the very end while it is being written (readers skip an unterminated last line).
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / METRICS_FILE
        self._file = open(self.path, "a", encoding="utf-8")
        self.error: OSError | None = None

    def write_line(self, line: bytes) -> None:
        """Append and flush one line.

        Raises:
            OSError: the first time the file cannot be written (full disk), with a message
                naming it; later lines are dropped quietly, so that the failure can still be
                reported live and in the rank's own files.
        """
        if self.error is not None:
            return
        try:
            self._file.write(line.decode())
            self._file.flush()
        except OSError as e:
            self.error = e
            raise OSError(e.errno, f"{self.path} cannot be appended to ({e.strerror}): the "
                          "run's record is incomplete from here") from e

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass  # the buffered tail could not be written: already reported by write_line


def finite(value: Any) -> Any:
    """Non-finite floats (a diverged loss) become None: the protocol carries only finite JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
