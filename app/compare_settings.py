"""What the Compare view says about runs, without Qt: their settings side by side (one row per
config key, the rows whose values differ flagged and first) and a line on each run's
validation loss.

The view (app/compare.py) shows these; tests call them directly, without a window.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.run_model import plural
from ddp_engine.common.config import RunConfig
from ddp_engine.common.runs import fmt_number

MISSING = "-"
"""How a value that is not there (a key missing from a run's config.json, or null) reads."""

IDENTITY_KEYS = frozenset({"run_dir"})
"""Keys that say which run it is, not how it trained: shown, never flagged as a difference
(every run has a folder of its own)."""

_FIELDS = [f.name for f in dataclasses.fields(RunConfig)]
_HELP = {f.name: str(f.metadata.get("help", "")) for f in dataclasses.fields(RunConfig)}


@dataclass(frozen=True)
class SettingRow:
    """One config key across the compared runs."""

    key: str
    """The key, nested ones flattened with dots: ``model_args.hidden``."""
    values: tuple[str, ...]
    """Each run's value as people read it (``-`` where the run has none), in the runs' order."""
    differs: bool
    """Not every run has the same value (a key missing in one run counts as null there)."""
    help: str = ""
    """What the setting means (RunConfig's help for its top-level key), for a tooltip."""


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``config`` with nested mappings spread into dotted keys: ``{"model_args": {"hidden":
    64}}`` gives ``{"model_args.hidden": 64}``. An empty mapping stays one key (its value ``{}``),
    so a setting left empty still has a row."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def format_value(value: Any) -> str:
    """A config value for people: ``-`` for null or empty, yes/no, numbers as short as they
    stay exact (``0.001``, ``3e-05``, ``120``), lists as ``0, 2``, mappings as ``k=v, ...``."""
    if value is None or value == "" or (isinstance(value, list | tuple | Mapping) and not value):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    if isinstance(value, list | tuple):
        return ", ".join(format_value(v) for v in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={format_value(v)}" for k, v in value.items())
    return str(value)


def _canonical(value: Any) -> Any:
    """A value to compare by: 1 and 1.0 are the same, true and 1 are not, {} and null are."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list | tuple):
        return tuple(_canonical(v) for v in value) or None
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _canonical(v)) for k, v in value.items())) or None
    return None if value == "" else value


def _order(key: str) -> tuple[int, str]:
    """RunConfig's field order (what to train, devices, length, ...), unknown keys after."""
    top = key.split(".", 1)[0]
    return (_FIELDS.index(top) if top in _FIELDS else len(_FIELDS), key)


def settings_rows(configs: Sequence[Mapping[str, Any] | None]) -> list[SettingRow]:
    """One row per key of any of ``configs`` (each a run's config.json, None where a run has
    none), the rows that differ first, each group in RunConfig's field order (a run's folder,
    :data:`IDENTITY_KEYS`, never counts as a difference).

    An empty nested setting (``model_args = {}``) has a row of its own only while no run fills
    it; otherwise its filled keys' rows show ``-`` for the runs that leave it empty.
    """
    flat = [flatten(c or {}) for c in configs]
    keys = {k for f in flat for k in f}
    keys = {k for k in keys if not any(other.startswith(k + ".") for other in keys)}
    rows = []
    for key in sorted(keys, key=_order):
        raw = [f.get(key) for f in flat]
        seen = {repr(_canonical(v)) for v in raw}
        rows.append(SettingRow(key, tuple(format_value(v) for v in raw),
                               len(seen) > 1 and key not in IDENTITY_KEYS,
                               _HELP.get(key.split(".", 1)[0], "")))
    return sorted(rows, key=lambda r: not r.differs)


def differences_note(rows: Sequence[SettingRow]) -> str:
    """The settings table's heading: how many settings differ."""
    n = sum(r.differs for r in rows)
    if not rows:
        return "Settings: no config.json in these runs"
    if n == 0:
        return f"Settings: all {len(rows)} the same"
    return f"Settings: {n} of {len(rows)} differ (highlighted, listed first)"


def validation_note(name: str, steps: Sequence[float], losses: Sequence[float]) -> str:
    """A run's validation loss in words: the caption under the compare charts, which also
    names the runs by their colours."""
    if not len(steps):
        return f"{name}: no evaluations, so no validation loss"
    return (f"{name}: validation loss {fmt_number(losses[-1])} at step {int(steps[-1])} "
            f"(best {fmt_number(min(losses))}, {plural(len(steps), 'evaluation')})")
