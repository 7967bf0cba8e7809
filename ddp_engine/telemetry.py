"""What rank 0 publishes: for now the metrics.jsonl record (the live socket builds on it)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ddp_engine.run_dir import METRICS_FILE


class MetricsWriter:
    """Appends one JSON object per line to RUN_DIR/metrics.jsonl, each stamped with "time".

    Each line is written whole and flushed, so a reader never sees half an object except at
    the very end while it is being written (readers skip an unterminated last line).
    """

    def __init__(self, run_dir: Path) -> None:
        self._file = open(run_dir / METRICS_FILE, "a", encoding="utf-8")

    def write(self, message: dict[str, Any]) -> dict[str, Any]:
        message = {"type": message["type"], "time": time.time(),
                   **{k: v for k, v in message.items() if k != "type"}}
        self._file.write(json.dumps(message, separators=(",", ":")) + "\n")
        self._file.flush()
        return message

    def close(self) -> None:
        self._file.close()
