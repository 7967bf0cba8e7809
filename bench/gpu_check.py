"""``make gpu-check``: everything that needs a GPU, checked in one command, written to
docs/GPU.md.

    PYTHONPATH=. make gpu-check                 # = python3 bench/gpu_check.py
    python3 bench/gpu_check.py [--out docs/GPU.md] [--parts run-fp32,resume] [--deadline-s 450]

In order: the environment's facts; real runs on one GPU with nccl in fp32, bf16 and fp16 (the
gradient scaler), each with the model FLOPs utilization (MFU) it shows; the resume of the fp32
run's CUDA checkpoint; the sync timing of the comm hook's CUDA events against torch.profiler's
communication kernel time, and that of DDP's reducer timers (the default) against each step's
span of communication kernels (each within 10%); a profile of 2 steps asked of a live run
(``ddp_engine profile``), its NCCL kernels matched to the collectives called; the launcher
SIGKILLed mid-run with no process and no GPU memory left; NVML's fields present and
plausible, and each run's GPU identity matching NVML; a user's own script unchanged
(examples/ddp_train.py, a Lightning script) under plain torchrun and under Rankscope,
compared, and stopped (bench/gpu_check_scripts.py);
``doctor``; every test marked cuda; the monitoring-overhead benchmark on the machine's quieter
cores.

It needs only a Python with torch (nvidia-ml-py, psutil and pytest as well): no virtual
environment, no network, no Qt (the Qt tests are left out when PySide6 is absent). Each part
has its own time limit, and the whole check a deadline (500 s) after which the parts left
are skipped; a part that fails is recorded and the next one runs. The exit code is 0 when no
part failed. Where there is no CUDA device the GPU parts are skipped ("no CUDA device");
``--device cpu`` rehearses them with CPU ranks instead (a test of this script, not of a GPU).
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import gpu_check_profile as profile  # noqa: E402
from bench import gpu_check_runs as runs  # noqa: E402
from bench import gpu_check_scripts as scripts  # noqa: E402
from bench import gpu_check_tools as tools  # noqa: E402
from bench.gpu_check_base import Ctx, Fail, Outcome, Skip, end_leftovers  # noqa: E402

DEADLINE_S = 500.0
"""Within one device call's 10 minutes, with time to write the report and end what is left."""


@dataclass(frozen=True)
class Part:
    name: str
    what: str
    """The check in words, the report's first column."""
    run: Callable[[Ctx], Outcome]
    limit_s: float
    """Its own time limit (a part that hangs is ended there)."""
    min_s: float = 20.0
    """Below this much time left of the deadline it is skipped instead of started."""


PARTS: tuple[Part, ...] = (
    Part("environment", "Python, torch, CUDA, NCCL, driver, Qt", tools.environment, 90, 5),
    Part("run-fp32", "a real run: 1 GPU, nccl, fp32", runs.real_run("fp32"), 150),
    Part("run-bf16", "a real run: bf16 autocast", runs.real_run("bf16"), 150),
    Part("run-fp16", "a real run: fp16 with the gradient scaler", runs.real_run("fp16"), 150),
    Part("resume", "resume of the fp32 run's CUDA checkpoint", runs.resume, 150),
    Part("sync-timing", "comm hook's CUDA events vs torch.profiler's kernel time",
         tools.sync_timing, 120),
    Part("sync-reducer", "DDP's reducer timers vs each step's NCCL kernel span",
         tools.sync_timing_reducer, 120),
    Part("profile", "a profile of 2 steps: NCCL kernels found, matched to their collectives",
         profile.profile_part, 150, 60),
    Part("launcher-sigkill", "launcher SIGKILLed: no process, no GPU memory left",
         runs.launcher_sigkill, 180, 60),
    Part("flight-recorder", "NCCL's flight recorder: a real dump, read back",
         tools.flight_recorder, 90),
    Part("nvml", "NVML fields present and plausible; runs' GPU identity", runs.nvml_fields,
         30, 5),
    Part("script-example", "examples/ddp_train.py unchanged: as under torchrun; stopped",
         scripts.script_example, 200, 60),
    Part("script-lightning", "a Lightning script on the GPU: as under torchrun",
         scripts.script_lightning, 150, 40),
    Part("doctor", "python -m ddp_engine doctor --json", tools.doctor, 150),
    Part("pytest-cuda", "every test marked cuda (pytest -m cuda)", tools.pytest_cuda, 330, 60),
    Part("overhead", "monitoring overhead (bench/telemetry_overhead.py), quiet cores",
         tools.overhead, 150, 60),
)


@dataclass
class Record:
    name: str
    what: str
    status: str
    """passed, failed or skipped."""
    seconds: float
    details: str
    numbers: dict[str, Any] = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)


def run_part(part: Part, ctx: Ctx, deadline: float, chosen: set[str] | None) -> Record:
    """One part, timed, its result or failure recorded whatever it raises."""
    left = deadline - time.monotonic()
    if chosen is not None and part.name not in chosen and part.name != "environment":
        return Record(part.name, part.what, "skipped", 0.0, "not selected (--parts)")
    if left < part.min_s:
        return Record(part.name, part.what, "skipped", 0.0,
                      f"out of time ({max(0.0, left):.0f} s left of the check's deadline)")
    ctx.timeout_s = min(part.limit_s, left)
    started = time.monotonic()
    tail: list[str] = []
    try:
        outcome = part.run(ctx)
        status, details, numbers = "passed", outcome.details, outcome.numbers
    except Skip as e:
        status, details, numbers = "skipped", str(e), {}
    except Fail as e:
        status, details, numbers, tail = "failed", str(e), {}, e.tail
    except Exception as e:  # a bug of the check itself: recorded, and the next part runs
        status, details, numbers = "failed", f"{type(e).__name__}: {e}", {}
        tail = traceback.format_exc().splitlines()[-12:]
    finally:
        end_leftovers(str(ctx.work))
    return Record(part.name, part.what, status, time.monotonic() - started, details, numbers,
                  tail)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(records: list[Record], ctx: Ctx, took_s: float, deadline_s: float) -> str:
    """docs/GPU.md: the machine, one row per part, the key numbers and failures' output."""
    f = ctx.facts
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    failed = [r for r in records if r.status == "failed"]
    verdict = f"{len(failed)} failed" if failed else "nothing failed"
    lines = [
        "# Rankscope on a GPU machine",
        "",
        f"Written by `make gpu-check` (bench/gpu_check.py) on {now}; do not edit by hand. It "
        f"took {took_s:.0f} s (deadline {deadline_s:.0f} s): {verdict}, "
        f"{sum(r.status == 'passed' for r in records)} passed, "
        f"{sum(r.status == 'skipped' for r in records)} skipped."
        + (" A CPU rehearsal (`--device cpu`): it checks this script, not a GPU."
           if not ctx.cuda else ""),
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| GPUs (NVML) | {', '.join(f.get('gpus') or []) or 'none'} |",
        f"| CUDA device (torch) | {f.get('device_name', 'none')}"
        f"{' (sm ' + str(f['capability']) + ')' if f.get('capability') else ''} |",
        f"| driver | {f.get('driver')} (CUDA {f.get('driver_cuda')}) |",
        f"| torch | {f.get('torch')} (CUDA {f.get('torch_cuda')}, NCCL {f.get('nccl')}) |",
        f"| Python | {f.get('python')} ({f.get('executable')}) |",
        f"| CPU cores | {f.get('cores')} |",
        f"| Qt (PySide6, pyqtgraph, pytest-qt) | "
        f"{'present' if f.get('qt') else 'absent: the Qt tests were not run'} |",
        "",
        "## Checks",
        "",
        "| check | what | status | seconds | what it saw |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| `{r.name}` | {r.what} | {r.status} | {r.seconds:.0f} | {_cell(r.details)} |"
              for r in records]
    lines += ["", "## Key numbers", ""] + key_numbers(records)
    for r in failed:
        if r.tail:
            lines += ["", f"## `{r.name}`: its output", "", "```text", *r.tail, "```"]
    return "\n".join(lines) + "\n"


def key_numbers(records: list[Record]) -> list[str]:
    n = {r.name: r.numbers for r in records}
    out = []
    for name in ("run-fp32", "run-bf16", "run-fp16"):
        if n.get(name):
            mfu = (f", MFU {n[name]['mfu_pct']:.2g}%" if "mfu_pct" in n[name] else "")
            out.append(f"- {name}: {n[name]['samples_per_s']:,.0f} samples/s, step "
                       f"{n[name]['step_ms']:.2f} ms, sync {n[name]['sync_ms']:.3f} ms "
                       f"(median of rank 0's reports); model FLOPs "
                       f"{n[name].get('achieved_tflops', 0):.3g} TFLOP/s{mfu}")
    if n.get("sync-timing"):
        s = n["sync-timing"]
        out.append(f"- sync time by CUDA events / by profiler kernels: {s['ratio']:.3f} "
                   f"({s['events_ms']:.2f} / {s['kernel_ms']:.2f} ms)")
    if n.get("sync-reducer"):
        s = n["sync-reducer"]
        out.append(f"- sync time by DDP's reducer timers / by the steps' kernel spans: "
                   f"{s['ratio']:.3f} ({s['reducer_ms']:.2f} / {s['span_ms']:.2f} ms)")
    if n.get("doctor"):
        out.append(f"- doctor: best algbw {n['doctor']['best_algbw_gbs'] or 0:.1f} GB/s, "
                   f"best busbw {n['doctor']['best_busbw_gbs'] or 0:.1f} GB/s")
    if n.get("overhead"):
        out.append(f"- monitoring overhead, engine / plain loop: {n['overhead']['ratio']:.3f} "
                   f"(cores {n['overhead']['cores']})")
    if n.get("launcher-sigkill"):
        out.append(f"- after the launcher's SIGKILL, nothing of the run left in "
                   f"{n['launcher-sigkill']['after_kill_s']} s")
    return out or ["- none (no part that measures passed)"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "GPU.md",
                        help="where the report goes (default: docs/GPU.md)")
    parser.add_argument("--parts", help="comma-separated part names to run (default: all): "
                        + ", ".join(p.name for p in PARTS))
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S,
                        help=f"parts not started by then are skipped (default: {DEADLINE_S:g})")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: rehearse the GPU parts with CPU ranks (tests this script)")
    parser.add_argument("--work", type=Path, help="keep run folders and logs here (default: a "
                        "temporary folder, removed at the end)")
    args = parser.parse_args(argv)
    chosen = set(args.parts.split(",")) if args.parts else None
    unknown = sorted((chosen or set()) - {p.name for p in PARTS})
    if unknown:
        parser.error(f"--parts: unknown part(s) {', '.join(unknown)}; the parts are "
                     + ", ".join(p.name for p in PARTS))
    if args.work is not None and args.work.is_dir() and any(args.work.iterdir()):
        parser.error(f"--work: {args.work} is not empty; give a new folder (the runs of a "
                     "check must not meet an earlier check's)")
    work = args.work or Path(tempfile.mkdtemp(prefix="rankscope-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(python=sys.executable, work=work, device=args.device)
    started = time.monotonic()
    deadline = started + args.deadline_s
    records = []
    try:
        for part in PARTS:
            print(f"== {part.name}: {part.what}", flush=True)
            record = run_part(part, ctx, deadline, chosen)
            records.append(record)
            print(f"   {record.status} ({record.seconds:.0f} s): {record.details}", flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    took = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(records, ctx, took, args.deadline_s), encoding="utf-8")
    failed = [r.name for r in records if r.status == "failed"]
    print(f"\n{len(records) - len(failed)} of {len(records)} parts did not fail "
          f"({took:.0f} s); {'failed: ' + ', '.join(failed) if failed else 'none failed'}; "
          f"written to {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
