"""The reading of a profile, done for the user (issue 31), torch-free: every rank's trace in a
profile folder read together into ``summary.json``.

Per rank, each recorded step is split into parts that add up to it, on the timeline that does
the work: the GPU's on CUDA runs, the training thread's on CPU runs.

- ``compute``: kernels (GPU) or operators (CPU) that are neither of the others;
- ``optimizer``: work inside ``Optimizer.step`` / ``zero_grad`` (on the GPU: the kernels they
  launched);
- ``data``: the training thread inside the DataLoader's ``__next__`` (on the GPU: idle time while
  it was there);
- ``comm_exposed``: communication that nothing else overlaps (NCCL kernels with no compute
  kernel beside them; on CPU the thread inside a collective call, or waiting while one runs);
- ``idle`` (GPU) or ``waiting`` (CPU): the rest, time in which nothing ran.

Besides: ``comm`` (all the communication, overlapped or not) and the share overlapped; the top
operators by self time; per collective kind and process group the calls, bytes, time, exposed
time; per call the rank that arrived last and by how much; bus bandwidth against doctor's.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from ddp_engine.common.doctor_result import load_doctor
from ddp_engine.common.profile_files import SUMMARY_FILE, errors, traces
from ddp_engine.common.profile_trace import (
    Interval,
    RankTrace,
    Span,
    collective_kind,
    intersect,
    length,
    read_rank,
    short_name,
    subtract,
    union,
)
from ddp_engine.common.run_dir import atomic_write_json

SCHEMA = 1
PARTS = ("compute", "optimizer", "data", "comm_exposed", "idle")
"""The step's parts, in the order they are shown; "idle" is "waiting" on CPU timelines."""
TOP_OPS = 10
BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
               "reduce": lambda n: 1.0}
"""nccl-tests' PERFORMANCE.md: busbw = algbw x factor(n)."""


def summarize(folder: Path, doctor_dir: Path | None = None) -> dict[str, Any]:
    """Read every trace in ``folder``; ``doctor_dir`` holds doctor.json (default: the runs
    folder, two levels above a run's profile folder's parent).

    Raises:
        ValueError: no rank has a trace here (each rank's reason is named).
    """
    found, why = traces(folder), errors(folder)
    if not found:
        raise ValueError(f"no rank's trace in {folder}" + "".join(
            f"; rank {r}: {w}" for r, w in why.items()))
    ranks = [read_rank(path, rank) for rank, path in found.items()]
    world = max([int(t.meta.get("distributedInfo", {}).get("world_size") or 0) for t in ranks]
                + [len(ranks)])
    parts_and_busy = [_rank_parts(t) for t in ranks]
    per_rank = [parts for parts, _ in parts_and_busy]
    busy = {t.rank: b for t, (_, b) in zip(ranks, parts_and_busy, strict=True)}
    calls = _calls_across(ranks)
    summary: dict[str, Any] = {
        "schema": SCHEMA,
        "folder": str(folder),
        "ranks": [t.rank for t in ranks],
        "missing": {str(r): w for r, w in why.items()},
        "world_size": world,
        "backend": ranks[0].meta.get("distributedInfo", {}).get("backend"),
        "timeline": "gpu" if ranks[0].on_gpu else "cpu",
        "steps": min(len(t.steps) for t in ranks),
        "first_step": ranks[0].meta.get("rankscope", {}).get("first_step"),
        "step_time_ms": _r(statistics.fmean(p["step_time_ms"] for p in per_rank)),
        "per_rank": per_rank,
        "collectives": _collective_table(ranks, calls, busy),
        "last_to_arrive": _last_to_arrive(calls, [t.rank for t in ranks]),
        "bandwidth": _bandwidth(calls, world, ranks[0], doctor_dir or folder.parent.parent.parent),
    }
    return summary


def write_summary(folder: Path, doctor_dir: Path | None = None) -> dict[str, Any]:
    """:func:`summarize` into ``folder/summary.json`` (written whole or not at all)."""
    summary = summarize(folder, doctor_dir)
    atomic_write_json(folder / SUMMARY_FILE, summary)
    return summary


# ------------------------------------------------------------------------- one rank's step
def _rank_parts(t: RankTrace) -> tuple[dict[str, Any], list[Interval]]:
    """One rank's step in parts, and the time compute ran: what overlaps communication, for
    the rank's overlapped share and each collective's exposed time alike (kernels other than
    NCCL's on the GPU; on CPU operators outside the collective calls and the DataLoader)."""
    steps = union(t.steps)
    main = t.host.get(t.main, [])
    data = _spans_union(main, steps, lambda s: s.name.startswith("enumerate(DataLoader)"))
    opt = _spans_union(main, steps, lambda s: s.name.startswith("Optimizer."))
    comm = union(clip for _, s in t.execs if s.cat == "kernel" or not t.on_gpu  # on GPUs the
                 for clip in intersect([(s.start, s.end)], steps))  # kernels, not gloo's
    if t.on_gpu:
        parts, compute_busy = _gpu_parts(t, steps, data, opt, comm)
    else:
        parts, compute_busy = _cpu_parts(t, steps, main, data, opt, comm)
    step_us = length(steps) / max(len(t.steps), 1)
    per_step = {k: _r(v / len(t.steps) / 1e3) for k, v in parts.items()}
    comm_us = length(comm)
    exposed_comm = length(subtract(comm, compute_busy))
    return {
        "rank": t.rank,
        "timeline": "gpu" if t.on_gpu else "cpu",
        "step_time_ms": _r(step_us / 1e3),
        "parts_ms": per_step,
        "parts_sum_ms": _r(sum(per_step.values())),
        "comm_ms": _r(comm_us / len(t.steps) / 1e3),
        "comm_overlapped_share": _r(1 - exposed_comm / comm_us, 3) if comm_us else None,
        "top_ops": _top_ops(t, steps),
    }, compute_busy


def _cpu_parts(t: RankTrace, steps: list[Interval], main: list[Span], data: list[Interval],
               opt: list[Interval], comm: list[Interval],
               ) -> tuple[dict[str, float], list[Interval]]:
    """The training thread's time: each instant goes to the first part that claims it."""
    host_comm = _spans_union(main, steps, lambda s: collective_kind(s.name) is not None)
    busy = _spans_union(main, steps, lambda s: s.cat == "cpu_op")  # the operators themselves:
    # a framework's annotations (DDP's forward, FSDP's all_gather) hold their waits too
    taken: list[Interval] = []
    parts: dict[str, float] = {}
    for name, claim in (("data", data), ("optimizer", opt), ("host_comm", host_comm),
                        ("compute", busy)):
        mine = subtract(claim, taken)
        parts[name] = length(mine)
        taken = union(taken + mine)
    gap = subtract(steps, taken)
    parts["comm_exposed"] = parts.pop("host_comm") + length(intersect(gap, comm))
    parts["idle"] = length(subtract(gap, comm))
    compute_busy = subtract(busy, union(host_comm + data))
    return {k: parts[k] for k in PARTS}, compute_busy


def _gpu_parts(t: RankTrace, steps: list[Interval], data: list[Interval], opt: list[Interval],
               comm: list[Interval]) -> tuple[dict[str, float], list[Interval]]:
    """The GPU's time: NCCL kernels against the others; the optimizer's kernels by the host
    span that launched them (the kernels' ``correlation`` with the runtime's launch)."""
    launches = {s.args.get("correlation"): s.start for spans in t.host.values() for s in spans
                if "correlation" in s.args}
    opt_k: list[Interval] = []
    compute_k: list[Interval] = []
    for k in t.gpu:
        if collective_kind(k.name) is not None:
            continue
        launched = launches.get(k.args.get("correlation"))
        in_opt = launched is not None and any(a <= launched < b for a, b in opt)
        (opt_k if in_opt else compute_k).append((k.start, k.end))
    optimizer = intersect(union(opt_k), steps)
    compute = subtract(intersect(union(compute_k), steps), optimizer)
    busy = union(optimizer + compute)
    exposed = subtract(comm, busy)
    gap = subtract(steps, union(busy + comm))
    parts = {"compute": length(compute), "optimizer": length(optimizer),
             "data": length(intersect(gap, data)), "comm_exposed": length(exposed),
             "idle": length(subtract(gap, data))}
    return parts, busy


def _spans_union(spans: list[Span], steps: list[Interval], keep: Any) -> list[Interval]:
    return intersect(union((s.start, s.end) for s in spans if keep(s)), steps)


def _top_ops(t: RankTrace, steps: list[Interval]) -> list[dict[str, Any]]:
    """Operators (kernels on the GPU) by self time per step, inside the recorded steps."""
    self_us: dict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    n = max(len(t.steps), 1)
    if t.on_gpu:
        for k in t.gpu:
            inside = length(intersect([(k.start, k.end)], steps))
            self_us[short_name(k.name)] += inside
            count[short_name(k.name)] += 1 if inside else 0
    else:
        spans = [s for s in t.host.get(t.main, []) if not s.name.startswith("ProfilerStep#")
                 and length(intersect([(s.start, s.end)], steps)) > 0]
        stack: list[tuple[Span, list[float]]] = []  # (span, [its children's time])
        for s in spans + [Span("", float("inf"), float("inf"), None, {})]:
            while stack and stack[-1][0].end <= s.start:
                done, kids = stack.pop()
                self_us[done.name] += max(done.dur - kids[0], 0.0)
                count[done.name] += 1
                if stack:
                    stack[-1][1][0] += done.dur
            if s.name:
                stack.append((s, [0.0]))
    return [{"name": name, "self_ms": _r(us / n / 1e3), "calls_per_step": _r(count[name] / n, 2)}
            for name, us in sorted(self_us.items(), key=lambda kv: -kv[1])[:TOP_OPS] if us > 0]


# --------------------------------------------------------------------- across the ranks
def _calls_across(ranks: list[RankTrace]) -> dict[tuple[str, str], list[list[Any]]]:
    """Per (group, kind): the i-th call of every rank together (rank order), where every rank
    made the same number of calls of it (they are the same collectives, in order); else []."""
    by: dict[tuple[str, str], dict[int, list[Any]]] = defaultdict(dict)
    for t in ranks:
        for c in t.calls:
            by[(c.group, c.kind)].setdefault(t.rank, []).append(c)
    out: dict[tuple[str, str], list[list[Any]]] = {}
    for key, per in by.items():
        counts = {len(v) for v in per.values()}
        if len(per) == len(ranks) > 1 and len(counts) == 1:
            out[key] = [list(row) for row in zip(*(per[t.rank] for t in ranks), strict=True)]
        else:
            out[key] = []
    return out


def _collective_table(ranks: list[RankTrace], calls: dict[tuple[str, str], list[list[Any]]],
                      busy: dict[int, list[Interval]]) -> list[dict[str, Any]]:
    """Per collective kind and group; ``busy``: each rank's compute (:func:`_rank_parts`),
    which a call's exposed time is not overlapped by."""
    rows = []
    n_ranks = len(ranks)
    steps = max(min(len(t.steps) for t in ranks), 1)
    for (group, kind), matched in sorted(calls.items(), key=lambda kv: kv[0]):
        mine = [c for t in ranks for c in t.calls if (c.group, c.kind) == (group, kind)]
        execs = [c.exec_span for c in mine if c.exec_span is not None]
        time_us = sum(b - a for a, b in execs)
        exposed_us = 0.0
        for t in ranks:
            spans = union(c.exec_span for c in t.calls if (c.group, c.kind) == (group, kind)
                          and c.exec_span is not None)
            exposed_us += length(subtract(spans, busy[t.rank]))
        sizes = [c.nbytes for c in mine if c.nbytes]
        skews = [_skew(row)[1] for row in matched]
        lasts = Counter(_skew(row)[0] for row in matched)
        rows.append({
            "kind": kind, "group": group,
            "calls_per_step": _r(len(mine) / n_ranks / steps, 2),
            "bytes": int(statistics.median(sizes)) if sizes else None,
            "time_ms": _r(time_us / n_ranks / steps / 1e3),
            "exposed_ms": _r(exposed_us / n_ranks / steps / 1e3),
            "overlapped_share": _r(1 - exposed_us / time_us, 3) if time_us else None,
            "skew_ms_mean": _r(statistics.fmean(skews) / 1e3) if skews else None,
            "skew_ms_max": _r(max(skews) / 1e3) if skews else None,
            "last_rank_counts": {str(ranks[i].rank): n for i, n in sorted(lasts.items())},
            "matched": bool(matched),
        })
    return rows


def _skew(row: list[Any]) -> tuple[int, float]:
    """(index of the rank that arrived last, how much after the first) for one call."""
    arrivals = [c.arrive for c in row]
    last = max(range(len(row)), key=lambda i: arrivals[i])
    return last, arrivals[last] - min(arrivals)


def _last_to_arrive(calls: dict[tuple[str, str], list[list[Any]]], rank_ids: list[int],
                    ) -> dict[str, Any] | None:
    """The rank most often last at the script's collectives (ours left out), and the operator
    it ran just before."""
    tally: Counter[int] = Counter()
    before: dict[int, Counter[str]] = defaultdict(Counter)
    kinds: dict[int, Counter[str]] = defaultdict(Counter)
    skews: dict[int, list[float]] = defaultdict(list)
    total = 0
    for (group, kind), matched in calls.items():
        if group == "rankscope":
            continue
        for row in matched:
            last, skew = _skew(row)
            total += 1
            tally[last] += 1
            kinds[last][kind] += 1
            skews[last].append(skew)
            if row[last].before:
                before[last][row[last].before] += 1
    if not tally:
        return None
    index, n = tally.most_common(1)[0]
    return {"rank": rank_ids[index], "calls": n, "of": total,
            "share": _r(n / total, 3), "kind": kinds[index].most_common(1)[0][0],
            "skew_ms_mean": _r(statistics.fmean(skews[index]) / 1e3),
            "preceding_op": before[index].most_common(1)[0][0] if before[index] else None}


def _bandwidth(calls: dict[tuple[str, str], list[list[Any]]], world: int, first: RankTrace,
               doctor_dir: Path) -> list[dict[str, Any]]:
    """Achieved bus bandwidth of the larger collectives of each kind: the last rank to arrive
    waited for nobody, so its execution time is the transfer's."""
    doctor = load_doctor(doctor_dir) if doctor_dir.is_dir() else None
    out = []
    for (group, kind), matched in sorted(calls.items()):
        if group == "rankscope" or kind not in BUS_FACTORS or not matched or world < 2:
            continue
        sized = [(row[_skew(row)[0]].nbytes, row[_skew(row)[0]].exec_span) for row in matched]
        sized = [(b, s) for b, s in sized if b and s and s[1] > s[0]]
        if not sized:
            continue
        biggest = max(b for b, _ in sized)
        large = [(b, s) for b, s in sized if b >= biggest / 4]
        busbw = statistics.median(b / (s[1] - s[0]) / 1e3 * BUS_FACTORS[kind](world)
                                  for b, s in large)  # bytes/µs / 1e3 = GB/s
        row: dict[str, Any] = {"kind": kind, "group": group, "calls": len(large),
                               "bytes": int(statistics.median(b for b, _ in large)),
                               "busbw_gbs": _r(busbw, 3)}
        backend = first.meta.get("distributedInfo", {}).get("backend")
        if doctor is not None and doctor.sizes and kind == "all_reduce" \
                and (backend is None or doctor.backend in str(backend)):
            ref = min(doctor.sizes, key=lambda s: abs(s.size_bytes - row["bytes"]))
            row.update(doctor_busbw_gbs=_r(ref.busbw_gbs, 3), doctor_bytes=ref.size_bytes,
                       of_doctor=_r(busbw / ref.busbw_gbs, 3) if ref.busbw_gbs else None)
        out.append(row)
    return out


def _r(x: float, digits: int = 3) -> float:
    return round(float(x), digits)
