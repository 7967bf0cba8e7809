"""The engine's command line, ``python -m ddp_engine launch | sweep | runs | stop | status |
cluster | doctor | stacks | profile`` (also the ``rankscope-engine`` command). Only ``launch`` and
``sweep`` start runs; the others read a run's folder or signal its processes."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

import psutil

from ddp_engine.common.cli_flags import add_config_arguments, config_from_namespace
from ddp_engine.common.cluster import DEFAULT_RDZV_PORT, node_script, slurm_script
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.protocol import Connection, ProtocolError, read_monitor_file
from ddp_engine.common.run_dir import FINAL_STATES, read_status
from ddp_engine.common.runs import (
    RunIndex,
    fmt_duration,
    fmt_number,
    owner_process,
    process_if_alive,
)
from ddp_engine.common.straggler import run_verdict
from ddp_engine.common.sweep_plan import DEFAULT_STEPS, parse_counts
from ddp_engine.launch.doctor import add_doctor_arguments, run_doctor
from ddp_engine.launch.profile_cmd import add_profile_arguments, run_profile
from ddp_engine.launch.stacks_cmd import add_stacks_arguments, run_stacks
from ddp_engine.launch.sweep import run_sweep


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ddp_engine",
        description="Rankscope's DDP engine: launch training with torchrun, stop it, see it.")
    sub = parser.add_subparsers(dest="command", required=True)
    launch = sub.add_parser("launch", help="train on this machine (one process per device)",
                            usage="%(prog)s [flags] [--script FILE.py [flags] -- SCRIPT_ARGS]",
                            description="Train with torchrun on this machine: the built-in "
                            "loop, or your own script (--script train.py; everything after -- "
                            "goes to it, as with torchrun). Every flag is also a key of the "
                            "--config file (--max-steps is max_steps).")
    add_config_arguments(launch)
    sweep = sub.add_parser("sweep", help="scaling sweep: train on 1, 2, ... N devices in turn, "
                           "samples/s and efficiency per count",
                           description="Run the config once per process count, one after the "
                           "other, --steps steps each (per-process batch size kept: weak "
                           "scaling), into a run group folder with group.json. Takes every "
                           "launch flag; --steps replaces max_steps and epochs. Exit code: 0 "
                           "completed or stopped, 1 a count failed, 2 bad input, 130 a forced "
                           "stop.")
    add_config_arguments(sweep)
    sweep.add_argument("--counts", type=parse_counts, metavar="N,M",
                       help="process counts, e.g. 1,2,4 (default: 1..--nproc if given, else "
                       "1..chosen GPUs, or 1..min(CPU cores, 8) on CPU)")
    sweep.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="K",
                       help=f"optimizer steps per count (default: {DEFAULT_STEPS})")
    runs = sub.add_parser("runs", help="list the runs under a runs folder, newest first")
    runs.add_argument("runs_dir", metavar="RUNS_DIR", nargs="?", default=None,
                      help="the runs folder (default: runs)")
    stop = sub.add_parser("stop", help="ask a running run to stop (agreed stop, checkpoint)")
    stop.add_argument("run_dir", metavar="RUN_DIR")
    stop.add_argument("--timeout", type=float, default=120.0, metavar="S",
                      help="seconds to wait for the run to end (default: 120)")
    cluster = sub.add_parser("cluster", help="print the launch script for each node of a "
                             "multi-node run, or a SLURM batch script",
                             description="Scripts that start this config on a cluster, each "
                             "node through `python -m ddp_engine launch` (run by "
                             "$RANKSCOPE_PYTHON, default python3, which must have Rankscope "
                             "installed): one per node (--nnodes N --rdzv-endpoint HOST:PORT), "
                             "or an sbatch script (--slurm: the nodes and the endpoint come "
                             "from the allocation). Takes every launch flag.")
    add_config_arguments(cluster)
    cluster.add_argument("--slurm", action="store_true", help="an sbatch script instead")
    cluster.add_argument("--slurm-port", type=int, default=DEFAULT_RDZV_PORT, metavar="PORT",
                         help=f"rendezvous port on the first node (default: "
                         f"{DEFAULT_RDZV_PORT})")
    status = sub.add_parser("status", help="state, step and last metrics of a run")
    status.add_argument("run_dir", metavar="RUN_DIR")
    status.add_argument("--json", action="store_true", help="print status.json as it is")
    doctor = sub.add_parser("doctor", help="preflight: versions, GPUs and their links, "
                            "warnings, and a few seconds of all-reduce (bus bandwidth)",
                            description="Check that this machine can train and how fast its "
                            "GPUs talk: versions, GPUs with their links (P2P, NVLink, PCIe), "
                            "warnings with what to do, then all-reduces across the chosen GPUs "
                            "(nccl), or --nproc CPU processes (gloo), at several message sizes. "
                            "The result is kept in RUNS_DIR/doctor.json. Exit code: 0 the "
                            "machine can train, 1 it cannot (the reason is printed), 2 bad "
                            "input.")
    add_doctor_arguments(doctor)
    add_stacks_arguments(sub.add_parser(
        "stacks", help="every live rank's stack, grouped by where the ranks stand",
        description="Print the Python stack (every thread) of each live rank of a run, without "
        "stopping it: py-spy --native where it is on PATH and allowed, else the rank's "
        "faulthandler. Saved as RUN_DIR/ranks/stacks-<time>.txt. Exit code: 0 stacks taken, "
        "1 no live rank answered, 2 bad input."))
    add_profile_arguments(sub.add_parser(
        "profile", help="profile the same steps on every rank of a live run, and read it",
        description="Every rank of the run starts torch.profiler at the same step (agreed at "
        "the next round, like a stop), records --steps steps and writes its trace to "
        "RUN_DIR/profiles/<time>-step<S>/rank-<N>.json.gz; rank 0 reads them into "
        "summary.json. --wait prints the summary. Exit code: 0 asked (with --wait: "
        "written), 1 no live run, refused or not written in time, 2 bad input."))
    return parser


def _config(ns: argparse.Namespace, fill: dict[str, str] | None = None) -> RunConfig | None:
    """The config of ``--config`` and the flags, or None after printing why it is invalid."""
    try:
        return config_from_namespace(ns, fill)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def cmd_launch(ns: argparse.Namespace) -> int:
    cfg = _config(ns)
    if cfg is None:
        return 2
    from ddp_engine.launch.launcher import launch  # imports psutil and (later) torch

    return launch(cfg)


def cmd_sweep(ns: argparse.Namespace) -> int:
    cfg = _config(ns)
    return 2 if cfg is None else run_sweep(cfg, ns.counts, ns.steps)


def _load_status(run_dir: str) -> dict | None:
    """status.json, or for a run started by plain torchrun (no launcher) what its live server
    says in the welcome."""
    if not Path(run_dir).is_dir():
        print(f"error: run_dir: {run_dir!r} is not a folder", file=sys.stderr)
        return None
    data = read_status(run_dir)
    if data is None:
        try:
            with Connection(run_dir, timeout_s=10) as conn:
                data = dict(conn.welcome.get("status") or {})
                data["nproc"] = conn.welcome.get("world_size")
        except ProtocolError:
            print(f"error: run_dir: {run_dir!r} has no readable status.json and no live "
                  "telemetry (not a run folder?)", file=sys.stderr)
    return data


def cmd_status(ns: argparse.Namespace) -> int:
    data = _load_status(ns.run_dir)
    if data is None:
        return 2

    if ns.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    print(f"state: {data.get('state')}")
    print(f"step: {data.get('step')}/{data.get('total_steps') or '?'}  epoch: {data.get('epoch')}")
    if data.get("reason"):
        print(f"reason: {data['reason']}")
    print(f"device: {data.get('device')}  processes: {data.get('nproc')}  pids: "
          f"{data.get('pids')}")
    metrics = data.get("last_metrics") or {}
    for r in metrics.get("ranks", []):
        print(f"  rank {r['rank']}: loss {fmt_number(r.get('loss'))}  samples/s "
              f"{fmt_number(r.get('samples_per_s'), rate=True)}")
    straggler = run_verdict(ns.run_dir)  # the rank the others wait for, from metrics.jsonl
    if straggler is not None:
        print(f"straggler: {straggler.text}")
    if data.get("checkpoint"):
        print(f"checkpoint: {data['checkpoint']}")
    if data.get("state") not in FINAL_STATES:
        with contextlib.suppress(ProtocolError):
            live = read_monitor_file(ns.run_dir)
            host = data.get("hostname") or "THIS-HOST"
            listen, port = live["listen"], live["port"]
            print(f"telemetry: {live['host']}:{port}  token: {live['token']}")
            if listen in ("127.0.0.1", "localhost"):
                print(f"  from another machine: ssh -N -L {port}:127.0.0.1:{port} {host}, then "
                      f"in the app: Attach to remote rank 0, 127.0.0.1, {port}, the token")
            else:  # --monitor-host: reached directly
                where = host if listen == "0.0.0.0" else listen
                print(f"  from another machine: in the app, Attach to remote rank 0, {where}, "
                      f"{port}, the token")
    return 0


def cmd_cluster(ns: argparse.Namespace) -> int:
    """Print each node's launch script (with the config it reads) or a SLURM script."""
    # With --slurm the script finds the endpoint in the allocation (nnodes may come from the
    # config file, so the stand-in goes in wherever the endpoint is missing).
    cfg = _config(ns, {"rdzv_endpoint": f"slurm-first-node:{ns.slurm_port}"} if ns.slurm
                  else None)
    if cfg is None:
        return 2
    if ns.slurm:
        print(slurm_script(cfg, port=ns.slurm_port), end="")
        return 0
    if not cfg.multi_node:
        print("error: nnodes: give --nnodes N (2 or more) and --rdzv-endpoint HOST:PORT for "
              "per-node commands, or --slurm for a batch script", file=sys.stderr)
        return 2
    for k in range(cfg.nnodes):
        print(f"# ---- node {k}: save as node-{k}.sh and run it there", flush=False)
        print(node_script(cfg, k))
    return 0


def cmd_stop(ns: argparse.Namespace) -> int:
    """Ask for the agreed stop over the telemetry socket (or, without one, signal the launcher),
    then wait for the run to end and print the outcome."""
    run_dir = ns.run_dir
    if not Path(run_dir).is_dir():
        print(f"error: run_dir: {run_dir!r} is not a folder", file=sys.stderr)
        return 2
    data = read_status(run_dir) or {}
    if data.get("state") in FINAL_STATES:
        print(f"run already ended: {data.get('state')}")
        return 0
    deadline = time.monotonic() + ns.timeout
    outcome: dict | None = None
    try:
        with Connection(run_dir, timeout_s=ns.timeout) as conn:
            if conn.welcome.get("status", {}).get("state") in FINAL_STATES:
                outcome = conn.welcome["status"]
            else:
                conn.send({"type": "stop", "by": f"python -m ddp_engine stop (pid {os.getpid()} "
                                                 f"on {socket.gethostname()})"})
                while (msg := conn.receive()) is not None:
                    if msg.get("type") == "event" and msg.get("kind") in FINAL_STATES:
                        outcome = {"state": msg["kind"], "step": msg.get("step")}
                        break
    except TimeoutError:
        pass  # quiet for --timeout seconds: status.json (if any) decides below
    except ProtocolError as e:
        if not data:
            print(f"error: {e}", file=sys.stderr)
            return 1
        if not _signal_launcher(data, run_dir):
            return 1
    if data:  # started by the launcher: its status.json has the final word
        while time.monotonic() < deadline:
            final = read_status(run_dir) or {}
            if final.get("state") in FINAL_STATES:
                outcome = final
                break
            time.sleep(0.2)
        _wait_launcher_exit(run_dir, data, max(0.0, deadline - time.monotonic()))
    if outcome is None:
        print(f"error: the run did not end within {ns.timeout:g} s", file=sys.stderr)
        return 1
    print(f"{outcome['state']} at step {outcome.get('step')}"
          + (f": {outcome['reason']}" if outcome.get("reason") else ""))
    return 0 if outcome["state"] in ("stopped", "completed") else 1


def cmd_runs(ns: argparse.Namespace) -> int:
    folder = Path(ns.runs_dir or "runs")
    if not folder.exists() and ns.runs_dir is None:  # the default folder: nothing ran here yet
        print(f"no runs yet: {str(folder)!r} does not exist (python -m ddp_engine launch "
              "writes its runs there)")
        return 0
    if not folder.exists():
        print(f"error: runs_dir: {ns.runs_dir!r} does not exist", file=sys.stderr)
        return 2
    if not folder.is_dir():
        print(f"error: runs_dir: {str(folder)!r} is a file, not a folder", file=sys.stderr)
        return 2
    rows = [("NAME", "STATE", "MODEL", "DATASET", "DEVICES", "STEPS", "BEST LOSS", "DURATION")]
    index = RunIndex(ns.runs_dir)
    summaries = index.refresh()
    while index.pending:  # every metrics.jsonl read once, for the best losses
        summaries = index.refresh()
    for s in summaries:
        for indent, r in [("", s)] + [("  ", c) for c in s.children]:
            rows.append((indent + r.name, r.state + (" (live)" if r.live else ""),
                         r.model or "", r.dataset or "", r.devices,
                         "" if r.step is None else f"{r.step}/{r.total_steps or '?'}",
                         "" if r.best_loss is None else f"{r.best_loss:.4g}",
                         fmt_duration(r.duration_s)))
    if len(rows) == 1:
        print(f"no runs yet in {str(folder)!r}")
        return 0
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _wait_launcher_exit(run_dir: str, data: dict, timeout_s: float) -> None:
    """Return once the launcher (which sweeps the run's processes) has exited."""
    proc = owner_process(run_dir, data)
    deadline = time.monotonic() + timeout_s
    # A zombie has exited (its parent, e.g. a detached app, has not reaped it yet).
    while proc is not None and time.monotonic() < deadline:
        time.sleep(0.1)
        proc = process_if_alive(proc.pid)


def _signal_launcher(data: dict, run_dir: str) -> bool:
    """SIGTERM the launcher named in status.json (it forwards it: an agreed stop)."""
    proc = owner_process(run_dir, data)
    if proc is None:
        print(f"error: the launcher (pid {data.get('launcher_pid')}) of {run_dir} is not "
              "running", file=sys.stderr)
        return False
    with contextlib.suppress(psutil.Error):
        proc.terminate()
    return True


def split_script_args(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """The engine's arguments and the script's: everything after the first ``--`` of a
    ``launch``, ``sweep`` or ``cluster`` command goes to ``--script`` (as with torchrun); None
    when there is no ``--``."""
    if not argv or argv[0] not in ("launch", "sweep", "cluster") or "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def main(argv: list[str] | None = None) -> int:
    engine_argv, script_args = split_script_args(list(sys.argv[1:] if argv is None else argv))
    ns = _parser().parse_args(engine_argv)
    if script_args is not None:
        ns.script_args = script_args
    commands = {"launch": cmd_launch, "sweep": cmd_sweep, "runs": cmd_runs, "stop": cmd_stop,
                "status": cmd_status, "cluster": cmd_cluster, "doctor": run_doctor,
                "stacks": run_stacks, "profile": run_profile}
    try:
        code = commands[ns.command](ns)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``status RUN_DIR | head -n 2``): end quietly, as cat does.
        # Python would report the pipe again while flushing at exit: point stdout at nothing.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command its pipe ended
    return code

