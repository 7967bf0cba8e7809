"""The parts of ``make gpu-check`` that run the project's own tools: the environment's facts,
the CUDA-marked tests, the sync timing cross-check, ``doctor`` and the monitoring-overhead
benchmark (see bench/gpu_check.py)."""

from __future__ import annotations

import json
import os
import statistics
import xml.etree.ElementTree as ET
from typing import Any

import psutil

from bench.gpu_check_base import REPO, Ctx, Fail, Outcome, Skip, python_json, run_command
from ddp_engine.common.gpus import driver_versions, list_gpus
from ddp_engine.common.run_dir import tail_lines

FACTS_CODE = """
import importlib, json, sys
out = {"python": sys.version.split()[0], "executable": sys.executable}
def has(*names):
    try:
        for n in names:
            importlib.import_module(n)
        return True
    except Exception:
        return False
out["qt"] = has("PySide6.QtCore", "pyqtgraph", "pytestqt")
out["pytest"] = has("pytest")
out["pytest_timeout"] = has("pytest_timeout")
out["tomli_w"] = has("tomli_w")
out["numpy"] = has("numpy")
try:
    import torch
except Exception as e:
    out["torch_error"] = f"{type(e).__name__}: {e}"
else:
    ok = torch.cuda.is_available()
    out.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=ok,
               device_count=torch.cuda.device_count() if ok else 0)
    if ok:
        p = torch.cuda.get_device_properties(0)
        v = torch.cuda.nccl.version()
        out.update(device_name=p.name, capability=f"{p.major}.{p.minor}",
                   device_mem_gib=round(p.total_memory / 2**30, 1),
                   nccl=".".join(map(str, v)) if isinstance(v, tuple) else str(v))
print(json.dumps(out))
"""

NO_NUMPY = ("ABSENT: torch.distributed.all_gather_object, which the ranks use (checkpoint, stop "
            "and report rounds), needs it")


def environment(ctx: Ctx) -> Outcome:
    """Python, torch and its CUDA and NCCL, the GPUs by NVML, the driver, Qt or not."""
    facts = python_json(ctx, FACTS_CODE, timeout_s=min(120.0, ctx.timeout_s))
    driver, cuda_max = driver_versions()
    gpus = list_gpus()
    facts.update(driver=driver, driver_cuda=".".join(map(str, cuda_max)) if cuda_max else None,
                 gpus=[g.label for g in gpus], cores=len(os.sched_getaffinity(0)))
    ctx.facts.update(facts)
    if "torch_error" in facts:
        raise Fail(f"{facts['python']} cannot import torch: {facts['torch_error']}")
    numpy = "present" if facts["numpy"] else NO_NUMPY
    words = (f"Python {facts['python']}, torch {facts['torch']} (CUDA {facts['torch_cuda']}), "
             f"{facts['cores']} cores, Qt {'present' if facts['qt'] else 'absent'}, "
             f"numpy {numpy}")
    if facts["cuda_available"]:
        words += (f"; {facts['device_count']} CUDA device(s): {facts['device_name']} "
                  f"(sm {facts['capability']}, {facts['device_mem_gib']} GiB), NCCL "
                  f"{facts['nccl']}; driver {driver} (CUDA {facts['driver_cuda']})")
    elif gpus and ctx.cuda:
        raise Fail(f"NVML lists {', '.join(facts['gpus'])} but torch {facts['torch']} cannot "
                   f"use CUDA (built for CUDA {facts['torch_cuda']})")
    else:
        words += "; no CUDA device"
    return Outcome(words, {k: facts.get(k) for k in ("torch", "nccl", "driver")})


def pytest_cuda(ctx: Ctx) -> Outcome:
    """Every test marked cuda (bench/gpu_check_pytest.py), with pytest's own result. Without
    Qt (PySide6, pyqtgraph, pytest-qt), tests/app and tests/faults (whose conftest imports the
    app's window fixture) cannot be collected and are left out."""
    # The tests' temporary folders go under work/pytest-tmp, named by the environment, not by
    # --basetemp: tests/conftest.py ends every process whose command line names the base.
    temproot = ctx.work / "pytest-tmp"
    temproot.mkdir(parents=True, exist_ok=True)
    xml = ctx.work / "pytest.xml"
    argv = [ctx.python, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "-p",
            "bench.gpu_check_pytest", "-m", "cuda", f"--junitxml={xml}",
            "--continue-on-collection-errors"]
    left_out = ""
    if not ctx.facts.get("qt"):
        argv += ["--ignore=tests/app", "--ignore=tests/faults"]
        left_out = ("; tests/app and tests/faults not collected (no Qt): the faults' CUDA case "
                    "is the launcher-sigkill check here")
    log = ctx.work / "pytest.log"
    rc = run_command(ctx, [*argv, "tests"], log, marker=str(temproot),
                     env=ctx.env(QT_QPA_PLATFORM="offscreen",
                                 PYTEST_DEBUG_TEMPROOT=str(temproot)))
    counts, failed, skipped = _junit(xml)
    words = (f"{counts['tests']} selected: {counts['passed']} passed, {counts['failed']} failed, "
             f"{counts['skipped']} skipped (exit code {rc})")
    if skipped:
        words += "; skipped: " + "; ".join(sorted(set(skipped))[:3])
    if rc == 5 or counts["tests"] == 0:
        raise Fail("no test selected by -m cuda", tail_lines(log, 15))
    if rc != 0 or counts["failed"]:
        raise Fail(words + "; failed: " + ", ".join(failed[:6]) + left_out, tail_lines(log, 25))
    if ctx.facts.get("cuda_available") and counts["passed"] == 0:
        raise Fail(words + ": every CUDA test skipped on a machine with CUDA", tail_lines(log, 15))
    return Outcome(words + left_out, counts)


def _junit(path: Any) -> tuple[dict[str, int], list[str], list[str]]:
    """Counts of a junit XML report, the failed tests' names and the skip messages."""
    counts = dict.fromkeys(("tests", "passed", "failed", "skipped"), 0)
    failed: list[str] = []
    skipped: list[str] = []
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return counts, failed, skipped
    for case in root.iter("testcase"):
        counts["tests"] += 1
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            counts["failed"] += 1
            failed.append(case.get("name", "?"))
        elif skip is not None:
            counts["skipped"] += 1
            skipped.append(skip.get("message", "").removeprefix("Skipped: ")[:100])
        else:
            counts["passed"] += 1
    return counts, failed, skipped


def _sync_check(ctx: Ctx, source: str) -> dict[str, Any]:
    """bench/gpu_sync_check.py's JSON line for ``--source source``; Skip where it has no
    communication kernel to compare (the CPU rehearsal)."""
    log = ctx.work / f"sync-check-{source}.log"
    argv = [ctx.python, str(REPO / "bench" / "gpu_sync_check.py"), "--device", ctx.device,
            "--source", source]
    rc = run_command(ctx, argv, log, marker="gpu_sync_check.py")
    lines = [x for x in tail_lines(log, 200) if x.startswith('{"device"')]
    if rc != 0 or not lines:
        raise Fail(f"bench/gpu_sync_check.py exited with {rc}", tail_lines(log, 20))
    r: dict[str, Any] = json.loads(lines[-1])
    r["shape"] = (f"{r['buckets_per_step'] or 0:.0f} buckets of {r['bucket_mib']:,.0f} MiB "
                  f"per step, {r['steps']} steps, {r['backend']} with 1 rank")
    if r["kernel_ms"] is None:
        others = r["other_stream_kernels"]
        if ctx.cuda and not r["kernels_seen"]:
            raise Fail("torch.profiler recorded no CUDA kernel at all (no CUPTI here?)")
        if ctx.cuda and others:
            raise Fail(f"no kernel named nccl or onerank, but on other streams: {others}")
        ours = r.get("events_ms", r.get("reducer_ms"))
        sampled = (f", {r['sampled_steps']}/{r['steps']} steps sampled"
                   if "sampled_steps" in r else "")
        raise Skip(f"no communication kernel to compare ({r['shape']}; timed "
                   f"{ours:.2f} ms{sampled}){'' if ctx.cuda else ': CPU rehearsal'}")
    return r


def _within(ours: float, theirs: float, words: str) -> float:
    ratio = ours / theirs
    if abs(ratio - 1) > 0.10:
        raise Fail(words + f" (ratio {ratio:.3f}): more than 10% apart")
    return ratio


def sync_timing(ctx: Ctx) -> Outcome:
    """The comm hook's CUDA-event sync time against torch.profiler's kernel time of NCCL's
    all-reduce kernels (bench/gpu_sync_check.py), within 10%."""
    ctx.need_cuda()
    r = _sync_check(ctx, "hook")
    words = (f"events {r['events_ms']:.2f} ms vs profiler {r['kernel_ms']:.2f} ms over "
             f"{r['shape']}; kernels {r['kernels']}")
    ratio = _within(r["events_ms"], r["kernel_ms"], words)
    return Outcome(f"{words} (ratio {ratio:.3f})",
                   {"events_ms": r["events_ms"], "kernel_ms": r["kernel_ms"], "ratio": ratio})


def sync_timing_reducer(ctx: Ctx) -> Outcome:
    """DDP's reducer timers (the default sync source) against the span of each step's NCCL
    kernels in torch.profiler's trace (bench/gpu_sync_check.py --source reducer), within
    10%."""
    ctx.need_cuda()
    r = _sync_check(ctx, "reducer")
    if r["span_ms"] is None:
        raise Fail("no communication kernel could be placed in a step (the profiler's "
                   f"correlation ids); kernels {r['kernels']}")
    if r["sampled_steps"] < r["steps"]:
        raise Fail(f"DDP's reducer timed {r['sampled_steps']} of {r['steps']} steps "
                   "(sample rate 1)")
    words = (f"reducer {r['reducer_ms']:.2f} ms vs the kernels' step spans {r['span_ms']:.2f}"
             f" ms (kernel time {r['kernel_ms']:.2f} ms) over {r['shape']}")
    ratio = _within(r["reducer_ms"], r["span_ms"], words)
    return Outcome(f"{words} (ratio {ratio:.3f})",
                   {"reducer_ms": r["reducer_ms"], "span_ms": r["span_ms"],
                    "kernel_ms": r["kernel_ms"], "ratio": ratio})


def doctor(ctx: Ctx) -> Outcome:
    """``python -m ddp_engine doctor --json``: its verdict and the all-reduce bandwidth."""
    ctx.need_cuda()
    log = ctx.work / "doctor.log"
    argv = [ctx.python, "-m", "ddp_engine", "doctor", "--json", "--device", ctx.device,
            "--runs-dir", str(ctx.work / "doctor")]
    if not ctx.cuda:
        argv += ["--seconds", "1"]
    rc = run_command(ctx, argv, log, marker=str(ctx.work / "doctor"), stdout_only=True)
    try:
        report = json.loads(log.read_text(encoding="utf-8"))
    except ValueError:
        raise Fail(f"exit code {rc}; its output is not one JSON object",
                   tail_lines(log.with_suffix(".err"), 15) + tail_lines(log, 10)) from None
    m = report.get("measurement") or {}
    sizes = m.get("sizes") or [{}]
    best = max(sizes, key=lambda s: s.get("algbw_gbs") or 0)
    words = (f"exit code {rc}, {report.get('verdict') or report.get('reason')}; "
             f"{len(report.get('warnings') or [])} warning(s); world size {m.get('world_size')} "
             f"({m.get('backend')}): best algbw {best.get('algbw_gbs') or 0:.1f} GB/s at "
             f"{(best.get('size_bytes') or 0) / 2**20:,.0f} MiB, best busbw "
             f"{m.get('best_busbw_gbs') or 0:.1f} GB/s")
    if rc != 0 or not report.get("ok", rc == 0):
        raise Fail(words, tail_lines(log.with_suffix(".err"), 15))
    return Outcome(words, {"best_busbw_gbs": m.get("best_busbw_gbs"),
                           "best_algbw_gbs": best.get("algbw_gbs")})


def quiet_cores(sample_s: float = 1.0) -> list[int]:
    """The less busy half (at least 4) of the cores this process may use, by a short sample
    of each core's load: where the benchmark's ranks are least disturbed."""
    mine = sorted(os.sched_getaffinity(0))
    load = psutil.cpu_percent(interval=sample_s, percpu=True)
    ranked = sorted(mine, key=lambda c: (load[c] if c < len(load) else 100.0, c))
    return sorted(ranked[:max(4, len(mine) // 2)]) if len(mine) > 4 else mine


def overhead(ctx: Ctx) -> Outcome:
    """bench/telemetry_overhead.py (2 CPU ranks, gloo: the engine's per-step costs on this
    machine's CPUs), plain DDP loop against the engine's defaults, pinned to quiet cores."""
    ctx.need_cuda()
    cores = quiet_cores()
    out = ctx.work / "overhead.json"
    reps = "3" if ctx.cuda else "1"
    argv = [ctx.python, str(REPO / "bench" / "telemetry_overhead.py"), "--reps", reps,
            "--variants", "plain,on", "--json", str(out)]
    rc = run_command(ctx, argv, ctx.work / "overhead.log", marker="telemetry_overhead.py",
                     preexec=lambda: os.sched_setaffinity(0, cores))
    if rc != 0 or not out.is_file():
        raise Fail(f"bench/telemetry_overhead.py exited with {rc}",
                   tail_lines(ctx.work / "overhead.log", 15))
    results = json.loads(out.read_text())[0]["results"]
    ratios = [on / plain for on, plain in zip(results["on"], results["plain"], strict=True)]
    median = statistics.median(ratios)
    return Outcome(f"on cores {_ranges(cores)}: engine (defaults) / plain DDP loop "
                   f"{median:.3f} ({min(ratios):.3f}..{max(ratios):.3f}, {reps} paired "
                   f"repetitions; plain {statistics.median(results['plain']):,.0f} samples/s; "
                   f"docs/BENCHMARKS.md's target 0.97)",
                   {"ratio": median, "cores": _ranges(cores)})


def _ranges(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5``."""
    runs: list[list[int]] = []
    for c in cores:
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


FLIGHT_RECORDER_CODE = r"""
import json, os, socket, sys
from pathlib import Path
from ddp_engine.common.flight_recorder import recorder_env
folder = Path(sys.argv[1])
os.environ.update(recorder_env(folder, environ={}))
import torch, torch.distributed as dist
from torch._C import _distributed_c10d as c10d
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)
x = torch.ones(1 << 20, device="cuda")
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
dump = next(getattr(c10d, n) for n in ("_dump_nccl_trace", "_dump_fr_trace") if hasattr(c10d, n))
(folder / "ranks").mkdir(parents=True, exist_ok=True)
(folder / "ranks" / "nccl_trace_rank_0").write_bytes(dump())
dist.destroy_process_group()
print(json.dumps({"ok": True}))
"""


def flight_recorder(ctx: Ctx) -> Outcome:
    """NCCL's flight recorder as the launcher turns it on: a real dump of 5 all-reduces on this
    GPU, read by ddp_engine.common.flight_recorder (the format a timeout's dump has)."""
    ctx.need_cuda()
    if not ctx.cuda:
        raise Skip("needs NCCL: CPU rehearsal")
    from ddp_engine.common import flight_recorder as fr

    folder = ctx.work / "flight-recorder"
    python_json(ctx, FLIGHT_RECORDER_CODE, str(folder), timeout_s=ctx.timeout_s)
    dumps = fr.read_dumps(folder)
    if 0 not in dumps:
        raise Fail(f"no readable dump in {folder / 'ranks'}")
    seen = fr.collectives(dumps[0])
    ops = sorted({fr.op_name(e) for e in seen.values()})
    states = sorted({str(e.get("state")) for e in seen.values()})
    words = (f"{len(seen)} collectives of the default group in rank 0's dump ({', '.join(ops)};"
             f" states {', '.join(states)}); verdict {fr.verdict(dumps)!r}")
    if len(seen) < 5 or "all_reduce" not in ops or fr.verdict(dumps) is not None:
        raise Fail(words + ": expected 5 completed all_reduces and no verdict")
    return Outcome(words, {"flight_recorder_entries": len(seen)})
