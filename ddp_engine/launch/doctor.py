"""``python -m ddp_engine doctor``: can this machine train, and how fast do its GPUs talk?

A preflight before a long run. It prints the versions (Python, torch, CUDA, NCCL, driver), the
GPUs with their links (NVML: PCIe generation and width, NVLink, P2P status and topology of each
pair) and warnings with what to do (P2P disabled between GPUs on one switch, mixed models, a
busy GPU, throttled clocks). Then it all-reduces for a few seconds across the chosen GPUs (nccl),
or across ``--nproc`` CPU processes (gloo) where there is no GPU torch can use, and reports
algorithm and bus bandwidth next to what the links allow. The measurement is kept in
``<runs_dir>/doctor.json`` (:mod:`ddp_engine.common.doctor_result`).

The ranks are started by torchrun as a launch starts them (the same device choice, checks and
``CUDA_VISIBLE_DEVICES`` by UUID: :func:`plan_launch`), but torchrun runs as a child process
here, not inside this one: an all-reduce that hangs (NCCL across a PCIe switch with ACS on) must
be ended after ``--timeout`` with every process of it, and reported.

Exit code: 0 the machine can train (on CPU only, when no GPU is usable: a warning says why),
1 it cannot (the all-reduce failed or hung), 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

from ddp_engine.common import gpus as nvml_gpus
from ddp_engine.common.child_env import build_env
from ddp_engine.common.cli_flags import _parse_int_list, _parse_number
from ddp_engine.common.cluster import rendezvous_args
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_values import DEVICES
from ddp_engine.common.doctor_result import (
    SCHEMA,
    SIZE_STARTED,
    DoctorResult,
    fmt_bytes,
    fmt_gbs,
    fmt_time,
    sizes_for,
    write_doctor,
)
from ddp_engine.common.inventory import (
    NVML_TIMEOUT_S,
    GpuInventory,
    gpu_inventory_within,
    installed_torch,
)
from ddp_engine.common.processes import terminate_then_kill, tree
from ddp_engine.common.run_dir import read_json, tail_lines
from ddp_engine.launch import doctor_facts as facts_mod
from ddp_engine.launch.doctor_facts import GpuFacts, PairLink
from ddp_engine.launch.launcher import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_FORCED, EXIT_OK
from ddp_engine.launch.plan import Plan, plan_launch

BENCH_MODULE = "ddp_engine.rank.allreduce_bench"
DEFAULT_SECONDS = 3.0
DEFAULT_TIMEOUT_S = 120.0
KILL_GRACE_S = 5.0
POLL_S = 0.2  # how often the measurement's log is read for rank 0's progress
_ERROR_LINE = re.compile(r"(\w+(?:Error|Exception)): (.+)$")
_SIZE_LINE = re.compile(re.escape(SIZE_STARTED) + r" (\d+)/(\d+) (\d+)")


def add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``doctor`` subcommand's flags (``--gpus``, ``--nproc``, ``--device`` and
    ``--runs-dir`` as ``launch`` takes them)."""
    parser.add_argument("--gpus", type=_parse_int_list("gpus"), metavar="I,J",
                        help="GPU indices (NVML / nvidia-smi) to all-reduce across, e.g. 0,2 "
                        "(default: every GPU torch can use)")
    parser.add_argument("--nproc", type=_parse_number("nproc", int), metavar="N",
                        help="processes: the first N GPUs, or N CPU processes with gloo "
                        "(default: every chosen GPU, or 2 on CPU)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="auto (GPUs torch can use, else CPU), cpu or cuda (default: auto)")
    parser.add_argument("--runs-dir", default=RunConfig().runs_dir, metavar="PATH",
                        help="the runs folder; the measurement is kept there as doctor.json "
                        "(default: runs)")
    parser.add_argument("--seconds", type=_positive("seconds"), default=DEFAULT_SECONDS,
                        metavar="S", help="time to spend all-reducing, all message sizes "
                        f"together (default: {DEFAULT_SECONDS:g})")
    parser.add_argument("--timeout", type=_positive("timeout"), default=DEFAULT_TIMEOUT_S,
                        metavar="S", help="end the measurement and every process of it after S "
                        f"seconds: a hung all-reduce fails the check (default: "
                        f"{DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--json", action="store_true",
                        help="print the report as one JSON object instead of text")
    parser.add_argument("--progress", action="store_true",
                        help="print a line per stage to stderr for a progress bar: "
                        "'progress K/N what' (K of N stages done; the app reads them)")


def _positive(name: str) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{name} must be a number of seconds > 0, got "
                                             f"{text!r}")
        return value
    parse.__name__ = name
    return parse


@dataclass
class Report:
    """Everything the doctor found; printed as text or JSON."""

    versions: dict[str, str | None]
    inventory: GpuInventory
    gpus: list[GpuFacts]
    """Every GPU NVML lists."""
    links: list[PairLink]
    """Each pair of the GPUs in question: the chosen ones, or all when measuring on CPU."""
    warnings: list[str]
    plan: Plan
    result: DoctorResult | None = None
    reason: str | None = None
    """Why the machine cannot train (the measurement failed or hung)."""
    kept_in: str | None = None
    keep_error: str | None = None
    """Why the result could not be kept in doctor.json (the check itself passed)."""
    log_tail: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.result is not None else EXIT_FAILED

    @property
    def measured(self) -> list[int]:
        """NVML indices of the GPUs measured; empty on CPU."""
        return list(self.plan.cfg.gpus or []) if self.plan.device == "cuda" else []

    def verdict(self) -> str:
        what = (f"{len(self.measured)} GPU(s) ({', '.join(map(str, self.measured))}) "
                "all-reduced with nccl" if self.measured
                else f"{self.plan.cfg.nproc} CPU processes all-reduced with gloo")
        if self.result is None:
            return f"CANNOT TRAIN: {self.reason}"
        text = f"OK: this machine can train: {what}"
        note = self.inventory.cpu_note() if self.plan.device == "cpu" else None
        if note:
            text += f" (on CPU only: {note})"
        elif self.warnings:
            text += f"; {len(self.warnings)} warning(s) above"
        return text


def plan_doctor(ns: argparse.Namespace) -> Plan:
    """The processes to measure with, chosen and checked exactly as ``launch`` chooses them
    for the same flags (:func:`plan_launch`): GPUs torch can use (never a MIG GPU) get one rank
    each, by UUID; ``auto`` falls back to CPU processes when torch cannot use the GPUs NVML
    lists (``plan.notes`` says why).

    Raises:
        ConfigError: bad input, or GPUs asked for that cannot be used (naming why).
    """
    cfg = RunConfig(device=ns.device, gpus=ns.gpus, nproc=ns.nproc, runs_dir=ns.runs_dir)
    return plan_launch(cfg, create_run_dir=False)


def versions(inventory: GpuInventory) -> dict[str, str | None]:
    """Python, torch and the CUDA it was built for, NCCL (only where torch can use CUDA: that
    needs torch imported), and the NVIDIA driver with the newest CUDA it supports."""
    build = installed_torch()
    driver, driver_cuda = nvml_gpus.driver_versions()
    nccl = None
    if inventory.usable:
        try:
            import torch

            found = torch.cuda.nccl.version()  # a tuple; an int in old torch
            nccl = ".".join(map(str, found)) if isinstance(found, tuple) else str(found)
        except Exception:  # no NCCL in this build
            nccl = None
    return {"python": platform.python_version(), "torch": build.version, "cuda": build.cuda,
            "nccl": nccl, "driver": driver,
            "driver_cuda": None if driver_cuda is None else "{}.{}".format(*driver_cuda)}


def examine(ns: argparse.Namespace) -> Report:
    """Everything but the measurement.

    Raises:
        ConfigError: bad input.
    """
    plan = plan_doctor(ns)
    inventory = gpu_inventory_within(NVML_TIMEOUT_S)
    measured = set(plan.cfg.gpus or []) if plan.device == "cuda" else set()
    with nvml_gpus.Nvml() as nvml:
        every = facts_mod.gpu_facts(nvml, inventory.gpus)
        scope = [f for f in every if f.info.index in measured] or every
        links = facts_mod.pair_links(nvml, scope)
    return Report(versions(inventory), inventory, every, links,
                  facts_mod.warnings(scope, links, inventory), plan)


SizeStarted = Callable[[int, int, int], None]
"""Called as rank 0 starts a message size: (i, n, size_bytes), i counted from 1."""


def measure(report: Report, seconds: float, timeout_s: float,
            on_size: SizeStarted | None = None) -> None:
    """All-reduce under torchrun; fills ``report.result`` or ``report.reason``."""
    plan = report.plan
    with tempfile.TemporaryDirectory(prefix="rankscope-doctor-") as tmp:
        out, log = Path(tmp) / "allreduce.json", Path(tmp) / "torchrun.log"
        args = [*rendezvous_args(plan.cfg), "--nproc-per-node", str(plan.cfg.nproc),
                "--monitor-interval", "0.2", "-m", BENCH_MODULE, "--out", str(out),
                "--device", plan.device, "--seconds", f"{seconds:g}", "--timeout",
                f"{timeout_s:g}"]
        with open(log, "wb") as f:
            proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args],
                                    stdout=f, stderr=subprocess.STDOUT,
                                    env={**build_env(), **plan.env}, start_new_session=True)
        code: int | None = None
        try:
            code = _wait(proc, log, timeout_s, on_size)
        finally:
            if proc.poll() is None:  # hung, or we were interrupted: the agent and every rank
                terminate_then_kill(tree(proc.pid), KILL_GRACE_S)
                proc.wait()
        raw = read_json(out) if code == 0 else None
        # The log of a failure says why; after a timeout it only shows our SIGTERM.
        report.log_tail = tail_lines(log, 15) if raw is None and code is not None else []
        across = (f"{len(report.measured)} GPUs" if report.measured
                  else f"{plan.cfg.nproc} CPU processes")
        if code is None:
            report.reason = (f"the all-reduce across {across} did not finish within "
                             f"{timeout_s:g} s (--timeout); its processes were ended")
            if plan.device == "cuda":
                report.reason += (". NCCL hangs like this when P2P between GPUs is blocked "
                                  "(PCIe ACS, IOMMU): see the warnings; if a run with "
                                  "NCCL_P2P_DISABLE=1 passes, P2P is the cause")
            return
        if raw is None:
            found = [m for m in map(_ERROR_LINE.search, reversed(tail_lines(log, 200))) if m]
            why = f"{found[0].group(1)}: {found[0].group(2)}" if found else "no error message"
            report.reason = (f"the all-reduce across {across} failed (torchrun exit code "
                             f"{code}): {why}")
            return
        try:
            report.result = _result(report, raw)
        except (ValueError, TypeError, KeyError) as e:
            report.reason = f"the all-reduce measurement wrote an unreadable result: {e}"


def _wait(proc: subprocess.Popen[bytes], log: Path, timeout_s: float,
          on_size: SizeStarted | None) -> int | None:
    """torchrun's exit code, or None when it runs past ``timeout_s``. Meanwhile its log is
    read every :data:`POLL_S` for the sizes rank 0 starts (``on_size``)."""
    deadline = time.monotonic() + timeout_s
    with open(log, "rb") as f:
        pending = b""
        while True:
            try:
                code: int | None = proc.wait(timeout=max(0.0, min(
                    POLL_S, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                code = None
            pending = _follow(f, pending, on_size)
            if code is not None or time.monotonic() >= deadline:
                return code


def _follow(f: IO[bytes], pending: bytes, on_size: SizeStarted | None) -> bytes:
    """Read what the log gained; call ``on_size`` for each whole line rank 0 printed as it
    started a size. Returns the part of a line not yet ended."""
    *lines, pending = (pending + f.read()).split(b"\n")
    for line in lines:
        found = _SIZE_LINE.search(line.decode("utf-8", "replace"))
        if found and on_size is not None:
            on_size(int(found[1]), int(found[2]), int(found[3]))
    return pending


def _result(report: Report, raw: dict[str, Any]) -> DoctorResult:
    by_index = {f.info.index: f.info for f in report.gpus}
    gpus = [by_index[i] for i in report.measured if i in by_index]
    rank_versions = raw.get("versions") or {}
    return DoctorResult.from_dict({
        **raw, "schema": SCHEMA,
        "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name} for g in gpus],
        "link_allows_gbs": facts_mod.link_allows_gbs(report.links) if gpus else None,
        "versions": {"python": report.versions["python"], "driver": report.versions["driver"],
                     "torch": rank_versions.get("torch", report.versions["torch"]),
                     "cuda": rank_versions.get("cuda", report.versions["cuda"]),
                     "nccl": rank_versions.get("nccl", report.versions["nccl"])}})


def run_doctor(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    """The whole command. Returns the exit code."""
    out = out or sys.stdout
    # Ctrl+C, and the app's Cancel (a SIGINT), end the measurement's processes through
    # KeyboardInterrupt, which Python sets up only where the parent left SIGINT alone: a process
    # that a script started in the background inherits it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        report = examine(ns)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not ns.json:
        print_facts(report, out)
        print(f"all-reduce across {_across(report)}, ~{ns.seconds:g} s ...", file=out,
              flush=True)
    stages = len(sizes_for(report.plan.device)) + 2  # start, each size, keep
    progress: Callable[[int, int, str], None] = _progress if ns.progress else lambda *_: None
    progress(1, stages, f"starting {_across(report)} with torchrun")
    try:
        measure(report, ns.seconds, ns.timeout, lambda i, n, size: progress(
            1 + i, n + 2, f"all-reduce {fmt_bytes(size)} ({i}/{n})"))
    except KeyboardInterrupt:
        print("interrupted: the measurement's processes were ended", file=sys.stderr)
        return EXIT_FORCED
    if report.result is not None:
        progress(stages, stages, "keeping the result")
        try:
            report.kept_in = str(write_doctor(ns.runs_dir, report.result))
        except OSError as e:
            report.keep_error = (f"runs_dir: cannot keep the result in {ns.runs_dir!r}: "
                                 f"{e.strerror or e}")
    if ns.json:
        print(json.dumps(report_dict(report), indent=2, sort_keys=True), file=out)
    else:
        print_measurement(report, out)
    return report.exit_code


# ------------------------------------------------------------------------------- printing
def _progress(done: int, stages: int, what: str) -> None:
    """One ``--progress`` line: ``done`` of ``stages`` stages are over, ``what`` is under way."""
    print(f"progress {done}/{stages} {what}", file=sys.stderr, flush=True)


def _across(report: Report) -> str:
    if report.measured:
        return f"{len(report.measured)} GPU(s) {', '.join(map(str, report.measured))} (nccl)"
    return f"{report.plan.cfg.nproc} CPU processes (gloo)"


def print_facts(report: Report, out: TextIO) -> None:
    v = report.versions
    torch_text = (f"torch {v['torch'] or '(not installed)'} "
                  + (f"(CUDA {v['cuda']})" if v["cuda"] else "(CPU build)"))
    driver = (f"NVIDIA driver {v['driver']} (CUDA up to {v['driver_cuda']})" if v["driver"]
              else "NVIDIA driver - (NVML not available)")
    print(f"versions: Python {v['python']}, {torch_text}, NCCL {v['nccl'] or '-'}, {driver}",
          file=out)
    if not report.gpus:
        print("GPUs: none visible to NVML", file=out)
    else:
        print("GPUs (NVML index, as nvidia-smi numbers them):", file=out)
        for f in report.gpus:
            print(f"  {facts_mod.describe_gpu(f)}", file=out)
    if report.links:
        print("links:", file=out)
        for p in report.links:
            print(f"  {p.describe()}", file=out)
    for w in report.warnings:
        print(f"warning: {w}", file=out)
    out.flush()


def print_measurement(report: Report, out: TextIO) -> None:
    r = report.result
    if r is not None:
        rows = [("size", "iterations", "time", "algbw", "busbw")] + [
            (fmt_bytes(s.size_bytes), str(s.iterations), fmt_time(s.time_s),
             fmt_gbs(s.algbw_gbs), fmt_gbs(s.busbw_gbs)) for s in r.sizes]
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        for row in rows:
            print("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)),
                  file=out)
        print(f"bus bandwidth: best {fmt_gbs(r.best_busbw_gbs)} (busbw = algbw x 2(n-1)/n, "
              f"n = {r.world_size})", file=out)
        print(f"  {_link_text(report)}", file=out)
        if report.kept_in:
            print(f"kept in {report.kept_in}", file=out)
        if report.keep_error:
            print(f"warning: {report.keep_error}", file=out)
    else:
        for line in report.log_tail:
            print(f"  | {line}", file=out)
    print(report.verdict(), file=out)
    out.flush()


def _link_text(report: Report) -> str:
    """What the measured bus bandwidth compares with."""
    r = report.result
    assert r is not None
    if r.device == "cpu":
        return "CPU processes all-reduce through memory: no link to compare with"
    if r.world_size == 1:
        return "one GPU: nothing crosses a link (measure 2 or more)"
    known = [p for p in report.links if p.allows_gbs]
    if r.link_allows_gbs is None or not known:
        return "link speed unknown (NVML could not say)"
    slowest = min(known, key=lambda p: p.allows_gbs or 0.0)
    return (f"link allows ~{r.link_allows_gbs:.1f} GB/s per direction (slowest: GPU "
            f"{slowest.a} - GPU {slowest.b}, {slowest.via}): measured "
            f"{r.best_busbw_gbs / r.link_allows_gbs:.0%} of it")


def report_dict(report: Report) -> dict[str, Any]:
    """The report for ``--json``: ``measurement`` is what doctor.json holds."""
    return {
        "ok": report.result is not None, "exit_code": report.exit_code,
        "verdict": report.verdict(), "reason": report.reason, "versions": report.versions,
        "device": report.plan.device, "nproc": report.plan.cfg.nproc,
        "gpus_measured": report.measured,
        "warnings": report.warnings + ([report.keep_error] if report.keep_error else []),
        "gpus": [_gpu_dict(f) for f in report.gpus],
        "links": [{"a": p.a, "b": p.b, "p2p": None if p.p2p is None else
                   facts_mod.P2P_STATUS.get(p.p2p, str(p.p2p)),
                   "topology": facts_mod.TOPOLOGY.get(p.topology or -1, (None,))[0],
                   "allows_gbs": p.allows_gbs, "via": p.via} for p in report.links],
        "measurement": None if report.result is None else report.result.to_dict(),
        "link": None if report.result is None else _link_text(report),
        "doctor_file": report.kept_in,
    }


def _gpu_dict(f: GpuFacts) -> dict[str, Any]:
    return {"index": f.info.index, "name": f.info.name, "uuid": f.info.uuid,
            "pci_bus_id": f.info.pci_bus_id, "mem_total_bytes": f.info.mem_total_bytes,
            "mig": f.info.mig, "util_pct": f.reading.util_pct,
            "mem_used_bytes": f.reading.mem_used_bytes, "temp_c": f.reading.temp_c,
            "power_w": f.reading.power_w, "pids": [p.pid for p in f.processes],
            "pcie": {"gen": f.pcie[0], "width": f.pcie[1], "max_gen": f.pcie_max[0],
                     "max_width": f.pcie_max[1], "allows_gbs": f.pcie_allows_gbs},
            "nvlinks": len(f.nvlinks), "throttle_reasons": f.throttle}
