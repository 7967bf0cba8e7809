"""Read stack dumps (faulthandler's, py-spy's) and say where each rank stands (stdlib only).

A rank's main thread is summed up by its innermost frame of the user's own code (a script, a
plugin: any file that is neither Rankscope's, by path, nor the standard library's nor an
installed package's), else, in a built-in run, of Rankscope's own code (``trainer.py``), and by
what the frames inside it are doing: a torch.distributed collective ("waiting for the other
ranks"), DDP's backward (its gradient all-reduce), or data loading. Ranks that stand in the
same place are grouped: "ranks 0, 2, 3: all_reduce in trainer.py:210 (waiting for the other
ranks); rank 1: data loading in my_dataset.py:57, __getitem__". In a script run the stack
text folds Rankscope's own frames ("... 3 Rankscope frames ...").
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "barrier", "monitored_barrier", "broadcast",
    "broadcast_object_list", "all_gather", "all_gather_object", "all_gather_into_tensor",
    "_all_gather_base", "all_gather_coalesced", "gather", "gather_object", "scatter",
    "scatter_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "_reduce_scatter_base", "all_to_all", "all_to_all_single", "send", "recv",
    "batch_isend_irecv", "wait", "wait_tensor", "_store_based_barrier"})
"""torch.distributed functions (and Work/Future waits) in which a rank waits for the others."""
WAITING = "waiting for the other ranks"

_FAULTHANDLER_THREAD = re.compile(r"^(?P<current>Current thread|Thread) "
                                  r"(?P<ident>0x[0-9a-fA-F]+)[^(]*\(most recent call first\):")
_FAULTHANDLER_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_PY_SPY_THREAD = re.compile(
    r'^Thread (?P<ident>0x[0-9a-fA-F]+|\d+) \((?P<status>[^)]*)\)(?:: "(?P<name>.*)")?')
_PY_SPY_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_STDLIB = re.compile(r"(^<frozen |/lib/python3\.\d+/(?!.*(site|dist)-packages/))")
_LIBRARY = re.compile(r"/(site|dist)-packages/")

USER, RANKSCOPE, LIBRARY, NATIVE = "user", "rankscope", "library", "native"
"""A frame's origin (:attr:`Frame.origin`)."""


def _package_dirs() -> tuple[Path, ...]:
    """The folders of Rankscope's own packages in this install: ddp_engine and rankscope."""
    engine = Path(__file__).resolve().parents[1]
    dirs = [engine]
    try:
        spec = importlib.util.find_spec("rankscope")  # finds it without importing it
    except (ImportError, ValueError):
        spec = None
    found = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    dirs += [p.resolve() for p in found] or [engine.parent / "rankscope"]
    return tuple(dirs)


PACKAGE_DIRS = _package_dirs()


@functools.lru_cache(maxsize=4096)
def is_rankscope_file(file: str) -> bool:
    """Whether ``file`` is one of Rankscope's own modules: under this install's ddp_engine or
    rankscope folder, or (a dump written by another copy of Rankscope) a path ending in
    ``ddp_engine/<part>`` or ``rankscope/<part>`` where this install has that module. A
    user's folder that is merely named so (``tests/ddp_engine/my_script.py``) is not."""
    if not file or file.startswith("<"):
        return False
    path = Path(file)
    if path.is_absolute():
        real = Path(os.path.realpath(file))
        if any(real.is_relative_to(d) for d in PACKAGE_DIRS):
            return True
    parts = path.parts
    for d in PACKAGE_DIRS:
        for i, part in enumerate(parts[:-1]):
            if part == d.name and d.joinpath(*parts[i + 1:]).is_file():
                return True
    return False


@dataclass(frozen=True)
class Frame:
    file: str
    line: int | None
    func: str

    @property
    def python(self) -> bool:
        """A Python frame (py-spy --native also lists C/C++ frames, by library)."""
        return self.line is not None and (self.file.endswith(".py") or self.file.startswith("<"))

    @property
    def short(self) -> str:
        """file:line with the file's base name (trainer.py:210)."""
        name = self.file.rsplit("/", 1)[-1]
        return f"{name}:{self.line}" if self.line is not None else name

    @property
    def origin(self) -> str:
        """Whose code: USER (a script, a plugin), RANKSCOPE (ddp_engine, rankscope, wherever
        installed), LIBRARY (the standard library, installed packages) or NATIVE (C/C++)."""
        if not self.python:
            return NATIVE
        if is_rankscope_file(self.file):
            return RANKSCOPE
        if (_STDLIB.search(self.file) or _LIBRARY.search(self.file)
                or self.file.startswith("torch/")):  # py-spy's short names
            return LIBRARY
        return USER

    def is_user_code(self) -> bool:
        """The user's own code: neither Rankscope's nor a library's."""
        return self.origin == USER

    def in_torch(self, part: str) -> bool:
        """In torch's ``part`` package (e.g. "distributed", "autograd", "utils/data")."""
        return f"torch/{part}/" in self.file


@dataclass
class ThreadStack:
    ident: str
    current: bool = False
    """The thread that ran faulthandler's signal handler (usually the main thread)."""
    name: str | None = None
    frames: list[Frame] = field(default_factory=list)
    """Most recent call first."""


@dataclass(frozen=True)
class Place:
    """Where a rank's main thread stands, in words."""

    what: str
    frame: Frame | None
    note: str = ""
    waits: bool = False
    """In a collective (or DDP's backward), i.e. possibly waiting for the others."""

    def text(self) -> str:
        where = f" in {self.frame.short}" if self.frame is not None else ""
        func = (f", {self.frame.func}" if self.frame is not None and self.what in (
            "data loading",) else "")
        note = f" ({self.note})" if self.note else ""
        return f"{self.what}{where}{func}{note}"


def parse_faulthandler(text: str) -> list[ThreadStack]:
    """The threads of one faulthandler dump (``all_threads=True``)."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        m = _FAULTHANDLER_THREAD.match(line)
        if m:
            threads.append(ThreadStack(m["ident"].lower(), m["current"] == "Current thread"))
            continue
        m = _FAULTHANDLER_FRAME.match(line)
        if m and threads:
            threads[-1].frames.append(Frame(m["file"], int(m["line"]), m["func"]))
    return threads


def parse_py_spy(text: str) -> list[ThreadStack]:
    """The threads of ``py-spy dump`` (with or without ``--native``)."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        m = _PY_SPY_THREAD.match(line)
        if m:
            threads.append(ThreadStack(m["ident"].lower(), name=m["name"]))
            continue
        m = _PY_SPY_FRAME.match(line)
        if m and threads and not line.lstrip().startswith("Python v"):
            line_no = int(m["line"]) if m["line"] else None
            threads[-1].frames.append(Frame(m["file"], line_no, m["func"]))
    return threads


def main_thread(threads: list[ThreadStack], ident: int | None = None) -> ThreadStack | None:
    """The main thread: by its ident (a rank writes it in its rank file), by name (py-spy),
    else the thread that is not a ``threading`` thread, preferring the one that handled the
    signal."""
    if ident is not None:
        for t in threads:
            if t.ident in (f"0x{ident:016x}", f"0x{ident:x}", str(ident)):
                return t
    for t in threads:
        if t.name == "MainThread":
            return t
    started = [t for t in threads
               if not (t.frames and t.frames[-1].func in ("_bootstrap", "_bootstrap_inner"))]
    for t in sorted(started, key=lambda t: not t.current):
        return t
    return threads[0] if threads else None


def _innermost(frames: list[Frame]) -> Frame | None:
    """The innermost frame of the user's code, else of Rankscope's (a built-in run's)."""
    return (next((f for f in frames if f.origin == USER), None)
            or next((f for f in frames if f.origin == RANKSCOPE), None))


def _by_rankscope(frames: list[Frame], outer: Frame | None) -> str:
    """", in Rankscope's FUNC (FILE)" when Rankscope's code stands between the user's frame
    ``outer`` and the top of ``frames`` (the user's line called into it); else ""."""
    if outer is None or outer.origin != USER:
        return ""
    ours = next((f for f in frames[:frames.index(outer)] if f.origin == RANKSCOPE), None)
    return f", in Rankscope's {ours.func} ({ours.short})" if ours is not None else ""


def place_of(frames: list[Frame]) -> Place:
    """Where a thread stands (frames most recent first), named by its innermost frame of the
    user's code (Rankscope's own frames are skipped, unless no user frame is on the stack)."""
    anchor = _innermost(frames)
    for i, f in enumerate(frames):
        if f.in_torch("distributed") and f.func in COLLECTIVES:
            outer = _innermost(frames[i:])
            between = frames[i:frames.index(outer, i)] if outer is not None else frames[i:]
            if any(g.in_torch("autograd") for g in between) and any(
                    g.origin == RANKSCOPE or "ddp_comm_hooks" in g.file for g in between):
                # DDP's comm hook (Rankscope's timing hook, or torch's) inside backward
                return Place("backward", outer, f"{WAITING} in DDP's gradient all-reduce",
                             waits=True)
            return Place(f.func, outer, WAITING + _by_rankscope(frames[i:], outer), waits=True)
    native = " ".join(f.func for f in frames if not f.python)  # py-spy --native's
    if "c10d::Reducer::" in native:  # DDP's backward, waiting for its gradient all-reduce
        return Place("backward", anchor, f"{WAITING} in DDP's gradient all-reduce", waits=True)
    if re.search(r"gloo::|nccl|c10d::", native):
        return Place("collective", anchor, WAITING + _by_rankscope(frames, anchor), waits=True)
    if frames and frames[0].in_torch("autograd"):
        return Place("backward", anchor, "computing, or waiting for the other ranks in DDP's "
                     "gradient all-reduce", waits=True)
    if any(f.in_torch("utils/data") for f in frames):
        return Place("data loading", anchor)
    if anchor is not None:
        return Place(anchor.func, anchor, _by_rankscope(frames, anchor).removeprefix(", "))
    if frames:
        return Place(frames[0].func, frames[0], "library code")
    return Place("no Python frame", None, "in C code, or between Python calls")


def group(places: dict[int, Place]) -> list[tuple[list[int], Place]]:
    """Ranks by where they stand, in rank order of each group's first rank. When some ranks
    wait in DDP's backward while others are outside any collective, the waiting is certain
    (the all-reduce cannot finish without them): the note says so."""
    outside = any(not p.waits for p in places.values())
    groups: dict[str, tuple[list[int], Place]] = {}
    for rank in sorted(places):
        place = places[rank]
        if place.what == "backward" and outside:
            place = Place("backward", place.frame, f"{WAITING} in DDP's gradient all-reduce",
                          waits=True)
        groups.setdefault(place.text(), ([], place))[0].append(rank)
    return list(groups.values())


def ranks_text(ranks: list[int]) -> str:
    """ "rank 1" or "ranks 0, 2, 3"."""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def summary_line(groups: list[tuple[list[int], Place]]) -> str:
    """The groups in one line: "ranks 0, 2: all_reduce in trainer.py:210 (...); rank 1: ..."."""
    return "; ".join(f"{ranks_text(ranks)}: {place.text()}" for ranks, place in groups)


def verdict(groups: list[tuple[list[int], Place]]) -> str | None:
    """Which ranks the others wait for, when some wait in a collective and some do not."""
    outside = sorted(r for ranks, place in groups if not place.waits for r in ranks)
    if not outside or len(outside) == sum(len(ranks) for ranks, _ in groups):
        return None
    return (f"{ranks_text(outside)} {'is' if len(outside) == 1 else 'are'} outside any "
            "collective while the others wait: look there first")


def frames_text(frames: list[Frame], indent: str = "  ", fold: bool = False) -> str:
    """A thread's frames as faulthandler writes them (most recent call first). ``fold`` (a
    script run): each run of Rankscope's own frames is one line, "... 3 Rankscope frames ..."."""
    if not frames:
        return f"{indent}<no Python frame>"
    lines: list[str] = []
    folded = 0
    for f in [*frames, None]:
        if fold and f is not None and f.origin == RANKSCOPE:
            folded += 1
            continue
        if folded:
            lines.append(f"{indent}... {folded} Rankscope frame{'s' if folded > 1 else ''} ...")
            folded = 0
        if f is not None:
            lines.append(f'{indent}File "{f.file}", line {f.line} in {f.func}' if f.python
                         else f"{indent}{f.func} ({f.file})")
    return "\n".join(lines)
