"""Reading one rank's torch.profiler trace (Chrome/Perfetto JSON, maybe gzipped), torch-free:
its recorded steps, the host's events by thread, the GPU's kernels, and the collectives in it
(issue 31). :mod:`ddp_engine.common.profile_summary` reads them together.

What the traces hold (torch 2.3-2.13, checked on 2-rank gloo traces; nccl from the profiler's
documented event names):

- ``ProfilerStep#K`` (``user_annotation``) spans each recorded step on the thread that called
  ``prof.step()``: the training thread.
- A collective called from Python is a dispatcher op ``c10d::allreduce_``, ``c10d::allgather_``,
  ``c10d::_reduce_scatter_base_``, ... on the calling thread: when this rank arrived at it. With
  nccl a ``record_param_comms`` child carries its process group and sizes.
- gloo runs it on a ``pt_gloo_runloop`` thread of its process group as ``gloo:all_reduce``, ...
  (waiting for the other ranks included); nccl as ``ncclDevKernel_AllReduce...`` (or
  ``ncclKernel_...``) kernels on a GPU stream.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_engine.common.profile_files import RECORDED_KEY

Interval = tuple[float, float]
"""(start, end) in microseconds since the epoch (the trace's ``baseTimeNanoseconds`` plus its
``ts``): comparable across the ranks of a machine, and across machines as far as their clocks
agree."""

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
HOST_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "cuda_runtime",
                       "cuda_driver"})
DTYPE_BYTES = {"float": 4, "float32": 4, "c10::Half": 2, "c10::BFloat16": 2, "half": 2,
               "bfloat16": 2, "double": 8, "float64": 8, "float16": 2, "long int": 8,
               "int64": 8, "int": 4, "int32": 4, "unsigned char": 1, "uint8": 1, "bool": 1,
               "signed char": 1, "int8": 1, "Float": 4, "Half": 2, "BFloat16": 2,
               "Double": 8, "Long": 8, "Int": 4, "Byte": 1, "Bool": 1}

_KINDS = [("allreduce", "all_reduce"), ("allgather", "all_gather"),
          ("reducescatter", "reduce_scatter"), ("broadcast", "broadcast"),
          ("alltoall", "all_to_all"), ("barrier", "barrier"), ("sendrecv", "send_recv"),
          ("send", "send_recv"), ("recv", "send_recv"), ("reduce", "reduce"),
          ("gather", "gather"), ("scatter", "scatter")]
"""(a collective's name, lower-cased and without separators, kind), longer names first."""
_OP_SUFFIX = re.compile(r"(base|coalesced|tensor|intotensor|intotensorcoalesced|"
                        r"tensorcoalesced|anysource)?")
"""What an op's name adds to its collective's: ``_allgather_base_``, ``allreduce_coalesced_``."""
OURS = "rankscope::"
"""Our own collectives (the agreed-stop rounds) run inside a span of this prefix while a profile
records, so they are named apart from the script's."""


def short_name(name: str, most: int = 90) -> str:
    """A kernel's name without its ``void`` and parameter list, its templates elided when
    long: ``ncclKernel_AllReduce_RING_LL_Sum_float``."""
    name = name.removeprefix("void ")
    depth = 0
    for i, ch in enumerate(name):  # the parameter list: the first "(" outside the templates
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "(" and depth == 0 and i:
            name = name[:i]
            break
    if len(name) > most and "<" in name:
        name = name[:name.index("<")] + "<...>"
    return name if len(name) <= most else name[:most - 3] + "..."


@functools.lru_cache(maxsize=8192)  # a trace repeats a few hundred names thousands of times
def collective_kind(name: str) -> str | None:
    """all_reduce, all_gather, ... for a collective's host op, gloo span or NCCL kernel name;
    None for anything else."""
    if name.startswith("c10d::"):
        core = name[6:]
    elif name.startswith(("gloo:", "nccl:")):
        core = name[5:]
    elif name.startswith(("ncclDevKernel_", "ncclKernel_")):
        core = name.split("_", 1)[1]
    else:
        return None
    flat = core.strip("_").lower().replace("_", "").replace("-", "")
    kernel = name.startswith("nccl") and not name.startswith("nccl:")
    for prefix, kind in _KINDS:
        if flat.startswith(prefix) and (kernel or _OP_SUFFIX.fullmatch(flat[len(prefix):])):
            return kind
    return None


@dataclass
class Span:
    name: str
    """The event's name; ``cat`` its category (cpu_op, user_annotation, kernel, ...)."""
    start: float
    end: float
    tid: Any
    args: dict[str, Any]
    cat: str = ""

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass
class Call:
    """One collective as this rank called it (its host op)."""

    kind: str
    group: str
    """Its process group as nccl names it ("default_pg", "mesh_shard", or the number), "" when
    the trace does not say (gloo), "rankscope" for our own rounds."""
    arrive: float
    """When this rank called it (µs)."""
    nbytes: int | None
    before: str | None
    """The operator this rank's thread ran last before calling it."""
    seq: int | None = None
    exec_span: Interval | None = None
    """Its execution (gloo thread or NCCL kernel), when matched."""


@dataclass
class RankTrace:
    rank: int
    meta: dict[str, Any]
    steps: list[Interval]
    host: dict[Any, list[Span]]
    """Host events by thread, sorted by start."""
    main: Any
    """The training thread (the one with ProfilerStep spans)."""
    gpu: list[Span] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    execs: list[tuple[str, Span]] = field(default_factory=list)
    """(kind, span) of every collective's execution."""

    @property
    def on_gpu(self) -> bool:
        return bool(self.gpu)


def load_trace(path: Path) -> dict[str, Any]:
    """A trace file's JSON (gzipped when its name ends in .gz).

    Raises:
        ValueError: not a Chrome trace (no traceEvents list), naming the file.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (EOFError, OSError, UnicodeDecodeError, ValueError) as e:  # gzip.BadGzipFile too
        raise ValueError(f"{path} cannot be read as a trace ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path} is not a Chrome trace: it has no traceEvents list")
    return data


def read_rank(path: Path, rank: int) -> RankTrace:
    """One rank's trace, read into spans, steps and collectives."""
    data = load_trace(path)
    host: dict[Any, list[Span]] = {}
    gpu: list[Span] = []
    base = float(data.get("baseTimeNanoseconds") or 0) / 1e3  # ts counts from it: the ranks'
    for e in data["traceEvents"]:  # bases may differ (processes started apart, other hosts)
        if not isinstance(e, dict) or e.get("ph") != "X" \
                or not isinstance(e.get("ts"), (int, float)):
            continue
        start = base + float(e["ts"])
        span = Span(str(e.get("name", "")), start, start + float(e.get("dur", 0.0)),
                    e.get("tid"), e.get("args") or {}, str(e.get("cat", "")))
        if e.get("cat") in GPU_CATS:
            gpu.append(span)
        elif e.get("cat") in HOST_CATS:
            host.setdefault(span.tid, []).append(span)
    for spans in host.values():
        spans.sort(key=lambda s: (s.start, -s.end))
    gpu.sort(key=lambda s: s.start)
    step_spans = [s for spans in host.values() for s in spans
                  if s.name.startswith("ProfilerStep#")]
    if not step_spans:
        raise ValueError(f"{path} has no ProfilerStep spans: not a trace of recorded steps")
    main = step_spans[0].tid
    meta = {k: v for k, v in data.items() if k != "traceEvents"}
    step_spans = [s for s in step_spans if s.tid == main]
    if isinstance(meta.get(RECORDED_KEY), int):  # a profile cut short by the end of training
        step_spans = sorted(step_spans, key=lambda s: s.start)[:meta[RECORDED_KEY]]
    given = meta.get("distributedInfo")
    info: dict[str, Any] = given if isinstance(given, dict) else {}
    meta["distributedInfo"] = info
    if info.get("backend") in (None, "undefined") and info.get("pg_config"):
        info["backend"] = info["pg_config"][0].get("backend_config")  # "cpu:gloo,cuda:nccl"
    trace = RankTrace(rank, meta, sorted((s.start, s.end) for s in step_spans), host, main, gpu)
    _collectives(trace)
    return trace


def _collectives(t: RankTrace) -> None:
    """The collectives this rank called (host ops) and ran (gloo spans, NCCL kernels)."""
    for tid, spans in t.host.items():
        ours: list[Interval] = [(s.start, s.end) for s in spans if s.name.startswith(OURS)]
        for i, s in enumerate(spans):
            kind = collective_kind(s.name)
            if kind is None:
                continue
            if s.name.startswith("gloo:") and tid != t.main:
                t.execs.append((kind, s))
            elif s.name.startswith("c10d::"):
                params = _param_comms(spans, i)
                group = ("rankscope" if any(a <= s.start < b for a, b in ours)
                         else str(params.get("Process Group Description")
                                  or params.get("Process Group Name") or ""))
                t.calls.append(Call(kind, group, s.start, _nbytes(kind, s, params),
                                    _before(spans, i), _seq(params)))
    for k in t.gpu:
        kind = collective_kind(k.name)
        if kind is not None:
            t.execs.append((kind, k))
    t.calls.sort(key=lambda c: c.arrive)
    t.execs.sort(key=lambda ks: ks[1].start)
    _match_execs(t)


def _param_comms(spans: list[Span], i: int) -> dict[str, Any]:
    """The args of the ``record_param_comms`` inside host op ``spans[i]`` (nccl), or {}."""
    outer = spans[i]
    for s in spans[i + 1:]:
        if s.start >= outer.end:
            break
        if s.name == "record_param_comms":
            return s.args
    return {}


def _nbytes(kind: str, op: Span, params: dict[str, Any]) -> int | None:
    """A collective's size (nccl-tests' convention: all_gather's output, the others' input),
    from record_param_comms' element counts or the op's recorded shapes; None unknown."""
    dtype = params.get("dtype") or next((t for t in op.args.get("Input type", [])
                                         if t in DTYPE_BYTES), None)
    size = DTYPE_BYTES.get(str(dtype), 4) if dtype is not None else 4  # TensorList: float
    count = params.get("Out msg nelems" if kind == "all_gather" else "In msg nelems")
    if isinstance(count, (int, float)) and count > 0:
        return int(count) * size
    dims = op.args.get("Input Dims")
    if isinstance(dims, list) and dims:
        return _elements(dims[0]) * size or None
    return None


def _elements(dims: Any) -> int:
    """Elements of a recorded shape, or of a list of shapes (a TensorList)."""
    if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims:
            n *= d
        return n
    if isinstance(dims, list):
        return sum(_elements(d) for d in dims)
    return 0


def _seq(params: dict[str, Any]) -> int | None:
    for key in ("Seq", "Sequence number", "seq"):
        if isinstance(params.get(key), int):
            return int(params[key])
    return None


_COMM_PLUMBING = ("torch::distributed::reducer", "torch.distributed.ddp.reducer", "nccl:",
                  "gloo:", "cuda")
"""DDP's bucket copies, and launches: part of calling a collective, not what came before."""


BEFORE_WINDOW = 400


def _before(spans: list[Span], i: int) -> str | None:
    """The outermost operator that ended last before ``spans[i]`` started on its thread (not a
    step marker, not a collective nor what calling one takes): what this rank was doing just
    before it called it. Looks at the :data:`BEFORE_WINDOW` spans before it (linear)."""
    start = spans[i].start
    window = spans[max(0, i - BEFORE_WINDOW):i]
    plumbing = union((s.start, s.end) for s in window if s.name.startswith(_COMM_PLUMBING)
                     or collective_kind(s.name) is not None)
    starts = [a for a, _ in plumbing]

    def inside_plumbing(s: Span) -> bool:
        k = bisect.bisect_right(starts, s.start) - 1
        return k >= 0 and s.end <= plumbing[k][1]

    done = [s for s in window if s.end <= start and not s.name.startswith("ProfilerStep#")
            and s.name != "record_param_comms" and not inside_plumbing(s)]
    if not done:
        return None
    latest = max(done, key=lambda s: s.end)
    return min((s for s in done if s.start <= latest.start and s.end >= latest.end),
               key=lambda s: s.start).name


def _match_execs(t: RankTrace) -> None:
    """Each call gets the first unmatched execution of its kind that started after it (gloo
    starts a collective on its thread when called; a kernel runs once launched)."""
    slack_us = 50.0
    free: dict[str, list[Span]] = {}
    for kind, s in t.execs:
        free.setdefault(kind, []).append(s)
    for c in t.calls:
        _take(c, free.get(c.kind, []), slack_us)
    # gloo has no reduce_scatter of its own: it runs one as an all_reduce (the same for other
    # collectives a backend emulates): what is left is matched whatever its name
    left = sorted((s for queue in free.values() for s in queue), key=lambda s: s.start)
    for c in t.calls:
        if c.exec_span is None:
            _take(c, left, slack_us)


def _take(c: Call, queue: list[Span], slack_us: float) -> None:
    for j, s in enumerate(queue):
        if s.start >= c.arrive - slack_us:
            c.exec_span = (s.start, s.end)
            del queue[j]
            return


# ------------------------------------------------------------------------------ intervals
def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, merged, non-empty intervals."""
    out: list[list[float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersect(x: list[Interval], y: list[Interval]) -> list[Interval]:
    """Both merged (see :func:`union`)."""
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(x: list[Interval], y: list[Interval]) -> list[Interval]:
    """``x`` without ``y`` (both merged)."""
    out: list[Interval] = []
    j = 0
    for a, b in x:
        cur = a
        while j < len(y) and y[j][1] <= cur:
            j += 1
        k = j
        while k < len(y) and y[k][0] < b:
            if y[k][0] > cur:
                out.append((cur, y[k][0]))
            cur = max(cur, y[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out
