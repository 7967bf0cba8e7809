"""What the window says about a run, without Qt: the status line of a finished run, the failure
message, a run opened from its record, a resume loaded into the form, the attach fields.

The window (app/main_window.py) shows these texts; tests call them directly, without a window.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_files import load_config_file
from ddp_engine.common.protocol import Connection, ProtocolError, check_address
from ddp_engine.common.reasons import one_line
from ddp_engine.common.run_dir import CONFIG_FILE, read_json, read_status
from ddp_engine.common.runs import RunSummary

REMOTE_LOGS_NOTE = ("This run's rank 0 is on another machine: its ranks' logs are there, in "
                    "RUN_DIR/logs/ (nothing to follow here).")


def plural(n: int, noun: str) -> str:
    """``n`` and ``noun``, in the plural unless n is 1: "1 run folder", "3 run folders"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def steps_text(step: int | None, total_steps: int | None) -> str:
    """A run's step and length: "step 120/500", or "step 120" when its length is unknown (a
    user's own script)."""
    if step is None:
        return "no step yet"
    return f"step {step}/{total_steps}" if total_steps else f"step {step}"


def progress_text(step: int, total_steps: int | None, epoch: int, eta: str,
                  ended: str | None = None) -> str:
    """The dashboard's progress line: the step of the total, the epoch and the ``eta`` (worded
    by the caller). Where the length is unknown (a user's script) there is no ETA to give, and
    epoch 0 says nothing (a script that never calls DistributedSampler.set_epoch). A run that
    ``ended`` (its state) says that instead of an ETA."""
    epoch_text = f"  epoch {epoch}" if epoch or total_steps else ""
    if ended:
        return f"{steps_text(step, total_steps)}{epoch_text}  {ended}"
    if total_steps:
        return f"{steps_text(step, total_steps)}{epoch_text}  ETA {eta}"
    return steps_text(step, None) + epoch_text + "  (length unknown: no ETA)"


UNAVAILABLE_NAMES = {"sync": "gradient sync timing",
                     "samples": "throughput (samples/s) and forward time",
                     "loss": "the loss"}
"""The items of an "unavailable" event (what a script run cannot show), in words."""


def unavailable_text(items: Mapping[str, str], script: str | None = None) -> str:
    """What a script run cannot show and why, in one line ("" when it shows everything):
    "Not measured for train.py: gradient sync timing (the script registered ...)"."""
    if not items:
        return ""
    return (f"Not measured for {Path(script).name if script else 'this script'}: "
            + "; ".join(f"{UNAVAILABLE_NAMES.get(k, k)} ({why})" for k, why in items.items()))


def warning_text(last: Mapping[str, Any] | None, count: int) -> str | None:
    """The latest ``warning`` event of a run (a loss spike, a non-finite loss, ...) in words,
    with how many of the ``count`` came before it; None when there was none."""
    if last is None:
        return None
    earlier = count - 1
    return (f"warning: {last.get('message') or 'no message'}"
            + (f" ({plural(earlier, 'earlier warning')})" if earlier else ""))


def parse_remote(host: str, port: str, token: str) -> tuple[str, int, str]:
    """The attach dialog's text fields as (host, port, token).

    Raises:
        ValueError: naming the field, the value and what is allowed.
    """
    host, port, token = host.strip(), port.strip(), token.strip()
    try:
        port_number = int(port)
    except ValueError:
        raise ValueError(f"port must be a whole number between 1 and 65535, got {port!r}") \
            from None
    check_address(host, port_number, token)
    return host, port_number, token


def stop_by() -> str:
    """How this window names itself in the stop it sends (``{"type": "stop", "by": ...}``): the
    run's reason then says who stopped it, in every viewer and in status.json."""
    return f"the Rankscope window (pid {os.getpid()} on {socket.gethostname()})"


SHOWN_REASON_CHARS = 1000
"""A reason the window shows is cut to this: the launcher writes one line, whose exception part
is cut already, but a run recorded by an older Rankscope may hold kilobytes."""


def reason_text(reason: str, limit: int = SHOWN_REASON_CHARS) -> str:
    """A run's reason as this window words it, on one line (:func:`one_line`, cut to
    ``limit``): its own stop is "stopped from this window"."""
    return one_line(reason.replace(f"stop command from {stop_by()}", "stopped from this window"),
                    limit)


def remote_refusal(host: str, port: int, token: str, timeout_s: float) -> tuple[str, str] | None:
    """Try a remote rank 0's address and token (a welcome within ``timeout_s``). None when it
    takes this window; else why not, as a status line and as a message box's text."""
    try:
        Connection.to(host, port, token, timeout_s=timeout_s).close()
    except (ProtocolError, OSError) as e:
        return str(e), (f"Rank 0 at {host}:{port} did not take this window:\n\n{e}\n\n"
                        "Check that the port is forwarded (ssh -L), or that the run was "
                        "started with --monitor-host (an address reachable from here), and "
                        "that the token is the "
                        "one in RUN_DIR/monitor.json on rank 0's machine. The run you were "
                        "watching is still shown.")
    return None


def finished_text(result: Mapping[str, Any]) -> str:
    """The status-bar line for a run that ended, beside the state (which the state label
    shows): its step, reason, and what is left of it."""
    remote = result.get("remote")
    step = result.get("step")
    text = f"at step {step}" if step is not None else "ended"
    if result.get("reason"):
        text += f": {reason_text(str(result['reason']))}"
    leftover = result.get("leftover_pids") or []
    text += (f" | rank 0 was at {remote}; the run's processes are on that machine (not "
             "checked from here)" if remote else
             f" | {len(leftover)} processes of the run could not be ended: {leftover}"
             if leftover else " | no process of the run is left")
    held = result.get("gpu_leftovers") or []
    if held:
        text += (" | NVML still lists " + ", ".join(f"pid {h.get('pid')} on GPU "
                                                   f"{h.get('gpu')}" for h in held))
    return text


def failure_text(result: Mapping[str, Any]) -> str:
    """The message of the "Run failed" box: the reason, how each rank ended, its log's end;
    for a value the ranks refused (a ConfigError), its one line and nothing more."""
    reason = reason_text(str(result.get("reason") or "the run failed"))
    if "ConfigError: " in reason:
        return (reason.replace("ConfigError: ", "") + "\n\nThe ranks refused this value before "
                "training: nothing was trained. Fix it in the form and start again.")
    codes = result.get("exit_codes") or {}
    detail = ", ".join(
        f"rank {r}: " + (f"signal {d['signal']}" if d.get("signal") else
                         f"exit code {d.get('exit_code')}")
        for r, d in sorted((result.get("ranks") or {}).items())) or ", ".join(
        f"rank {r}: exit code {c}" for r, c in sorted(codes.items()))
    remote = result.get("remote")
    logs = (f"The ranks' logs are on rank 0's machine ({remote}), in RUN_DIR/logs/." if remote
            else f"Last lines of rank {result.get('log_rank')}'s log:\n"
                 + "\n".join(result.get("log_tail") or []))
    return f"{reason}\n\n{detail}\n\n{logs}"


def record_text(path: Path, summary: RunSummary, step: int | None) -> str:
    """The status-bar line for a run drawn from its record (not live)."""
    return (f"{path.name}: {summary.state} at step {step} (from its record)"
            + (f"; it ran on {summary.hostname}" if summary.hostname else "")
            + (f": {reason_text(summary.reason)}" if summary.reason
               and summary.state != "completed"
               else ""))


def left_text(run_dir: Path | None, remote: str | None) -> str:
    """What became of the run the window stopped watching to show another."""
    if remote:
        return f"the run of rank 0 at {remote} goes on without this window"
    return (f"{run_dir.name if run_dir else 'the run'} keeps training in the background "
            "(Runs panel: live)")


def resume_config(path: Path, runs_dir: Path) -> tuple[RunConfig, str]:
    """The config that resumes the run in ``path`` from its last checkpoint, into a new run
    folder under ``runs_dir``, and the line that says so.

    Raises:
        ValueError: why it cannot be resumed (no config or checkpoint, a config that no longer
            validates).
    """
    ckpt = path / "checkpoints" / "last.pt"
    data = read_json(path / CONFIG_FILE)
    if not isinstance(data, dict) or not ckpt.is_file():
        raise ValueError(f"cannot resume {path.name}: it has no config.json and "
                         "checkpoints/last.pt")
    try:
        cfg = RunConfig.from_dict(data, source=str(path / CONFIG_FILE))
    except ConfigError as e:
        raise ValueError(f"cannot resume {path.name}: {e}") from None
    cfg = dataclasses.replace(cfg, resume=str(ckpt), run_dir=None, dry_run=False,
                              runs_dir=str(runs_dir))
    step = (read_status(path) or {}).get("step")
    hint = ""
    if isinstance(step, int) and cfg.max_steps is not None and cfg.max_steps <= step:
        hint = f"; raise Max steps above {step} to train further"
    return cfg, (f"resume of {path.name} from step {step} loaded in the form: edit if needed, "
                 f"then Start (F5){hint}")


SETTINGS_KEY = "last_form"
"""Where the last form is remembered in the app's settings."""
RUNS_DIR_KEY = "runs_dir"
"""Where the runs folder is remembered (an absolute path)."""


def preset_runs_dir(path: str | None) -> str | None:
    """The runs folder a preset file names, if it names one (and parses)."""
    if not path:
        return None
    try:
        value = load_config_file(path).get("runs_dir")
    except ConfigError:
        return None  # loading the preset says what is wrong with it
    return value if isinstance(value, str) and value.strip() else None


def choose_runs_dir(command_line: str | None, preset: str | None,
                    remembered: str | None) -> str:
    """The runs folder the window opens on: the command line's ``--runs-dir``, else the one the
    ``--config`` preset names, else the one used last, else ./runs."""
    return next((d for d in (command_line, preset, remembered) if d), "runs")


def save_form(settings: Any, cfg: RunConfig) -> None:
    """Remember ``cfg`` as the form to show at the next start (a QSettings, or anything with
    its ``setValue`` and ``sync``); a resume is for one start only, so it is dropped."""
    settings.setValue(SETTINGS_KEY, dataclasses.replace(cfg, resume=None).to_json())
    settings.sync()


def restored_form(settings: Any) -> RunConfig | None:
    """The remembered form, or None when there is none or it no longer validates (settings of
    an older version: the form keeps its defaults)."""
    raw = settings.value(SETTINGS_KEY)
    if not raw:
        return None
    try:
        return RunConfig.from_dict(json.loads(str(raw)), source="settings")
    except (ConfigError, ValueError):
        return None
