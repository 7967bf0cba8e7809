"""The parts of ``make gpu-check`` that run a user's own script, unchanged, on the GPU (nccl):
each once under plain torchrun and once under Rankscope, compared (issue 28's promise: the same
outputs), and one stopped by ``ddp_engine stop`` at an agreed step with a checkpoint.

- ``script-example``: examples/ddp_train.py (the tutorial recipe: nccl, ``set_device``,
  ``DDP(device_ids=[local_rank])``) for 2 epochs, then again until stopped.
- ``script-lightning``: the matrix's PyTorch Lightning script with ``accelerator="gpu"``;
  skipped where pytorch-lightning is not installed (the GPU machine has only torch,
  nvidia-ml-py, psutil and pytest).

On a CPU rehearsal (``--device cpu``, no CUDA visible) the same scripts pick gloo by
themselves, so the same comparisons run.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from bench.gpu_check_base import (
    REPO,
    Ctx,
    Fail,
    Outcome,
    Skip,
    end_leftovers,
    processes_mentioning,
    python_json,
    run_command,
    wait_until,
)
from bench.gpu_check_runs import ended, rank0_rows, run_start
from ddp_engine.common.run_dir import read_status, tail_lines

EXAMPLE = REPO / "examples" / "ddp_train.py"
LIGHTNING = REPO / "tests" / "ddp_engine" / "rank" / "scripts" / "lightning_train.py"
DETERMINISTIC = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
"""What ``torch.use_deterministic_algorithms`` (Lightning's ``deterministic=True``) needs of
cuBLAS on a GPU; set for both runs of a pair alike."""

WEIGHTS_CODE = """
import json, sys, torch
a, b = (torch.load(p, map_location="cpu", weights_only=True) for p in sys.argv[1:3])
a = a.get("state_dict", a) if isinstance(a, dict) else a
b = b.get("state_dict", b) if isinstance(b, dict) else b
same = sorted(a) == sorted(b)
diff = max(((a[k].float() - b[k].float()).abs().max().item() for k in a), default=0.0) \\
    if same else None
print(json.dumps({"same_keys": same, "keys": len(a), "max_abs_diff": diff}))
"""

STOP_CODE = """
import json, sys, torch
state = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
print(json.dumps({"step": state.get("step"), "source": state.get("source"),
                  "model_tensors": len(state.get("model") or {})}))
"""

TOLERANCE = 1e-5
"""Largest weight difference allowed between the two runs of a pair (fp32; the same seeds,
the same device: the same kernels)."""


def torchrun_argv(ctx: Ctx, script: Path, *args: str) -> list[str]:
    return [ctx.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
            str(script), *args]


def rankscope_argv(ctx: Ctx, run: Path, script: Path, *args: str,
                   log_every: int = 10) -> list[str]:
    return [ctx.python, "-m", "ddp_engine", "launch", "--script", str(script), "--nproc", "1",
            "--run-dir", str(run), "--log-every", str(log_every), "--", *args]


def rank0_output(run: Path) -> str:
    """What rank 0's script printed under Rankscope (its stdout log in the run folder)."""
    found = sorted(run.rglob("0/stdout.log"))
    return found[-1].read_text(errors="replace") if found else ""


def _watched(ctx: Ctx, run: Path) -> tuple[str, dict[str, Any]]:
    """What Rankscope saw of the run on rank 0: its device, sync timing, the losses."""
    rows = rank0_rows(run)
    if not rows:
        raise Fail("no report from rank 0", tail_lines(run.with_suffix(".log"), 15))
    devices = {r.get("device") for r in rows}
    if ctx.cuda and not all(isinstance(d, str) and d.startswith("GPU") for d in devices):
        raise Fail(f"rank 0's device was {sorted(map(str, devices))}, expected its GPU named "
                   "as NVML names it (GPU N)")
    if ctx.cuda and not any(r.get("gpu_mem_used_bytes") for r in rows):
        raise Fail("no GPU memory reading in rank 0's reports")
    synced = [r["sync_time_s"] for r in rows if r.get("sync_time_s") is not None]
    words = (f"{len(rows)} reports on {sorted(map(str, devices))[0]}, sync timed in "
             f"{len(synced)}")
    return words, {"reports": len(rows), "synced_reports": len(synced)}


def _same_weights(ctx: Ctx, plain: Path, watched: Path) -> float:
    if not plain.is_file() or not watched.is_file():
        raise Fail(f"a run wrote no weights: {plain} {plain.is_file()}, {watched} "
                   f"{watched.is_file()}")
    seen = python_json(ctx, WEIGHTS_CODE, str(plain), str(watched))
    if not seen["same_keys"] or seen["max_abs_diff"] > TOLERANCE:
        raise Fail(f"the final weights differ from plain torchrun's: {seen}")
    return float(seen["max_abs_diff"])


def _pair(ctx: Ctx, name: str, script: Path, out_args: tuple[str, str], *args: str,
          env: dict[str, str] | None = None, log_every: int = 10) -> tuple[Path, Path, Path]:
    """The script under plain torchrun, then under Rankscope; each writes to its own place
    (``out_args``: the flag, and the file or folder name it takes). Returns the plain log,
    the run folder and the two outputs' folder."""
    folder = ctx.work / name
    folder.mkdir(parents=True, exist_ok=True)
    flag, leaf = out_args
    plain_log = folder / "torchrun.log"
    rc = run_command(ctx, torchrun_argv(ctx, script, flag, str(folder / "plain" / leaf), *args),
                     plain_log, marker=str(folder), env=ctx.env(**(env or {})),
                     timeout_s=ctx.timeout_s / 2)
    if rc != 0:
        raise Fail(f"under plain torchrun the script failed (exit code {rc})",
                   tail_lines(plain_log, 15))
    run = folder / "run"
    rc = run_command(ctx, rankscope_argv(ctx, run, script, flag,
                                         str(folder / "watched" / leaf), *args,
                                         log_every=log_every),
                     run.with_suffix(".log"), marker=str(run), env=ctx.env(**(env or {})))
    ended(ctx, run, rc)
    return plain_log, run, folder


EPOCH_LINE = re.compile(r"epoch (\d+): mean loss ([0-9.]+)")


def script_example(ctx: Ctx) -> Outcome:
    """examples/ddp_train.py, 2 epochs, under torchrun and under Rankscope: the same epoch
    losses and final weights; Rankscope saw the rank's GPU; then a run stopped by
    ``ddp_engine stop`` at one step, with a checkpoint and nothing left."""
    ctx.need_cuda()
    (ctx.work / "example" / "plain").mkdir(parents=True, exist_ok=True)
    (ctx.work / "example" / "watched").mkdir(parents=True, exist_ok=True)
    args = ("--epochs", "2", "--samples", "8192")
    plain_log, run, folder = _pair(ctx, "example", EXAMPLE, ("--checkpoint", "model.pt"),
                                   *args)
    plain = EPOCH_LINE.findall(plain_log.read_text(errors="replace"))
    watched = EPOCH_LINE.findall(rank0_output(run))
    if len(plain) != 2 or plain != watched:
        raise Fail(f"epoch losses: plain torchrun {plain}, under Rankscope {watched}")
    diff = _same_weights(ctx, folder / "plain" / "model.pt", folder / "watched" / "model.pt")
    words, numbers = _watched(ctx, run)
    stop = _stopped(ctx, folder)
    return Outcome(f"completed ({run_start(run).get('backend')}), epoch losses "
                   f"{', '.join(v for _, v in plain)} as under plain torchrun, weights within "
                   f"{diff:.1e}; {words}; {stop}", {**numbers, "max_abs_diff": diff})


def _stopped(ctx: Ctx, folder: Path) -> str:
    """The example until stopped: ``ddp_engine stop`` after two reports; it ends stopped at
    one step, rank 0's checkpoint is that step's, no process of the run is left."""
    run = folder / "stopped"
    argv = rankscope_argv(ctx, run, EXAMPLE, "--epochs", "100000", "--checkpoint",
                          str(folder / "never.pt"))
    log = run.with_suffix(".log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=ctx.env(),
                                cwd=REPO, start_new_session=True)
    try:
        if not wait_until(lambda: len(rank0_rows(run)) >= 2, min(90.0, ctx.timeout_s / 3)):
            raise Fail("no two reports from the run to stop", tail_lines(log, 15))
        asked = subprocess.run([ctx.python, "-m", "ddp_engine", "stop", str(run)],
                               capture_output=True, text=True, env=ctx.env(), cwd=REPO,
                               timeout=60)
        if asked.returncode != 0:
            raise Fail(f"ddp_engine stop exited {asked.returncode}",
                       (asked.stdout + asked.stderr).splitlines()[-10:])
        rc = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        raise Fail("the stopped run had not ended 90 s after the stop", tail_lines(log, 15)) \
            from None
    finally:
        proc.kill()
        proc.wait(timeout=10)
    status = read_status(run) or {}
    if rc != 0 or status.get("state") != "stopped":
        raise Fail(f"after the stop: exit code {rc}, state {status.get('state')}: "
                   f"{status.get('reason')}", tail_lines(log, 15))
    saved = python_json(ctx, STOP_CODE, str(run / "checkpoints" / "last.pt"))
    if saved["step"] != status.get("step") or saved["source"] != "script" or \
            not saved["model_tensors"]:
        raise Fail(f"the stop checkpoint {saved} is not the script's at step "
                   f"{status.get('step')}")
    left = processes_mentioning(str(run))
    if left:
        end_leftovers(str(run))
        raise Fail(f"processes of the stopped run left: {[p.pid for p in left]}")
    return (f"stopped by ddp_engine stop at step {status['step']} with its checkpoint, no "
            "process left")


LIGHTNING_CHECK = "import pytorch_lightning; print('{}')"


def script_lightning(ctx: Ctx) -> Outcome:
    """The matrix's Lightning script on the GPU (``Trainer(accelerator="gpu", devices=1,
    strategy="ddp")``) under torchrun and under Rankscope: the same weights, and the loss
    Rankscope shows is the one Lightning logs."""
    ctx.need_cuda()
    try:
        python_json(ctx, LIGHTNING_CHECK, timeout_s=60)
    except Fail:
        raise Skip("pytorch-lightning is not installed here") from None
    accelerator = "gpu" if ctx.cuda else "cpu"
    _, run, folder = _pair(ctx, "lightning", LIGHTNING, ("--out", "."), "--accelerator",
                           accelerator, "--devices", "1", "--epochs", "2",
                           env=DETERMINISTIC, log_every=1)
    diff = _same_weights(ctx, folder / "plain" / "weights.pt",
                         folder / "watched" / "weights.pt")
    logged = python_json(ctx, "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))",
                         str(folder / "watched" / "losses.json"))
    shown = {r["step"]: r["loss"] for r in rank0_rows(run)}
    off = [(s, v, logged.get(str(s))) for s, v in shown.items()
           if str(s) in logged and abs(v - logged[str(s)]) > 1e-4 * max(1.0, abs(v))]
    if off or not set(map(str, shown)) & set(logged):
        raise Fail(f"the loss shown is not Lightning's: (step, shown, logged) {off[:5]}; "
                   f"{len(shown)} shown, {len(logged)} logged")
    words, numbers = _watched(ctx, run)
    return Outcome(f"completed ({run_start(run).get('backend')}), weights within {diff:.1e} "
                   f"of plain torchrun's, the loss shown = Lightning's at {len(shown)} steps; "
                   f"{words}", {**numbers, "max_abs_diff": diff})
