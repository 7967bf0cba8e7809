"""A run's life in the app: idle -> starting -> running -> stopping -> completed/stopped/failed.

The controller owns the launcher child, the telemetry viewer and the stop escalation:

1. Stop sends ``{"type": "stop"}`` over the telemetry socket (the agreed stop).
2. If the run has not ended ``grace_s`` later (or there was no socket), SIGTERM to the
   launcher's process group (the launcher asks its ranks for the agreed stop too, and after
   its own grace has torchrun stop them).
3. ``kill_after_s`` after that, SIGKILL to the group and to every process of the run seen.

When the launcher has exited, the controller reads the final status.json and checks with psutil
that no process of the run is left.

A remote run (:meth:`RunController.attach_remote`: rank 0 on another machine, its telemetry port
forwarded with ``ssh -L``) has no launcher and no run folder here: its state follows the
messages, Stop is the agreed stop alone (the remote launcher ends its own processes), and it has
ended when rank 0 closes the connection, as its last completed/stopped/failed event says, or
"disconnected" when the connection ended without one (the run may still be training).
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.launcher_process import LauncherProcess, build_env
from app.run_model import stop_by
from app.telemetry_client import TelemetryClient
from ddp_engine.common.config import RunConfig
from ddp_engine.common.processes import Escalation, Step
from ddp_engine.common.reasons import one_line
from ddp_engine.common.run_dir import (
    FINAL_STATES,
    STATUS_FILE,
    atomic_write_json,
    atomic_write_text,
    failed_rank_log,
    new_run_dir,
    read_status,
    tail_lines,
)
from ddp_engine.common.runs import final_event, owner_process

ACTIVE_STATES = ("starting", "running", "stopping")
DISCONNECTED = "disconnected"
"""The end state of a remote run whose connection ended before its final event: not known to
have failed, only lost."""
NO_ESCALATION = "no SIGTERM/SIGKILL from here: the remote launcher ends its own processes"


class RunController(QObject):
    """Starts, watches and stops one run at a time."""

    state_changed = Signal(str)
    welcomed = Signal(object)
    messages = Signal(object)  # list of protocol messages
    finished = Signal(object)  # final status dict (with "leftover_pids" and "log_tail")
    notice = Signal(str)  # a line for the status bar

    def __init__(self, parent: QObject | None = None, grace_s: float = 30.0,
                 kill_after_s: float = 10.0, poll_ms: int = 200) -> None:
        super().__init__(parent)
        self.grace_s = grace_s
        self.kill_after_s = kill_after_s
        self.state = "idle"
        self.run_dir: Path | None = None
        self.launcher: LauncherProcess | None = None
        self.client: TelemetryClient | None = None
        self.remote: str | None = None
        """"host:port" of a remote run's rank 0 (attach_remote); None for a local run."""
        self._remote_end: dict[str, Any] | None = None  # its last completed/stopped/failed
        self._remote_stop_reason: str | None = None
        self._remote_step: int | None = None
        self._stop_when_welcomed = False
        self.stopping = Escalation([])  # the stop pressed here, once it is
        self._signal_when_ready = False
        self._last_tree_scan = 0.0
        self._timer = QTimer(self)
        self._timer.setInterval(poll_ms)
        self._timer.timeout.connect(self.poll_once)
        self._detached: list[LauncherProcess] = []
        self._reaper = QTimer(self)
        self._reaper.setInterval(2000)
        self._reaper.timeout.connect(self._reap_detached)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def stop_requested(self) -> bool:
        """Stop was pressed here (the escalation is running)."""
        return bool(self.stopping.steps)

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_changed.emit(state)

    # ------------------------------------------------------------------------------ start
    def start(self, cfg: RunConfig) -> Path:
        """Create the run folder, write the config and start the launcher. Returns the folder."""
        if self.active:
            raise RuntimeError("a run is already active")
        run_dir = (Path(cfg.run_dir) if cfg.run_dir
                   else new_run_dir(cfg.runs_dir, cfg.default_name())).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg = dataclasses.replace(cfg, run_dir=str(run_dir), dry_run=False)
        config_path = run_dir / "launch.toml"
        atomic_write_text(config_path, cfg.to_toml())
        self._begin(run_dir, LauncherProcess(config_path, run_dir / "launcher.log", build_env()))
        assert self.launcher is not None
        pid = self.launcher.start()
        self.notice.emit(f"launcher started (pid {pid}), run folder {run_dir}")
        self._watch(TelemetryClient(run_dir, connect_timeout_s=None))
        return run_dir

    def attach(self, run_dir: Path) -> bool:
        """Watch a live run this app did not start (an earlier app's, or a terminal's), with
        its full history, and make Stop work on it as on a run started here. False when the
        run is not live."""
        if self.active:
            raise RuntimeError("a run is already active")
        run_dir = Path(run_dir).resolve()
        status = read_status(run_dir)
        owner = owner_process(run_dir, status)
        if owner is None:
            return False
        self._begin(run_dir, LauncherProcess.adopt(owner))
        if status and status.get("state") in ("running", "stopping"):
            self._set_state(str(status["state"]))
        self.notice.emit(f"attached to {run_dir.name} (launcher pid {owner.pid})")
        self._watch(TelemetryClient(run_dir, connect_timeout_s=None))
        return True

    def attach_remote(self, host: str, port: int, token: str,
                      connect_timeout_s: float = 20.0) -> None:
        """Watch a run whose rank 0 is on another machine, with its full history, through
        ``host:port`` (its ``--monitor-port`` forwarded with ``ssh -L``) and ``token`` (from
        its monitor.json). The connection is made on the client thread; ``finished`` says
        "disconnected" when none could be made within ``connect_timeout_s``.

        Raises:
            ValueError: a host, port or token that cannot be right, naming it.
            RuntimeError: a run is already active.
        """
        if self.active:
            raise RuntimeError("a run is already active")
        client = TelemetryClient.remote(host, port, token, connect_timeout_s)
        self._begin(None, None, remote=f"{host}:{port}")
        client.welcomed.connect(self._on_remote_welcome)
        client.disconnected.connect(self._on_remote_end)
        client.failed.connect(self._on_remote_failed)
        self.notice.emit(f"attaching to rank 0 at {self.remote}...")
        self._watch(client)

    def _begin(self, run_dir: Path | None, launcher: LauncherProcess | None,
               remote: str | None = None) -> None:
        """Take on a run: forget the last one's stop and end, and say "starting"."""
        self.run_dir = run_dir
        self.launcher = launcher
        self.remote = remote
        self._remote_end = None
        self._remote_stop_reason = None
        self._remote_step = None
        self._stop_when_welcomed = False
        self.stopping = Escalation([])
        self._signal_when_ready = False
        self._set_state("starting")

    def _watch(self, client: TelemetryClient) -> None:
        """Follow ``client``'s messages. A local run's client waits for the server however
        long it takes (a multi-node run serves once every node has joined): the controller
        stops it when the launcher ends."""
        self.client = client
        client.welcomed.connect(self.welcomed)
        client.messages.connect(self._on_messages)
        client.start()
        if self.remote is None:  # a remote run has no launcher or folder here to poll
            self._timer.start()

    def _on_messages(self, batch: list[dict[str, Any]]) -> None:
        self.messages.emit(batch)
        remote = self.remote is not None and self.sender() is self.client
        for m in batch:
            if m.get("type") == "metrics" and self.state == "starting":
                self._set_state("running")
            if m.get("kind") == "stopping" and self.state in ("starting", "running"):
                self._set_state("stopping")
            if remote:
                self._track_remote(m)

    # ------------------------------------------------------------------------------ remote
    def _track_remote(self, m: dict[str, Any]) -> None:
        """Remember what a remote run's end needs: its step, its stop reason, its last
        final event (a "stopped" can be followed by a "failed": the last one counts)."""
        if isinstance(m.get("step"), int):
            self._remote_step = m["step"]
        if m.get("type") != "event":
            return
        if m.get("kind") == "stopping":
            self._remote_stop_reason = m.get("reason")
        elif m.get("kind") in FINAL_STATES:
            self._remote_end = m

    def _on_remote_welcome(self, welcome: dict[str, Any]) -> None:
        if self.sender() is not self.client or not self.active:
            return  # a client left behind by detach()
        status = welcome.get("status") or {}
        if status.get("state") in ("running", "stopping") and self.state == "starting":
            self._set_state(str(status["state"]))
        self.notice.emit(f"attached to rank 0 at {self.remote} (world size "
                         f"{welcome.get('world_size', '?')}, step {status.get('step', '?')})")
        if self._stop_when_welcomed:
            self._stop_when_welcomed = False
            self._send_remote_stop()

    def _on_remote_failed(self, why: str) -> None:
        if self.sender() is self.client and self.active:
            self._finish_remote(f"could not attach to rank 0 at {self.remote}: {why}")

    def _on_remote_end(self, _why: str) -> None:
        if self.sender() is self.client and self.active:
            self._finish_remote(None)

    def _finish_remote(self, connect_error: str | None) -> None:
        """Emit ``finished`` for a remote run, shaped like a local run's status: from its last
        final event, or "disconnected" when the connection ended before one."""
        end = self._remote_end
        status: dict[str, Any] = {"state": DISCONNECTED, "step": self._remote_step,
                                  "reason": connect_error or (
                                      f"lost the connection to rank 0 at {self.remote} before "
                                      "the run ended (it may still be training)"),
                                  "remote": self.remote, "launcher_exit_code": None,
                                  "leftover_pids": []}  # nothing of it runs here
        if end is not None:
            status["state"] = str(end["kind"])
            status["step"] = end.get("step", self._remote_step)
            status["reason"] = one_line(end.get("error")) or end.get("reason") or (
                self._remote_stop_reason if end["kind"] == "stopped" else None)
            if end["kind"] == "failed":
                status["log_rank"] = end.get("rank")
                status["log_tail"] = []  # the logs are on the remote machine
        if self.client is not None:
            self.client.request_stop()
            self.client.wait(3000)
        self._set_state(str(status["state"]))
        self.finished.emit(status)

    # ------------------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Begin the stop escalation (agreed stop first; for a remote run, only that)."""
        if not self.active or (self.launcher is None and self.remote is None):
            return
        if self.stop_requested:
            return
        if self.remote is not None:
            self.stopping = Escalation([Step(0.0, self._send_remote_stop)])
        else:
            launcher = self.launcher
            assert launcher is not None
            self.stopping = Escalation([
                Step(0.0, self._agreed_stop),
                Step(self.grace_s, lambda: launcher.signal_group(signal.SIGTERM),
                     f"the run did not stop within {self.grace_s:g} s: SIGTERM sent"),
                Step(self.kill_after_s, lambda: launcher.kill_all(wait_s=0.0),  # _finish waits
                     "the run did not end after SIGTERM: SIGKILL sent")])
        self._set_state("stopping")
        self.stopping.start()

    def _agreed_stop(self) -> None:
        """The first step of a local stop: over the socket, else by SIGTERM to the launcher
        (which forwards it to its ranks), once it can take one."""
        assert self.launcher is not None
        if self.client is not None and self.client.send({"type": "stop", "by": stop_by()}):
            self.notice.emit("stop sent: all ranks will stop at the same step")
        elif self.run_dir is not None and read_status(self.run_dir) is None:
            # The launcher writes status.json once its own signal handlers are in place; a
            # SIGTERM before that would kill it outright. It goes out when the file appears.
            self._signal_when_ready = True
            self.notice.emit("stop: the launcher is starting; it will be stopped once it can "
                             "stop cleanly")
        else:  # not connected (yet): the launcher turns SIGTERM into the agreed stop
            self.launcher.signal_group(signal.SIGTERM)
            self.notice.emit("stop: SIGTERM sent to the launcher")

    def _send_remote_stop(self) -> None:
        """The agreed stop to a remote rank 0, now or once connected."""
        if self.client is not None and self.client.send({"type": "stop", "by": stop_by()}):
            self.notice.emit(f"stop sent to rank 0 at {self.remote}: all ranks will stop at "
                             f"the same step ({NO_ESCALATION})")
        else:
            self._stop_when_welcomed = True
            self.notice.emit(f"stop: not connected to rank 0 at {self.remote} yet; the stop "
                             f"goes out once it is ({NO_ESCALATION})")

    def _escalate(self) -> None:
        notice = self.stopping.poll_once()
        if notice:
            self.notice.emit(notice)

    def detach(self) -> None:
        """Stop watching but leave the run training (the window is closing). The launcher is
        still reaped when it ends while this app lives, so it does not linger as a zombie."""
        self._timer.stop()
        if self.client is not None:
            self.client.request_stop()
            self.client.wait(3000)
        if self.launcher is not None and self.launcher.proc is not None:  # our child: reap it
            self._detached.append(self.launcher)
            self._reaper.start()
        self._set_state("idle")

    def _reap_detached(self) -> None:
        self._detached = [p for p in self._detached if not p.ended()]
        if not self._detached:
            self._reaper.stop()

    # ------------------------------------------------------------------------------ watch
    def poll_once(self) -> bool:
        """One look at the launcher and status.json. Returns True once the run has ended."""
        if self.launcher is None or self.run_dir is None:
            return True
        status = read_status(self.run_dir) or {}
        now = time.monotonic()
        if now - self._last_tree_scan > 1.0:
            self._last_tree_scan = now
            pids = [p for p in (status.get("pids") or {}).values() if isinstance(p, int)]
            self.launcher.remember_tree(pids)
        if status.get("state") == "running" and self.state == "starting":
            self._set_state("running")
        if self._signal_when_ready and status:
            self._signal_when_ready = False
            self.launcher.signal_group(signal.SIGTERM)
            self.notice.emit("stop: SIGTERM sent to the launcher")
        if self.stopping.started:
            self._escalate()
        if not self.launcher.ended():
            return False
        self._finish(self.launcher.poll(), status)
        return True

    def _record_end(self, state: str, reason: object) -> None:
        """Where the launcher ended without recording how the run ended (it was SIGKILLed, or
        it crashed), write that into status.json: the Runs panel, ``status`` and this window
        then use the same word for the run."""
        assert self.run_dir is not None
        recorded = read_status(self.run_dir)
        if not recorded or not recorded.get("launcher_pid") or \
                recorded.get("state") in FINAL_STATES:
            return
        recorded.update(state=state, reason=reason, ended=time.time(),
                        recorded_by="the Rankscope window, after the launcher ended")
        atomic_write_json(self.run_dir / STATUS_FILE, recorded)

    def _finish(self, code: int | None, status: dict[str, Any]) -> None:
        self._timer.stop()
        assert self.launcher is not None and self.run_dir is not None
        status = read_status(self.run_dir) or status
        if not status.get("launcher_pid"):  # plain torchrun: its metrics say how it ended
            end = final_event(self.run_dir) or {}
            status.update({"state": end.get("kind"), "step": end.get("step"),
                           "reason": end.get("reason")} if end else {})
        state = status.get("state")
        if state not in FINAL_STATES and self.stopping.taken == 3:  # we SIGKILLed it
            state = "stopped"
            status["forced"] = True
            status["reason"] = (f"forced: the agreed stop and SIGTERM did not end the run "
                                f"within {self.grace_s + self.kill_after_s:g} s, so every "
                                "process of it was SIGKILLed")
        elif state not in FINAL_STATES:
            state = "failed"
            status["reason"] = status.get("reason") or (
                (f"the launcher exited with code {code}" if code is not None else
                 f"the launcher (pid {self.launcher.pid}) ended") + " before the run ended"
                + (f": {' / '.join(tail_lines(self.run_dir / 'launcher.log', 3))}"
                   if (self.run_dir / "launcher.log").exists() else ""))
        status["state"] = state
        status["launcher_exit_code"] = code
        self._record_end(state, status.get("reason"))
        if state == "failed":
            rank, path, lines = failed_rank_log(self.run_dir, status)
            status["log_rank"] = rank
            status["log_tail"] = lines if path is not None else \
                tail_lines(self.run_dir / "launcher.log", 20)
        leftover = self.launcher.alive()
        if leftover:  # the launcher sweeps its run; anything left is killed here
            self.launcher.kill_all()
            leftover = self.launcher.alive()
        status["leftover_pids"] = [p.pid for p in leftover]
        if self.client is not None:
            self.client.request_stop()
            self.client.wait(3000)
        self._set_state(state)
        self.finished.emit(status)
