"""The launcher: validate, write the run folder, run torchrun in-process, report, clean up.

The launcher process *is* torchrun's elastic agent: it builds a torchrun command line, parses it
with torchrun's own parser and runs it through ``torch.distributed.run.run``. The agent starts
one worker per device (each in its own session); on a stop signal it forwards it to them and
waits for them. The launcher keeps SIGINT/SIGTERM/SIGHUP for itself (torchrun handles only
SIGQUIT here, see LauncherSignals) so that a second signal can force. The shutdown timeout is
the launcher's, not the agent's: the run monitor SIGKILLs ranks that outlive it, except while
one saves a checkpoint (:mod:`ddp_engine.launch.shutdown`). Around that the launcher:

- validates the config against this machine before anything starts (exit 2 on bad input);
- keeps RUN_DIR/status.json current from a monitor thread and prints progress lines;
- turns the agent's outcome into a final state (completed, stopped, failed) with a reason
  (a collective timeout said as one, with where the heartbeats left each rank);
- sweeps every process of the run (SIGTERM, then SIGKILL) so none outlives it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from ddp_engine.common import gpus
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_values import NODE_RANK_ENV
from ddp_engine.common.flight_recorder import read_dumps, verdict
from ddp_engine.common.heartbeat import failure_hint, read_heartbeats
from ddp_engine.common.lifeline import named_signal
from ddp_engine.common.processes import terminate_then_kill
from ddp_engine.common.protocol import MONITOR_FILE
from ddp_engine.common.reasons import error_reason, one_line
from ddp_engine.common.rendezvous import rendezvous_reason, wait_for_host
from ddp_engine.common.run_dir import (
    CONFIG_FILE,
    atomic_write_json,
    failed_rank_log,
    rank_log_files,
    read_rank_files,
    remove_partial_writes,
)
from ddp_engine.launch.monitor import RunMonitor, StatusFile, fmt_mib
from ddp_engine.launch.node_watch import NodeWatch
from ddp_engine.launch.plan import Plan, plan_launch
from ddp_engine.launch.shutdown import AGENT_SHUTDOWN_S, ShutdownClock
from ddp_engine.launch.signals import SWEEP_GRACE_S, LauncherSignals
from ddp_engine.launch.timeouts import timeout_part, watchdog_line

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_FORCED = 130


@contextlib.contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    """Set the workers' variables in this (launcher) process for the duration of the run."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


AFTER_ROOT_CHARS = 120
"""How much of a failed rank's error the reason quotes after the root cause's."""
_SOURCE_PLACE = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|cu|h|hpp):\d+\]\s*")
"""A C++ source place in an error (gloo's "[/__w/pytorch/.../pair.cc:537] ")."""


def _failure_reason(failures: dict[int, Any], root: int, logs: dict[int, Path] | None = None,
                    timeout_s: float = 0.0) -> tuple[str, dict[str, Any]]:
    """A one-line reason naming each failed rank (the root cause first), and per-rank exit
    details. Ranks as the run numbers them (see :func:`_our_rank`). Ranks that died of a
    collective timeout (SIGABRT, or NCCL's watchdog in their log of ``logs``) are said so, once
    for all of them (:mod:`ddp_engine.launch.timeouts`). A rank's exception is its first line,
    cut, naming its log of ``logs`` when the whole text is longer
    (:func:`ddp_engine.common.reasons.error_reason`)."""
    parts: list[str] = []
    details: dict[str, Any] = {}
    texts = set()
    timed_out: list[int] = []
    lines: list[str] = []
    signalled = False
    for rank, f in sorted(failures.items(), key=lambda kv: (kv[0] != root, kv[0])):
        exitcode = int(f.exitcode)
        entry: dict[str, Any] = {"exit_code": exitcode, "pid": f.pid}
        details[str(rank)] = entry
        line = watchdog_line((logs or {}).get(rank))
        if exitcode < 0:
            entry["signal"] = f.signal_name()
        if line is not None or entry.get("signal") == "SIGABRT":
            entry["collective_timeout"] = True
            signalled = signalled or exitcode < 0
            lines += [line] if line is not None else []
            if not timed_out:
                parts.append("")  # the timed-out ranks' place: where the first of them is
            timed_out.append(rank)
        elif exitcode < 0:
            parts.append(f"rank {rank} was killed by signal {f.signal_name()}")
        else:
            raw = f.message
            if isinstance(raw, dict):  # torch's error file: {"message": ..., "extraInfo": ...}
                raw = raw.get("message")
            text = (error_reason(raw, (logs or {}).get(rank)) if one_line(raw)
                    else f"exit code {exitcode}")
            entry["error"] = text
            texts.add(text)
            # After the root cause, a rank's own error is most often its consequence (gloo's
            # "Connection reset by peer"): briefly; the whole of it is in "ranks" and its log.
            said = text if rank == root else one_line(
                _SOURCE_PLACE.sub("", one_line(raw)), AFTER_ROOT_CHARS)
            parts.append(f"rank {rank} failed: {said}")
    if timed_out:
        part = timeout_part(timed_out, signalled, lines[0] if lines else None, timeout_s)
        parts[parts.index("")] = part
    elif len(failures) > 1 and len(texts) == 1 and len(parts) == len(failures) and all(
            "error" in d for d in details.values()):  # every rank says the same: once
        return f"ranks {', '.join(sorted(details, key=int))} failed: {texts.pop()}", details
    return "; ".join(parts), details


def _our_rank(torchrun_rank: int, cfg: RunConfig) -> int:
    """A rank of this node as the run numbers it (node_rank * nproc + local rank) from
    torchrun's number for it (the rendezvous's node order, which may differ)."""
    nproc = cfg.nproc or 1
    return cfg.node_rank * nproc + torchrun_rank % nproc if cfg.multi_node else torchrun_rank


def _rank_error(run_dir: Path) -> str | None:
    """The first exception a rank recorded in its rank file, if any, on one line (naming the
    rank's log when its whole text is longer)."""
    for rank, data in sorted(read_rank_files(run_dir).items()):
        if data.get("state") == "failed" and one_line(data.get("error")):
            return f"rank {rank} raised " + error_reason(data["error"],
                                                         rank_log_files(run_dir).get(rank))
    return None


def launch(cfg: RunConfig, *, out: TextIO = sys.stdout) -> int:
    """Run a whole launch. Returns the process exit code (0 completed or stopped)."""
    # Handlers first, before status.json exists: whoever sees status.json may signal us, and a
    # stop that early must end the run as "stopped during start-up", not kill the launcher.
    signals = LauncherSignals()
    signals.install()
    try:
        plan = plan_launch(cfg, create_run_dir=not cfg.dry_run)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for note in plan.notes:  # on stderr for a dry run: its stdout is the command and config
        print(f"[rankscope] {note}", file=sys.stderr if cfg.dry_run else out, flush=True)
    if cfg.dry_run:
        print(plan.command(), file=out)
        print(plan.cfg.to_json(), file=out)
        return EXIT_OK

    run_dir = Path(plan.cfg.run_dir or ".")
    for old in [*(run_dir / "ranks").glob("rank-*.json"), run_dir / MONITOR_FILE]:
        old.unlink(missing_ok=True)  # left by an earlier run in this folder
    atomic_write_json(run_dir / CONFIG_FILE, plan.cfg.to_dict())
    status = StatusFile(run_dir, run_dir=str(run_dir), nproc=plan.cfg.nproc, device=plan.device,
                        command=plan.command())
    print(f"[rankscope] run folder {run_dir}", file=out, flush=True)
    print(f"[rankscope] {plan.command()}", file=out, flush=True)
    if plan.cfg.multi_node:
        print(f"[rankscope] node {plan.cfg.node_rank} of {plan.cfg.nnodes}: meeting the other "
              f"nodes at {plan.cfg.rdzv_endpoint} (rendezvous {plan.cfg.rendezvous_id()})",
              file=out, flush=True)
    monitor = RunMonitor(run_dir, status, out, world_size=plan.cfg.nproc or 1,
                         node_rank=plan.cfg.node_rank)
    signals.monitor = monitor
    signals.grace.timeout_s = plan.cfg.shutdown_timeout_s
    monitor.shutdown = ShutdownClock(plan.cfg.shutdown_timeout_s, monitor.say)
    monitor.stop_signalled = lambda: signals.agent_signals > 0
    monitor.stop_requests = signals.poll_once
    monitor.asked_signal = lambda: signals.asked.name if signals.asked else None
    ending = _Ending(plan, run_dir, status, monitor, signals, out)
    if plan.cfg.multi_node:
        ending.watch = NodeWatch(plan.cfg, plan.cfg.local_addr)
        ending.watch.start()
        monitor.each_poll.append(partial(_cut_off_if_lost, ending))
    monitor.start()

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args
    from torch.distributed.run import run as torchrun

    signals.exception_type = SignalException
    final: dict[str, Any] = {}
    code = EXIT_FAILED
    try:
        # Node K: node 0's store answering first (or why not, said at once: torchrun would
        # retry its connection silently for two minutes).
        unreachable = wait_for_host(plan.cfg, monitor.say, lambda: bool(signals.seen))
        if signals.seen:
            raise SignalException("stop requested during start-up",
                                  signal.Signals[signals.seen[0]])
        if unreachable:
            raise RendezvousUnreachable(unreachable)
        signals.phase = "agent"
        if not plan.cfg.multi_node:
            os.environ.pop(NODE_RANK_ENV, None)  # this launcher's own environment
        with _environment({**plan.env, "PET_SIGNALS_TO_HANDLE": "SIGQUIT"}):
            agent_args = parse_args(plan.torchrun_args)  # in the environment: PET_* defaults
            agent_args.shutdown_timeout = AGENT_SHUTDOWN_S  # the monitor keeps the run's own
            torchrun(agent_args)
        final = {"state": "completed"}
        code = EXIT_OK
    except ChildFailedError as e:
        if signals.forced:  # the ranks died of the forced stop: a stop, said as forced below
            final = {"state": "stopped", "stop_signal": signals.seen[-1]}
        else:
            root, _ = e.get_first_failure()  # the earliest failure: the likely root cause
            root = _our_rank(root, plan.cfg)
            reason, details = _failure_reason(
                {_our_rank(r, plan.cfg): f for r, f in e.failures.items()}, root,
                rank_log_files(run_dir), plan.cfg.dist_timeout_s)
            final = {"state": "failed", "reason": reason, "ranks": details, "root_rank": root}
    except SignalException as e:
        final = {"state": "stopped", "stop_signal": e.sigval.name}
        code = EXIT_OK
    except RendezvousUnreachable as e:
        final = {"state": "failed", "reason": str(e)}
    except Exception as e:  # rendezvous or agent failure
        final = {"state": "failed", "reason": rendezvous_reason(e, plan.cfg)
                 or "launcher: " + one_line(f"{type(e).__name__}: {e}")}
    finally:
        if ending.watch is not None:  # lost nodes as the agent returned (the store goes now)
            ending.watch.freeze()
        # Held until the process exits: when the monitor thread ends this node without the
        # agent (node 0 lost), the agent may return meanwhile, and must not end it twice.
        ending.lock.acquire()
        signals.phase = "done"
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)  # torchrun's handler for it would raise
        monitor.request_stop()
        monitor.join()
        monitor.poll_once(scan_processes=True)
        leftover = terminate_then_kill(monitor.procs.values(), SWEEP_GRACE_S)
    return _conclude(ending, final, code, leftover)


class RendezvousUnreachable(Exception):
    """Node 0's rendezvous store did not answer this node in time (the reason in words)."""


@dataclasses.dataclass
class _Ending:
    """What ending a launch takes, and the right to do it (:attr:`lock`): the main thread's
    once the agent has returned, or the monitor thread's when the agent hangs on a node 0 that
    the network lost (:func:`_cut_off_if_lost`)."""

    plan: Plan
    run_dir: Path
    status: StatusFile
    monitor: RunMonitor
    signals: LauncherSignals
    out: TextIO
    watch: NodeWatch | None = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def _cut_off_if_lost(ending: _Ending) -> None:
    """From the monitor thread: once node 0 is lost and this node's ranks have all ended,
    end this node now (torch's agent would wait on node 0's store for good)."""
    assert ending.watch is not None
    lost = ending.watch.cut_off()
    if lost is None or not ending.lock.acquire(blocking=False):
        return
    code = EXIT_FAILED
    try:  # whatever happens here, this process ends: the lock is never given back
        ending.monitor.say(f"{lost}: this node's ranks have ended; ending without torchrun's "
                           "agent, which waits on node 0")
        ending.signals.phase = "done"
        leftover = terminate_then_kill(ending.monitor.procs.values(), SWEEP_GRACE_S)
        states = {d.get("state") for d in _node_ranks(ending.plan, ending.run_dir).values()}
        if states in ({"completed"}, {"stopped"}):  # node 0 lost after the ranks' own end
            final = {"state": states.pop()}
        else:
            final = {"state": "failed", "reason": _rank_error(ending.run_dir) or (
                f"this node's ranks ended ({', '.join(map(str, states))})" if states
                else "node 0 was lost before this node's ranks started training")}
        code = _conclude(ending, final, code, leftover, hard_exit=True)
    except Exception as e:  # noqa: BLE001 - said, and the run recorded failed if it can be
        with contextlib.suppress(Exception):
            ending.status.update(state="failed", ended=time.time(), reason=f"{lost}; ending "
                                 f"this node failed: {one_line(f'{type(e).__name__}: {e}')}")
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _node_range(plan: Plan) -> range:
    """This node's ranks, as the run numbers them."""
    world = plan.cfg.nproc or 1
    return range(plan.cfg.node_rank * world, (plan.cfg.node_rank + 1) * world)


def _node_ranks(plan: Plan, run_dir: Path) -> dict[int, dict[str, Any]]:
    """This node's rank files, by global rank. Only this node's: a node started without a
    folder of its own (a plain torchrun script) writes its ranks' files into rank 0's."""
    mine = _node_range(plan)
    return {r: d for r, d in read_rank_files(run_dir).items() if r in mine}


def _conclude(ending: _Ending, final: dict[str, Any], code: int, leftover: list[int],
              hard_exit: bool = False) -> int:
    """The run's final state and reason from the agent's outcome (``final``, ``code``) and
    what the ranks wrote: status.json written, the end printed. Returns the exit code.
    ``hard_exit``: the caller ends the process with os._exit (no wait for the node watch)."""
    plan, run_dir, monitor, signals = ending.plan, ending.run_dir, ending.monitor, ending.signals
    status, out = ending.status, ending.out
    signals_seen = signals.seen

    mine = _node_range(plan)
    ranks = _node_ranks(plan, run_dir)
    states = {r: d.get("state") for r, d in ranks.items()}
    step = max([d["step"] for d in ranks.values() if isinstance(d.get("step"), int)]
               + [monitor.last_step])
    all_ranks = len(states) == len(mine)
    if final.get("state") in ("completed", "stopped"):
        # Stopped by a signal: torchrun's (escalated, the agent raised) or the agreed stop it
        # asked for (the agent then ended normally).
        stop_signal = final.get("stop_signal") or (signals.asked.name if signals.asked else None)
        signalled = stop_signal is not None
        final.pop("stop_signal", None)
        if signalled:
            final["stop_signal"] = stop_signal
        if all_ranks and all(s == "stopped" for s in states.values()):
            why = (monitor.stop_reason or next((d["reason"] for d in ranks.values()
                                                if d.get("reason")), None)
                   or f"signal {stop_signal}")
            why = named_signal(why, signals.asked.name if signals.asked else None)
            final = {"state": "stopped", "reason": f"stop requested ({why}); all ranks stopped "
                     f"at step {step}", **({"stop_signal": stop_signal} if signalled else {})}
            code = EXIT_OK
        elif all_ranks and all(s == "completed" for s in states.values()):
            final = {"state": "completed"}
            code = EXIT_OK
        elif _rank_error(run_dir):
            final = {"state": "failed", "reason": _rank_error(run_dir)}
            code = EXIT_FAILED
        elif signalled and not states:
            final = {"state": "stopped", "stop_signal": stop_signal,
                     "reason": f"stopped during start-up ({stop_signal}), before any "
                               "rank started training"}
            code = EXIT_OK
        elif signalled:
            final["state"] = "stopped"
            unclean = sorted(set(mine) - {r for r, s in states.items() if s == "stopped"})
            final.update(forced=True, reason=f"forced stop ({', '.join(signals_seen)}): ranks "
                         f"{unclean} were killed before they stopped cleanly")
            code = EXIT_FORCED
        else:
            final = {"state": "failed", "reason": "torchrun ended but the ranks reported "
                     f"{states or 'nothing'}"}
            code = EXIT_FAILED
    elif final.get("state") == "failed" and "rank" not in final.get("reason", "rank"):
        final["reason"] = _rank_error(run_dir) or final["reason"]
    errors = {str(d.get("error")) for d in ranks.values()}
    agreed = False
    if final.get("state") == "failed" and len(errors) == 1 and all(
            d.get("state") == "failed" for d in ranks.values()):
        (error,) = errors
        if error.startswith("RunFailed: "):
            # Every rank stopped cleanly and says why the run failed (a node's launcher
            # died): that, not how torchrun saw its ranks exit.
            final["reason"] = one_line(error.removeprefix("RunFailed: "))
            agreed = True
    lost = ending.watch.lost_text() if ending.watch is not None else None
    if final.get("state") == "failed" and lost and not agreed:  # what the ranks' error hides
        final["reason"] = f"{lost}; {final['reason']}"
    timed_out = any(d.get("collective_timeout") for d in (final.get("ranks") or {}).values())
    hint = monitor.hang_hint or (failure_hint(read_heartbeats(run_dir)) if timed_out else None)
    if final.get("state") == "failed" and hint:  # which rank the others waited for, and where
        final["reason"] += ("; before it failed, the run was stalled: " if monitor.hang_hint
                            else "; the heartbeats when it failed: ") + hint
    recorded = verdict(read_dumps(run_dir)) if final.get("state") == "failed" else None
    if recorded:  # NCCL's flight recorder dumped at a collective timeout
        final["flight_recorder"] = recorded
        final["reason"] += "; NCCL's flight recorder: " + recorded
    if leftover:
        final["swept_pids"] = leftover
    if plan.device == "cuda":  # processes gone by psutil; the GPUs must agree
        pids = set(monitor.procs) | {d["pid"] for d in ranks.values()
                                     if isinstance(d.get("pid"), int)}
        held = gpus.gpu_leftovers(pids)
        if held:
            final["gpu_leftovers"] = [dataclasses.asdict(h) for h in held]
            print("[rankscope] warning: NVML still lists processes of this run on a GPU: "
                  + ", ".join(f"pid {h.pid} on GPU {h.gpu} ({fmt_mib(h.used_bytes)})"
                              for h in held), file=out, flush=True)
    # Every process of the run is gone: a temp file in checkpoints/ is from a save that was
    # killed (last.pt itself is the previous checkpoint, intact).
    partial = remove_partial_writes(run_dir / "checkpoints")
    if partial:
        final["removed_partial_checkpoints"] = sorted(p.name for p in partial)
    exit_codes = {str(r): (0 if s in ("completed", "stopped") else None) for r, s in states.items()}
    for r, d in (final.get("ranks") or {}).items():
        exit_codes[r] = d.get("exit_code")
    status.update(step=step, exit_codes=exit_codes, ended=time.time(), stall=None, **final)
    if ending.watch is not None:
        ending.watch.close(str(final.get("state")), wait=not hard_exit)
    _report_end(run_dir, status.data, out)
    return code


def _report_end(run_dir: Path, data: dict[str, Any], out: TextIO) -> None:
    state = data.get("state")
    line = f"[rankscope] {state} at step {data.get('step')}"
    if data.get("reason"):
        line += f": {data['reason']}"
    print(line, file=out, flush=True)
    if data.get("checkpoint"):
        print(f"[rankscope] checkpoint: {data['checkpoint']}", file=out, flush=True)
    if state == "failed":
        rank, path, lines = failed_rank_log(run_dir, data, 15)
        if path is not None:
            print(f"[rankscope] last lines of rank {rank}'s log ({path}):", file=out)
            for text in lines:
                print(f"    {text}", file=out)
        out.flush()
