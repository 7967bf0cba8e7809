"""The part of ``make gpu-check`` that profiles (issue 31): a live nccl run asked for a
profile of 2 steps as a user asks (``python -m ddp_engine profile RUN --steps 2 --wait``); its
traces must hold NCCL kernels, each collective the ranks called matched to its kernel, and the
summary read on the GPU's timeline."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.gpu_check_base import Ctx, Fail, Outcome, end_leftovers, wait_until
from ddp_engine.common.profile_files import profile_folders, traces
from ddp_engine.common.profile_summary import write_summary
from ddp_engine.common.profile_trace import read_rank
from ddp_engine.common.run_dir import iter_metrics, tail_lines


def profile_part(ctx: Ctx) -> Outcome:
    ctx.need_cuda()
    run = ctx.work / "profile"
    argv = [ctx.python, "-m", "ddp_engine", "launch", "--device", ctx.device,
            "--max-steps", "10000000", "--log-every", "10", "--run-dir", str(run)]
    if not ctx.cuda:
        argv += ["--nproc", "2"]
    log = run.with_suffix(".log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=ctx.env(),
                                start_new_session=True)
    try:
        if not wait_until(lambda: any(m["type"] == "metrics" for m in iter_metrics(run)),
                          min(120.0, ctx.timeout_s - 60)):
            raise Fail("no training report within 120 s", tail_lines(log, 15))
        asked = subprocess.run([ctx.python, "-m", "ddp_engine", "profile", str(run), "--steps",
                                "2", "--wait", "--timeout", "90"], capture_output=True,
                               text=True, env=ctx.env(), timeout=120)
        if asked.returncode != 0:
            raise Fail(f"profile exited with {asked.returncode}",
                       (asked.stdout + asked.stderr).splitlines()[-15:])
        return _read(ctx, profile_folders(run)[-1], asked.stdout)
    finally:
        subprocess.run([ctx.python, "-m", "ddp_engine", "stop", str(run), "--timeout", "60"],
                       capture_output=True, env=ctx.env(), timeout=90)
        proc.kill()
        proc.wait(timeout=10)
        end_leftovers(str(run))


def _read(ctx: Ctx, folder: Path, printed: str) -> Outcome:
    summary = write_summary(folder)
    calls = matched = kernels = 0
    for rank, path in traces(folder).items():
        t = read_rank(path, rank)
        kernels += sum(1 for k in t.gpu if k.name.startswith("nccl"))
        mine = [c for c in t.calls if c.group != "rankscope"]
        calls += len(mine)
        matched += sum(1 for c in mine if c.exec_span is not None)
    want = "gpu" if ctx.cuda else "cpu"
    if summary["timeline"] != want:
        raise Fail(f"the summary read the {summary['timeline']} timeline, not the {want}'s")
    if ctx.cuda and not kernels:
        raise Fail("no NCCL kernel in the traces", printed.splitlines()[-20:])
    if not calls or matched < calls:
        raise Fail(f"{matched} of the {calls} collectives called were matched to their "
                   "execution (NCCL kernel or gloo thread)", printed.splitlines()[-20:])
    r = summary["per_rank"][0]
    parts = sum(r["parts_ms"].values())
    if abs(parts - r["step_time_ms"]) > 0.1 * r["step_time_ms"]:
        raise Fail(f"the parts add up to {parts:.2f} ms, the step is {r['step_time_ms']:.2f}")
    words = (f"{kernels} NCCL kernels in {len(traces(folder))} traces; {matched}/{calls} "
             f"collectives matched to their kernels; step {r['step_time_ms']:.2f} ms = "
             + ", ".join(f"{k} {v:.2f}" for k, v in r["parts_ms"].items())
             + f"; comm {r['comm_ms']:.2f} ms, overlapped "
             f"{100 * (r['comm_overlapped_share'] or 0):.0f}%")
    return Outcome(words, {"step_ms": r["step_time_ms"], "parts_ms": r["parts_ms"],
                           "comm_ms": r["comm_ms"], "nccl_kernels": kernels,
                           "matched": f"{matched}/{calls}"})
