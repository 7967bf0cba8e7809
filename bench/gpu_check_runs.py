"""The parts of ``make gpu-check`` that train: real runs in fp32, bf16 and fp16, the resume of
a CUDA checkpoint, the launcher SIGKILLed mid-run, and NVML's fields against what the runs
recorded. Each part is a function of the check's context that returns an Outcome or raises
Skip or Fail (bench/gpu_check_base.py)."""

from __future__ import annotations

import math
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.gpu_check_base import (
    Ctx,
    Fail,
    Outcome,
    Skip,
    end_leftovers,
    engine,
    processes_mentioning,
    python_json,
    wait_until,
)
from ddp_engine.common.gpu_peaks import PRECISIONS, flops_words, peak_flops
from ddp_engine.common.gpus import GpuInfo, Nvml, gpu_processes, list_gpus
from ddp_engine.common.run_dir import iter_metrics, read_rank_files, read_status, tail_lines

STEPS = 300
"""Steps of each real run (the resume continues to twice as many)."""
COMMON = ("--nproc", "1", "--model", "mlp", "--log-every", "25")

SCALER_CODE = """
import json, sys, torch
state = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
print(json.dumps({"scaler": state.get("scaler") or None, "step": state.get("step")}))
"""


def rank0_rows(run: Path) -> list[dict[str, Any]]:
    """Rank 0's entry of every metrics report, with the report's step added."""
    return [{**m["ranks"][0], "step": m["step"]} for m in iter_metrics(run)
            if m.get("type") == "metrics" and m.get("ranks")]


def run_start(run: Path) -> dict[str, Any]:
    return next((m for m in iter_metrics(run) if m.get("kind") == "run_start"), {})


def ended(ctx: Ctx, run: Path, rc: int) -> dict[str, Any]:
    """status.json of a run that must have completed on nccl (a script's may say
    ``cpu:gloo,cuda:nccl``), else Fail with the launcher's tail."""
    status = read_status(run) or {}
    if rc != 0 or status.get("state") != "completed":
        raise Fail(f"exit code {rc}, state {status.get('state')}: "
                   f"{status.get('reason') or 'see the output'}",
                   tail_lines(run.with_suffix(".log"), 15))
    backend = run_start(run).get("backend")
    if ctx.cuda and "nccl" not in str(backend):
        raise Fail(f"backend {backend!r}, expected nccl")
    return status


def throughput(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over the reports after the first (start-up left out), and the loss's ends."""
    later = rows[1:] or rows
    losses = [r["loss"] for r in rows]
    if not losses or not all(math.isfinite(v) for v in losses):
        raise Fail(f"losses not all finite: {losses[:3]}...{losses[-3:]}")
    sync = [r["sync_time_s"] for r in later if r.get("sync_time_s") is not None]
    return {"samples_per_s": statistics.median(r["samples_per_s"] for r in later),
            "step_ms": 1000 * statistics.median(r["step_time_s"] for r in later),
            "sync_ms": 1000 * statistics.median(sync) if sync else math.nan,
            "loss_first": losses[0], "loss_last": losses[-1]}


def step_flops(run: Path, numbers: dict[str, float]) -> str:
    """The FLOPs the run counted for a step (its ``flops`` event) over its median step time,
    as the dashboard shows them: achieved FLOP/s, and MFU against the GPU's dense peak where
    the table knows the GPU. Adds ``achieved_tflops`` (and ``mfu_pct``) to ``numbers``."""
    event = next((m for m in iter_metrics(run) if m.get("kind") == "flops"), None)
    count = event.get("flops_per_step") if event else None
    if not isinstance(count, int | float) or not count > 0:
        raise Fail(f"the run published no usable flops event: {event}")
    achieved = count / (numbers["step_ms"] / 1000)
    numbers["achieved_tflops"] = achieved / 1e12
    name = ((event or {}).get("gpus") or [None])[0]
    if not isinstance(name, str):
        return f"; {flops_words(achieved)} of model FLOPs (CPU: no peak)"
    precision = (event or {}).get("precision")
    peak = peak_flops(name, precision) if precision in PRECISIONS else None
    if peak is None:
        return (f"; {flops_words(achieved)} of model FLOPs (peak unknown for {name} in "
                f"{precision})")
    numbers["mfu_pct"] = 100 * achieved / peak.flops_per_s
    return (f"; {flops_words(achieved)} of model FLOPs = MFU {numbers['mfu_pct']:.2g}% of "
            f"{peak.words}")


def real_run(precision: str) -> Callable[[Ctx], Outcome]:
    """The part that trains STEPS steps in ``precision`` on one GPU with nccl."""

    def part(ctx: Ctx) -> Outcome:
        ctx.need_cuda()
        if precision == "fp16" and not ctx.cuda:
            raise Skip("fp16 needs CUDA (CPU rehearsal)")
        run = ctx.work / f"run-{precision}"
        rc = engine(ctx, run, "--device", ctx.device, "--precision", precision,
                    "--max-steps", str(STEPS), *COMMON)
        status = ended(ctx, run, rc)
        n = throughput(rank0_rows(run))
        if not n["loss_last"] < n["loss_first"]:
            raise Fail(f"the loss did not go down: {n['loss_first']:.3f} -> "
                       f"{n['loss_last']:.3f}")
        words = (f"completed {status.get('step')} steps ({run_start(run).get('backend')}), "
                 f"{n['samples_per_s']:,.0f} samples/s, step {n['step_ms']:.2f} ms, sync "
                 f"{n['sync_ms']:.3f} ms, loss {n['loss_first']:.3f} -> {n['loss_last']:.3f}")
        words += step_flops(run, n)
        if precision == "fp16":
            saved = python_json(ctx, SCALER_CODE, str(run / "checkpoints" / "last.pt"))
            scale = (saved.get("scaler") or {}).get("scale")
            if not isinstance(scale, (int, float)) or not scale > 0:
                raise Fail(f"the checkpoint holds no gradient scaler state: {saved}")
            n["grad_scale"] = float(scale)
            words += f"; GradScaler scale {scale:g} in the checkpoint"
        ctx.runs[f"run-{precision}"] = run
        return Outcome(words, n)

    return part


def resume(ctx: Ctx) -> Outcome:
    """The fp32 run's last checkpoint, resumed to twice its steps."""
    ctx.need_cuda()
    first = ctx.runs.get("run-fp32")
    if first is None:
        raise Skip("needs the checkpoint of run-fp32, which did not pass")
    saved = int((read_status(first) or {}).get("checkpoint_step") or 0)
    run = ctx.work / "resume"
    rc = engine(ctx, run, "--device", ctx.device, "--resume",
                str(first / "checkpoints" / "last.pt"), "--max-steps", str(2 * STEPS), *COMMON)
    status = ended(ctx, run, rc)
    start, rows = run_start(run).get("start_step"), rank0_rows(run)
    if start != saved or not rows or rows[0]["step"] <= saved or status.get("step") != 2 * STEPS:
        raise Fail(f"started at step {start} (checkpoint of step {saved}), first report at "
                   f"step {rows[0]['step'] if rows else None}, ended at {status.get('step')}")
    before = rank0_rows(first)
    if not rows[0]["loss"] < before[0]["loss"]:
        raise Fail(f"the resumed loss {rows[0]['loss']:.3f} is not below the first run's "
                   f"start {before[0]['loss']:.3f}: the weights were not restored")
    ctx.runs["resume"] = run
    return Outcome(f"continued at step {start} (loss {before[-1]['loss']:.3f} at the save, "
                   f"{rows[0]['loss']:.3f} {rows[0]['step'] - saved} steps later) and "
                   f"completed at {status['step']}", {"start_step": start})


def _nvml_pids() -> set[int]:
    return {p.pid for p in gpu_processes() or []}


def _mem_used() -> int:
    with Nvml() as nv:
        return sum(nv.read(nv.handle(g.index)).mem_used_bytes or 0 for g in list_gpus())


def launcher_sigkill(ctx: Ctx) -> Outcome:
    """A long run, its launcher SIGKILLed once rank 0 reports GPU readings: within 30 s no
    process of the run is left and NVML lists none of it (no GPU memory held)."""
    ctx.need_cuda()
    run = ctx.work / "sigkill"
    before_pids, before_mem = _nvml_pids(), _mem_used()
    argv = [ctx.python, "-m", "ddp_engine", "launch", "--device", ctx.device, "--nproc", "1",
            "--max-steps", "10000000", "--log-every", "10", "--run-dir", str(run)]
    log = run.with_suffix(".log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=ctx.env(),
                                start_new_session=True)
    try:
        def reported() -> bool:
            rows = rank0_rows(run)
            return bool(rows) and (not ctx.cuda or any(r.get("gpu_mem_used_bytes") is not None
                                                        for r in rows))

        if not wait_until(reported, min(120.0, ctx.timeout_s - 45)):
            raise Fail("no training report with GPU readings within 120 s", tail_lines(log, 15))
        ranks = [d["pid"] for d in read_rank_files(run).values()]
        held = _nvml_pids() - before_pids
        held_mib = (_mem_used() - before_mem) / 2**20
        killed = time.monotonic()
        proc.kill()
        proc.wait(timeout=10)
        left = wait_until(lambda: not processes_mentioning(str(run)), 30)
        if not left:
            raise Fail(f"30 s after the SIGKILL these processes of the run are alive: "
                       f"{[p.pid for p in processes_mentioning(str(run))]}")
        words = (f"rank pid {ranks}; launcher SIGKILLed at step {rank0_rows(run)[-1]['step']}; "
                 f"{time.monotonic() - killed:.1f} s later no process of the run was left")
        if ctx.cuda:
            words += _gpu_released(held, held_mib, before_mem, killed)
        ctx.runs["launcher-sigkill"] = run
        return Outcome(words, {"after_kill_s": round(time.monotonic() - killed, 1)})
    finally:
        proc.kill()
        proc.wait(timeout=10)
        end_leftovers(str(run))


def _gpu_released(held: set[int], held_mib: float, before_mem: int, killed: float) -> str:
    """NVML's side of the SIGKILL check: the run's compute processes gone (by NVML's pids,
    which in a container are the host's), or, where NVML lists none, the memory back."""
    left_s = max(1.0, 30 - (time.monotonic() - killed))
    if held:
        still = wait_until(lambda: not (held & _nvml_pids()), left_s)
        if not still:
            raise Fail(f"NVML still lists the run's processes {sorted(held & _nvml_pids())} "
                       "30 s after the kill")
        return (f"; NVML listed {len(held)} process(es) of the run holding {held_mib:,.0f} MiB "
                f"and, {time.monotonic() - killed:.1f} s after the kill, none")
    back = wait_until(lambda: _mem_used() <= before_mem + 256 * 2**20, left_s)
    if not back:
        raise Fail(f"NVML lists no process of the run and GPU memory used is "
                   f"{(_mem_used() - before_mem) / 2**20:,.0f} MiB above what it was before it")
    return (f"; NVML lists no process (its pids are not visible here), GPU memory used was "
            f"{held_mib:,.0f} MiB above the start while it ran and back within 256 MiB after")


def _in_range(util: Any, used: Any, total: Any, temp: Any, power: Any) -> list[str]:
    """What is missing or implausible of one GPU reading: utilization 0..100 %, memory used
    above 0 and at most the total, temperature 10..110 C, power above 0 (and below 3 kW)."""
    wrong = []
    if util is None or not 0 <= util <= 100:
        wrong.append(f"utilization {util}")
    if used is None or total is None or not 0 < used <= total:
        wrong.append(f"memory used {used} of {total}")
    if temp is None or not 10 <= temp <= 110:
        wrong.append(f"temperature {temp} C")
    if power is None or not 0 < power < 3000:
        wrong.append(f"power {power} W")
    return wrong


def _plausible(g: GpuInfo, nv: Nvml) -> list[str]:
    r = nv.read(nv.handle(g.index))
    return _in_range(r.util_pct, r.mem_used_bytes, r.mem_total_bytes, r.temp_c, r.power_w)


def nvml_fields(ctx: Ctx) -> Outcome:
    """NVML's readings of each GPU in their ranges, and each run's GPU identity and readings
    (metrics.jsonl) matching what NVML says of that GPU."""
    ctx.need_cuda()
    if not ctx.cuda:
        raise Skip("NVML reads GPUs (CPU rehearsal)")
    gpus = list_gpus()
    if not gpus:
        raise Fail("NVML lists no GPU, though torch can use CUDA")
    wrong: list[str] = []
    with Nvml() as nv:
        for g in gpus:
            wrong += [f"{g.label}: {w}" for w in _plausible(g, nv)]
        reading = nv.read(nv.handle(gpus[0].index))
    by_uuid = {g.uuid: g for g in gpus}
    checked = []
    for name, run in ctx.runs.items():
        rows = [r for r in rank0_rows(run) if r.get("gpu_mem_used_bytes") is not None]
        entry = (rows or rank0_rows(run) or [{}])[-1]
        ident: dict[str, Any] = entry["gpu"] if isinstance(entry.get("gpu"), dict) else {}
        gpu = by_uuid.get(str(ident.get("uuid")))
        want = None if gpu is None else {"index": gpu.index, "uuid": gpu.uuid,
                                         "name": gpu.name, "pci_bus_id": gpu.pci_bus_id}
        if gpu is None or entry.get("device") != f"GPU {gpu.index}" or ident != want:
            wrong.append(f"{name}: device {entry.get('device')!r}, gpu {entry.get('gpu')}")
        elif rows:
            wrong += [f"{name}'s metrics: {w}" for w in _in_range(
                entry.get("gpu_util_pct"), entry.get("gpu_mem_used_bytes"),
                entry.get("gpu_mem_total_bytes"), entry.get("gpu_temp_c"),
                entry.get("gpu_power_w"))]
        checked.append(f"{name}{'' if rows else ' (no reading in its metrics)'}")
    if wrong:
        raise Fail("; ".join(wrong))
    return Outcome(f"{len(gpus)} GPU(s), {gpus[0].label}: util {reading.util_pct:.0f}%, memory "
                   f"{(reading.mem_used_bytes or 0) / 2**30:.1f} of "
                   f"{(reading.mem_total_bytes or 0) / 2**30:.0f} GiB, "
                   f"{reading.temp_c:.0f} C, {reading.power_w:.0f} W; identity and readings "
                   f"of {', '.join(checked) or 'no run'} match NVML",
                   {"gpus": len(gpus), "power_w": reading.power_w, "temp_c": reading.temp_c})
