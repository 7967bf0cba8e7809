"""Synthetic per-rank rows of a metrics message, every field filled (GPU readings included), as
the engine's rank 0 reports them; shared by bench/ingest_draw.py and bench/frame_parts.py."""

from __future__ import annotations

import math
import random
from typing import Any


def rank_rows(step: int, ranks: int, rng: random.Random) -> list[dict[str, Any]]:
    """One row per rank for report ``step``: a slowly falling loss, ~10 ms steps with 5% jitter,
    GPU utilization, memory, temperature and power with some noise."""
    rows = []
    for r in range(ranks):
        st = 0.010 * (1 + 0.05 * rng.random())
        rows.append({"rank": r, "loss": 2.3 * math.exp(-step / 2000) + 0.01 * rng.random(),
                     "samples_per_s": 64 / st, "step_time_s": st, "data_wait_s": 0.0004,
                     "forward_s": 0.002, "backward_s": 0.005, "optimizer_s": 0.001,
                     "sync_time_s": 0.003, "sync_exposed_s": 0.001, "sync_bytes": 88104,
                     "sync_buckets": 1, "gpu_util_pct": 90 + 10 * rng.random(),
                     "gpu_mem_used_bytes": 40e9 + 1e9 * rng.random(),
                     "gpu_mem_total_bytes": 80e9, "gpu_temp_c": 60 + rng.random(),
                     "gpu_power_w": 500 + 50 * rng.random(), "cpu_pct": 100.0,
                     "rss_bytes": 3e9, "device": f"cuda:{r % 8}"})
    return rows
