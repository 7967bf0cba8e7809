"""A failure's reason on one line (standard library only).

An exception's text can be kilobytes: gloo's and pybind11's "At:" dumps of Python frames, c10's
"Exception raised from ... frame #N:" backtraces, a whole traceback, or a long message of the
user's own. A run's reason (status.json, the launcher's last line, the app) is its first
meaningful line, cut to :data:`REASON_CHARS`; the whole text stays in the rank's log, which
:func:`error_reason` names when it shortened anything.
"""

from __future__ import annotations

import os
import re

REASON_CHARS = 400
"""The longest exception text a reason quotes; a longer one is cut and ends with "…" (room
for Rankscope's own one-line errors, which name files: a full disk's CheckpointError)."""

_DUMP_START = re.compile(r"^\s*(At:\s*$|Exception raised from |frame #\d+: )")
"""Where a dump of frames starts (pybind11/gloo's "At:", c10's backtrace): nothing after it
is meaningful."""
_FRAME_LINE = re.compile(r"^\s+(\S.*\(\d+\): \S+|File \".*\", line \d+.*)\s*$")
"""One frame of such a dump ("  /path/file.py(108): done"), or of a traceback."""
_TRACEBACK = "Traceback (most recent call last):"
_BARE_TYPE = re.compile(r"^[\w.]+:$")
"""An exception type whose message starts on the next line ("RuntimeError:")."""
_CALLBACK = re.compile(r"^[\w.]+: Got the following error when running the callback: (?=\w)")
"""torch's wrapper of an error raised in a Future's callback (a DDP comm hook's): the error
inside it is the one to tell."""


def _meaningful(text: str) -> list[str]:
    """The lines of ``text`` that say something: no blank lines, frames or frame dumps; for a
    traceback, its exception lines (last first)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and lines[0].strip() == _TRACEBACK:
        said = [line.strip() for line in lines if not line[0].isspace()
                and line.strip() != _TRACEBACK and not line.startswith(("During handling",
                                                                        "The above exception"))]
        return said[::-1]
    kept = []
    for line in lines:
        if _DUMP_START.match(line):
            break
        if not _FRAME_LINE.match(line):
            kept.append(line.strip())
    return kept


def one_line(text: object, limit: int = REASON_CHARS) -> str:
    """``text`` as one line: its first meaningful line (an exception's ``Type: message``),
    without frame dumps, whitespace collapsed, cut to ``limit`` characters ending with "…"."""
    lines = _meaningful(str(text or ""))
    if not lines:
        return ""
    first = lines[0]
    if _BARE_TYPE.match(first) and len(lines) > 1:
        first = f"{first} {lines[1]}"
    first = _CALLBACK.sub("", " ".join(first.split()))
    return first if len(first) <= limit else first[:limit - 1].rstrip() + "…"


def is_one_line(text: object, limit: int = REASON_CHARS) -> bool:
    """Whether ``text`` is already its own :func:`one_line` (nothing would be left out)."""
    whole = " ".join(str(text or "").split())
    return one_line(text, limit) == whole


def error_reason(text: object, log: str | os.PathLike[str] | None = None,
                 limit: int = REASON_CHARS) -> str:
    """An exception's text as a reason: :func:`one_line`, and, when that left something out,
    where the whole text is (``log``, the rank's log)."""
    line = one_line(text, limit) or "no error text"
    if log is not None and not is_one_line(text, limit):
        line += f" (the whole text is in {os.fspath(log)})"
    return line
