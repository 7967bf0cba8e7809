"""A profile's summary as text (the command line's output; the app shows the same numbers in
tables), torch-free."""

from __future__ import annotations

from typing import Any

from ddp_engine.common.doctor_result import fmt_bytes

PART_NAMES = {"compute": "compute", "optimizer": "optimizer", "data": "data",
              "comm_exposed": "comm exposed", "idle": "idle"}
"""Column titles of the step's parts; "idle" reads "waiting" on a CPU timeline."""
PERFETTO = ("Open a trace at https://ui.perfetto.dev (Open trace file): the page reads the file "
            "in your browser; nothing is uploaded.")


def part_title(part: str, timeline: str) -> str:
    return "waiting" if part == "idle" and timeline == "cpu" else PART_NAMES[part]


def size_text(n: int | None) -> str:
    if not n:
        return "?"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}" if n % size else fmt_bytes(n)
    return f"{n} B"


def share_text(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def headline(s: dict[str, Any]) -> str:
    first = s.get("first_step")
    steps = f"steps {first}-{first + s['steps'] - 1}" if first else f"{s['steps']} steps"
    return (f"Profile of {steps} on {len(s['ranks'])} of {s['world_size']} ranks "
            f"({s.get('backend') or '?'}, {s['timeline'].upper()} timeline): "
            f"{s['step_time_ms']:.2f} ms per step")


def last_text(s: dict[str, Any]) -> str | None:
    last = s.get("last_to_arrive")
    if not last:
        return None
    before = f"; before it, it ran {last['preceding_op']}" if last.get("preceding_op") else ""
    return (f"Last to arrive: rank {last['rank']}, at {last['calls']} of {last['of']} calls "
            f"(mostly {last['kind']}), {last['skew_ms_mean']:.2f} ms after the first rank on "
            f"average{before}")


def summary_text(s: dict[str, Any], top: int = 5) -> str:
    """The whole summary, as ``python -m ddp_engine profile`` prints it."""
    tl = s["timeline"]
    out = [headline(s), ""]
    parts = list(PART_NAMES)
    out.append("Per rank, ms per step (the parts add up to the step):")
    out.append(_table(["rank", "step", *(part_title(p, tl) for p in parts), "comm",
                       "overlapped"],
                      [[str(r["rank"]), f"{r['step_time_ms']:.2f}",
                        *(f"{r['parts_ms'][p]:.2f}" for p in parts), f"{r['comm_ms']:.2f}",
                        share_text(r.get("comm_overlapped_share"))] for r in s["per_rank"]]))
    for rank, why in s.get("missing", {}).items():
        out.append(f"rank {rank}: no trace ({why})")
    if s["collectives"]:
        out += ["", "Collectives, per rank and step:"]
        out.append(_table(
            ["kind", "group", "calls", "size", "time ms", "exposed ms", "overlapped",
             "skew ms (mean/max)", "last"],
            [[c["kind"], c["group"] or "-", f"{c['calls_per_step']:g}", size_text(c.get("bytes")),
              f"{c['time_ms']:.2f}", f"{c['exposed_ms']:.2f}",
              share_text(c.get("overlapped_share")),
              "-" if c.get("skew_ms_mean") is None
              else f"{c['skew_ms_mean']:.2f}/{c['skew_ms_max']:.2f}",
              ", ".join(f"rank {r} x{n}" for r, n in c["last_rank_counts"].items()) or "-"]
             for c in s["collectives"]]))
    if (line := last_text(s)) is not None:
        out += ["", line]
    for b in s.get("bandwidth", []):
        ref = (f"; doctor measured {b['doctor_busbw_gbs']:.2f} GB/s at "
               f"{size_text(b['doctor_bytes'])} ({share_text(b.get('of_doctor'))} of it)"
               if b.get("doctor_busbw_gbs") else "; no doctor measurement to compare with")
        out.append(f"Bus bandwidth, {b['kind']} of {size_text(b['bytes'])}: "
                   f"{b['busbw_gbs']:.2f} GB/s{ref}")
    for r in s["per_rank"][:1] if top else []:
        out += ["", f"Top operators of rank {r['rank']}, self time per step:"]
        out += [f"  {o['self_ms']:8.3f} ms  {o['name']}" for o in r["top_ops"][:top]]
    out += ["", f"Traces and summary.json: {s['folder']}", PERFETTO]
    return "\n".join(out) + "\n"


def _table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=False)]
    lines = [head, *rows]
    return "\n".join("  " + "  ".join(x.rjust(w) if i else x.ljust(w)
                                      for i, (x, w) in enumerate(zip(line, widths, strict=True)))
                     for line in lines)


def sampled_text(s: dict[str, Any]) -> str:
    """The communication of a profile in one line, for a run whose live sync is not timed (a
    script without DDP): it is a sample of a few steps, and says so."""
    ranks = s.get("per_rank") or []
    if not ranks:
        return ""
    first = s.get("first_step")
    steps = f"steps {first}-{first + s['steps'] - 1}" if first else f"{s['steps']} steps"
    comm = sum(r["comm_ms"] for r in ranks) / len(ranks)
    exposed = sum(r["parts_ms"]["comm_exposed"] for r in ranks) / len(ranks)
    step = s["step_time_ms"]
    return (f"Sampled by the profile of {steps}: communication {comm:.2f} ms of "
            f"{step:.2f} ms a step ({share_text(comm / step if step else None)}), "
            f"{exposed:.2f} ms of it not overlapped")
