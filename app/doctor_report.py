"""What ``python -m ddp_engine doctor --json --progress`` tells the "Check devices..." dialog,
worded for it: its progress lines, its one-line errors, and the finished report as rows of text.

No Qt here (tests read it without a window), and no torch: the doctor runs as a child process,
and this module only reads what it printed (``report_dict`` in ``ddp_engine/launch/doctor.py``;
``measurement`` is doctor.json's schema, :mod:`ddp_engine.common.doctor_result`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_engine.common.doctor_result import DoctorResult, fmt_bytes, fmt_gbs, fmt_time

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
"""doctor's exit codes: the machine can train, it cannot, bad input (one line on stderr)."""
_PROGRESS = re.compile(r"^progress (\d+)/(\d+) (.*)$")


@dataclass(frozen=True)
class Progress:
    """One ``--progress`` line: ``done`` of ``stages`` stages are over, ``what`` is under way."""

    done: int
    stages: int
    what: str


def parse_progress(line: str) -> Progress | None:
    """The progress line ``line`` is, or None for any other line."""
    found = _PROGRESS.match(line.strip())
    if found is None or int(found[2]) < 1:
        return None
    return Progress(min(int(found[1]), int(found[2])), int(found[2]), found[3])


def error_line(stderr: str) -> str:
    """The last line of ``stderr`` that is not a progress line: doctor's one-line error
    (``error: nproc must be ...``), or a traceback's last line. Empty when there is none."""
    lines = [x.strip() for x in stderr.splitlines()]
    said = [x for x in lines if x and parse_progress(x) is None]
    return said[-1] if said else ""


@dataclass
class DoctorView:
    """A finished check, as the dialog shows it: each part as rows of cells."""

    ok: bool
    verdict: str
    title: str
    """What was measured: "All-reduce across 2 CPU processes (gloo)"."""
    sizes: list[list[str]] = field(default_factory=list)
    """size, iterations, time, algbw, busbw: one row per message size."""
    busbw_gbs: list[float] = field(default_factory=list)
    """The sizes' bus bandwidths, as numbers (the rows' last cells, unrounded)."""
    bandwidth: str = ""
    """The best busbw and what the links allow (or why nothing compares with it)."""
    warnings: list[str] = field(default_factory=list)
    gpus: list[list[str]] = field(default_factory=list)
    """GPU, name, PCIe, NVLink, now (load): every GPU NVML lists."""
    measured_gpus: list[int] = field(default_factory=list)
    links: list[list[str]] = field(default_factory=list)
    """GPUs, P2P, topology, link allows: each pair of the GPUs in question."""
    versions: list[list[str]] = field(default_factory=list)
    """what, version."""
    doctor_file: Path | None = None
    """Where the measurement was kept; None when it was not (failed, or not writable)."""


SIZE_COLUMNS = ["size", "iterations", "time", "algbw", "busbw"]
GPU_COLUMNS = ["GPU", "name", "PCIe", "NVLink", "now"]
LINK_COLUMNS = ["GPUs", "P2P", "topology", "link allows (per direction)"]
VERSION_COLUMNS = ["", "version"]


def parse_report(stdout: str) -> DoctorView:
    """The view of ``doctor --json``'s output.

    Raises:
        ValueError: the output holds no report (the doctor crashed, or printed something else).
    """
    start = stdout.find("{")
    try:
        data = json.loads(stdout[start:]) if start >= 0 else None
    except json.JSONDecodeError as e:
        raise ValueError(f"doctor's output is not a JSON report: {e}") from None
    if not isinstance(data, dict) or "verdict" not in data:
        raise ValueError("doctor's output is not a JSON report")
    return view_of(data)


def view_of(data: dict[str, Any]) -> DoctorView:
    """The view of a ``doctor --json`` report (see ``report_dict`` in the doctor).

    Raises:
        ValueError: a measurement doctor.json's schema does not allow.
    """
    measured = [int(i) for i in data.get("gpus_measured") or []]
    across = (f"{len(measured)} GPU(s) ({', '.join(map(str, measured))}), nccl" if measured
              else f"{data.get('nproc')} CPU processes (gloo)")
    # The terminal prints the warnings before the verdict; the dialog, below it.
    verdict = str(data.get("verdict") or "").replace("warning(s) above", "warning(s) below")
    view = DoctorView(ok=bool(data.get("ok")), verdict=verdict,
                      title=f"All-reduce across {across}", measured_gpus=measured,
                      warnings=[str(w) for w in data.get("warnings") or []],
                      versions=_versions(data.get("versions") or {}),
                      gpus=[_gpu_row(g) for g in data.get("gpus") or []],
                      links=[_link_row(p) for p in data.get("links") or []])
    if data.get("measurement") is not None:
        result = DoctorResult.from_dict(data["measurement"])
        view.sizes = [[fmt_bytes(s.size_bytes), str(s.iterations), fmt_time(s.time_s),
                       fmt_gbs(s.algbw_gbs), fmt_gbs(s.busbw_gbs)] for s in result.sizes]
        view.busbw_gbs = [s.busbw_gbs for s in result.sizes]
        view.bandwidth = (f"best bus bandwidth {fmt_gbs(result.best_busbw_gbs)} (busbw = algbw x "
                          f"2(n-1)/n, n = {result.world_size})")
        if data.get("link"):
            view.bandwidth += f"; {data['link']}"
    if data.get("doctor_file"):
        view.doctor_file = Path(str(data["doctor_file"]))
    return view


def _versions(v: dict[str, Any]) -> list[list[str]]:
    torch = (f"{v.get('torch') or '(not installed)'} "
             + (f"(CUDA {v['cuda']})" if v.get("cuda") else "(CPU build)"))
    driver = (f"{v['driver']} (CUDA up to {v.get('driver_cuda') or '?'})" if v.get("driver")
              else "- (NVML not available)")
    return [["Python", str(v.get("python") or "-")], ["torch", torch],
            ["NCCL", str(v.get("nccl") or "-")], ["NVIDIA driver", driver]]


def _gpu_row(g: dict[str, Any]) -> list[str]:
    pcie = g.get("pcie") or {}
    link = (f"gen{pcie.get('gen') or '?'} x{pcie.get('width') or '?'} (max gen"
            f"{pcie.get('max_gen') or '?'} x{pcie.get('max_width') or '?'})"
            if pcie.get("gen") or pcie.get("width") else "?")
    nvlinks = int(g.get("nvlinks") or 0)
    now = []
    if g.get("util_pct") is not None:
        now.append(f"{g['util_pct']:.0f}% busy")
    if g.get("mem_used_bytes") is not None:
        now.append(f"{g['mem_used_bytes'] / 2**30:.1f} GiB used")
    if g.get("temp_c") is not None:
        now.append(f"{g['temp_c']:.0f} C")
    if g.get("mig"):
        now.append("MIG mode")
    return [f"GPU {g.get('index')}", str(g.get("name") or "?"), link,
            f"{nvlinks} link(s)" if nvlinks else "none", ", ".join(now) or "?"]


def _link_row(p: dict[str, Any]) -> list[str]:
    allows = (f"~{p['allows_gbs']:.1f} GB/s ({p.get('via') or '?'})" if p.get("allows_gbs")
              else f"? ({p.get('via') or 'speed unknown'})")
    return [f"GPU {p.get('a')} - GPU {p.get('b')}", str(p.get("p2p") or "?"),
            str(p.get("topology") or "?"), allows]


@dataclass(frozen=True)
class Outcome:
    """How a check ended, for the dialog's verdict line."""

    kind: str
    """"ok", "cannot" (exit 1: the machine cannot train), "error" (bad input, a crash) or
    "cancelled"."""
    text: str
    view: DoctorView | None = None
    kept: Path | None = None
    """doctor.json, when the check passed and the file is there."""


def outcome(exit_code: int | None, stdout: str, stderr: str, cancelled: bool) -> Outcome:
    """What a doctor process that ended says. ``exit_code`` is None when it did not exit
    normally (killed by a signal)."""
    if cancelled and exit_code != EXIT_OK:  # 0: it had finished before the cancel reached it
        return Outcome("cancelled", "cancelled: the check's processes were ended; nothing "
                                    "was kept")
    said = error_line(stderr)
    if exit_code == EXIT_BAD_INPUT:
        return Outcome("error", said or "error: doctor refused its options (exit code 2)")
    if exit_code in (EXIT_OK, EXIT_FAILED):
        try:
            view = parse_report(stdout)
        except ValueError as e:
            return Outcome("error", f"doctor exited {exit_code} without a report ({e})"
                           + (f": {said}" if said else ""))
        kept = view.doctor_file if exit_code == EXIT_OK and view.doctor_file and \
            view.doctor_file.is_file() else None
        return Outcome("ok" if exit_code == EXIT_OK else "cannot", view.verdict, view, kept)
    how = "was killed" if exit_code is None else f"ended with exit code {exit_code}"
    return Outcome("error", f"doctor {how}" + (f": {said}" if said else ""))
