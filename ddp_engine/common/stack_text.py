"""Read stack dumps (faulthandler's, py-spy's) and say where each rank stands (stdlib only).

A rank's main thread is summed up by the innermost frame of user or engine code, and by what
the library frames inside it are doing: a torch.distributed collective ("waiting for the other
ranks"), DDP's backward (its gradient all-reduce), or data loading. Ranks that stand in the
same place are grouped: "ranks 0, 2, 3: all_reduce in trainer.py:210 (waiting for the other
ranks); rank 1: data loading in my_dataset.py:57, __getitem__".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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
_OURS = re.compile(r"(^|/)(ddp_engine|rankscope)/")


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

    def is_user_code(self) -> bool:
        """The user's or the engine's own code: neither the standard library nor an installed
        package (the engine counts as ours wherever it is installed)."""
        if not self.python:
            return False
        if _OURS.search(self.file):
            return True
        return not (_STDLIB.search(self.file) or _LIBRARY.search(self.file)
                    or self.file.startswith("torch/"))  # py-spy's short names

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


def place_of(frames: list[Frame]) -> Place:
    """Where a thread stands (frames most recent first)."""
    user = next((f for f in frames if f.is_user_code()), None)
    for i, f in enumerate(frames):
        if f.in_torch("distributed") and f.func in COLLECTIVES:
            outer = next((g for g in frames[i:] if g.is_user_code()), None)
            return Place(f.func, outer, WAITING, waits=True)
    native = " ".join(f.func for f in frames if not f.python)  # py-spy --native's
    if "c10d::Reducer::" in native:  # DDP's backward, waiting for its gradient all-reduce
        return Place("backward", user, f"{WAITING} in DDP's gradient all-reduce", waits=True)
    if re.search(r"gloo::|nccl|c10d::", native):
        return Place("collective", user, WAITING, waits=True)
    if frames and frames[0].in_torch("autograd"):
        return Place("backward", user, "computing, or waiting for the other ranks in DDP's "
                     "gradient all-reduce", waits=True)
    if any(f.in_torch("utils/data") for f in frames):
        return Place("data loading", user)
    if user is not None:
        return Place(user.func, user)
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


def frames_text(frames: list[Frame], indent: str = "  ") -> str:
    """A thread's frames as faulthandler writes them (most recent call first)."""
    if not frames:
        return f"{indent}<no Python frame>"
    return "\n".join(f'{indent}File "{f.file}", line {f.line} in {f.func}' if f.python
                     else f"{indent}{f.func} ({f.file})" for f in frames)
