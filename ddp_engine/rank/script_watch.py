"""Watching a user's own training script from inside its rank, without changing it: the step
accounting and reporting. Where the script meets torch is :mod:`script_patches`; which optimizer
steps count, :mod:`script_steps`; how a step ends and is reported, :mod:`script_step_ends`; the
script's end, :mod:`script_stop`.

- ``init_process_group``: the watch's CPU side group (agreed-stop rounds, reports), with the
  script's own timeout at the least, and the rank's device.
- Every ``DistributedDataParallel`` (the latest is timed): the batch (samples/s), data wait,
  and its gradient sync from DDP's own reducer timers (``--sync-timing hook``: the timing comm
  hook over DDP's own group, or the script's own hook, timed).
- ``torch.autograd.backward``: a one-element tensor passed to it is the loss (unscaled from a
  ``GradScaler``; inside an optimizer's closure, the first); each step ends with the round.
"""

from __future__ import annotations

import datetime
import logging
import socket
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_engine.common.config import RunConfig
from ddp_engine.common.heartbeat import Heartbeat
from ddp_engine.common.lifeline import signal_name
from ddp_engine.rank.device_sampler import DeviceSampler
from ddp_engine.rank.distributed import DistInfo, StopFlag
from ddp_engine.rank.logged import LoggedScalars
from ddp_engine.rank.places import rank_places
from ddp_engine.rank.profiling import RankProfiler
from ddp_engine.rank.reducer_timing import ReducerTiming, sync_source
from ddp_engine.rank.report_pace import ReportPace
from ddp_engine.rank.reporter import Reporter
from ddp_engine.rank.reports import Interval
from ddp_engine.rank.script_patches import (
    PARTS,
    Guard,
    TorchPatches,
    chain,
    compiling,
    first_batch_size,
)
from ddp_engine.rank.script_step_ends import (
    agreeing,
    close_pending,
    count_step,
    end_step,
    report_row,
    stepped,
)
from ddp_engine.rank.script_steps import StepCounter
from ddp_engine.rank.script_stop import ScriptStopped, post_final, save_at_stop
from ddp_engine.rank.sync_timing import StepTimer
from ddp_engine.rank.telemetry import Telemetry

log = logging.getLogger("ddp_engine.rank.script_watch")


class ScriptWatch:
    """One rank's view of a running script; installed with :meth:`install` before it runs."""

    def __init__(self, cfg: RunConfig, info: DistInfo, run_dir: Path, stop: StopFlag,
                 telemetry: Telemetry | None, heartbeat: Heartbeat | None) -> None:
        self.cfg = cfg
        self.info = info
        self.run_dir = run_dir
        self.stop = stop
        self.heartbeat = heartbeat
        self.logged = LoggedScalars()
        self.reporter = Reporter(cfg, stop, telemetry, self.logged, self._kept)
        self.reporter.total_steps = cfg.max_steps
        self.reporter.attach(None, [{"host": socket.gethostname(), "node": info.node_rank,
                                     "local_rank": info.local_rank}])
        self.guard = Guard(self._part_failed)
        self.patches = TorchPatches(self, self.guard)
        self.group: dist.ProcessGroup | None = None  # the side group, once the script joined
        self.store: dist.Store | None = None  # the run's store: the last reports, no collective
        self.side_timeout_s = cfg.dist_timeout_s
        """The side group's timeout: the script's own process group's, at the least."""
        self.step = 0
        self.epoch = 0
        self.outcome: str | None = None
        """"completed" or "stopped" once every rank agreed to end (max_steps or a stop)."""
        self.device = torch.device("cpu")
        self.profiler = RankProfiler.for_rank(run_dir, info, self.device, stop,
                                              self.reporter.event)
        self.timer: StepTimer | None = None
        source, self.sync_note = sync_source(cfg.sync_timing)
        self.reducer_timing = (ReducerTiming(ReportPace.of(cfg).every)
                               if cfg.telemetry and source == "reducer" else None)
        """Sync timing from the latest DDP module's reducer timers (else the timing hook)."""
        self.sampler: DeviceSampler | None = None
        # Weakly: a stage the script left (its DDP, its optimizer) is freed as under torchrun.
        self._ddps: list[weakref.ref[DDP]] = []
        self._forward_hooks: weakref.WeakKeyDictionary[DDP, list[Any]] = \
            weakref.WeakKeyDictionary()
        self.steps = StepCounter()
        self.on_stop_fns: list[Callable[[], Any]] = []
        self.uses_should_stop = False
        self.sync_missing: str | None = "the script built no DistributedDataParallel"
        self._hooked: set[int] = set()  # ids of DDP modules whose comm hook is timed
        self._interval = Interval()
        self._loss: torch.Tensor | None = None
        self._samples = 0
        self._idle_since: float | None = None
        self._forward_stamp: Any = None
        self._opt_stamp: Any = None
        self._opt_owner: torch.optim.Optimizer | None = None  # whose step is being timed
        self._held: tuple[torch.Tensor | None, int, Any, float] | None = None
        """A pending step's loss, samples, timing record and end (its counting optimizer's
        step, by ``perf_counter``)."""
        self._step_end: float | None = None  # a pending step's end, while it is counted
        self._in_opt = False
        self._opt_loss_seen = False  # inside an optimizer's closure: the first loss counts
        self._in_backward = False
        self._saw_loss = False
        self._said: dict[str, str] = {}
        self._scaled: tuple[int, torch.Tensor] | None = None  # (id of a scaled loss, unscaled)
        self._finished = False
        self._began = False  # training began: the first report's interval starts there

    # ------------------------------------------------------------------------- install
    def install(self) -> None:
        self.patches.install()
        self.profiler.own.install()  # the script's own profilers, which ours gives way to

    def uninstall(self) -> None:
        self.patches.uninstall()
        self.profiler.own.uninstall()
        self._ddps, self.on_stop_fns = [], []
        self.steps.forget()
        if self.sampler is not None:
            self.sampler.request_stop()

    @property
    def ddp(self) -> DDP | None:
        """The most recent DDP module the script built and still holds."""
        alive = [m for m in (r() for r in self._ddps) if m is not None]
        return alive[-1] if alive else None

    @property
    def ddps(self) -> list[DDP]:
        return [m for m in (r() for r in self._ddps) if m is not None]

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Every optimizer that stepped and is still held, the counting one first."""
        return self.steps.optimizers

    # ------------------------------------------------------------------------- torch's calls
    def joined(self, timeout: datetime.timedelta | None) -> None:
        """After the script's init_process_group: the side group (every rank makes it at the
        same point, with the script's own timeout at the least), the device, the start."""
        backend = str(dist.get_backend())
        if "nccl" in backend and torch.cuda.is_available():  # "nccl", or "cpu:gloo,cuda:nccl"
            local = self.info.local_rank
            self.device = torch.device("cuda", local if local < torch.cuda.device_count()
                                       else torch.cuda.current_device())
        self.store = c10d._get_default_store()
        if self.info.world_size > 1:
            script_s = (timeout or c10d.default_pg_timeout).total_seconds()
            self.side_timeout_s = max(script_s, self.cfg.dist_timeout_s)
            self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(
                seconds=self.side_timeout_s))
            self.stop.attach(self.group)
        self.reporter.attach(self.group, rank_places(self.info, self.group, self.device))
        places = self.reporter.places
        self.reporter.event("run_start", total_steps=self.cfg.max_steps,
                            world_size=self.info.world_size, steps_per_epoch=None,
                            backend=backend, start_step=0, source="script",
                            script=self.cfg.script,
                            nnodes=len({p.get("node") for p in places}),
                            hosts=sorted({str(p.get("host")) for p in places}),
                            sync_timing=None if not self.cfg.telemetry else
                            "reducer" if self.reducer_timing is not None else "hook")
        if self.sync_note is not None and self.cfg.telemetry:
            self.reporter.event("warning", step=0, cause="sync_timing", message=self.sync_note)
        if self.cfg.telemetry and self.sampler is None:
            on_cuda = self.device.type == "cuda"
            uuid = (f"GPU-{torch.cuda.get_device_properties(self.device).uuid}" if on_cuda
                    else None)
            self.sampler = DeviceSampler(self.device.type, self.info.local_rank, uuid)
            self.sampler.start()

    def adopt(self, module: DDP) -> None:
        """A DDP module the script built: watch its forward; it is the one timed from now."""
        self._ddps = [r for r in self._ddps if r() is not None] + [weakref.ref(module)]
        params = list(module.module.parameters())
        if params and params[0].device.type == "cuda":
            self.device = params[0].device
        self.sync_missing = None if self.cfg.telemetry else "telemetry is off"
        if self.cfg.telemetry and self.timer is None:
            self.timer = StepTimer(self.device, divide=True)  # the script's loss is not divided
        if self.reducer_timing is not None:
            self.guard.run("sync", self.reducer_timing.watch, module)
        self._forward_hooks[module] = self._watch_forward(module)

    def compiled(self, wrapper: torch.nn.Module, module: DDP) -> None:
        """``torch.compile(module)``: its forward is watched from the compiled wrapper, whose
        hooks run outside dynamo (traced, ours would be frames of their own: a graph break
        more per forward than under plain torchrun)."""
        for handle in self._forward_hooks.pop(module, []):
            handle.remove()
        self._watch_forward(wrapper)

    def _watch_forward(self, module: torch.nn.Module) -> list[Any]:
        g = self.guard
        return [module.register_forward_pre_hook(
                    lambda m, a, k: None if compiling() else g.run(
                        "forward", self._before_forward, a, k), with_kwargs=True),
                module.register_forward_hook(
                    lambda m, a, o: None if compiling() else g.run(
                        "forward", self._after_forward))]

    def script_hook(self, module: DDP, hook: Callable[..., Any]) -> Callable[..., Any] | None:
        """The script registers a comm hook of its own: timed (once per module; by the
        reducer's timers, whatever the hook, unless ``--sync-timing hook``)."""
        if self.timer is None or self.reducer_timing is not None or id(module) in self._hooked:
            return None
        self._hooked.add(id(module))
        self.sync_missing = None
        return self.timer.wrap(hook)

    def builtin_hook(self, module: DDP, comm_hook_type: Any) -> None:
        self._hooked.add(id(module))
        if self.reducer_timing is not None:
            return  # the reducer's timers time a built-in hook as any other
        self.sync_missing = (f"the script registered DDP's built-in comm hook "
                             f"{getattr(comm_hook_type, 'name', comm_hook_type)}, "
                             "which cannot be timed from Python")

    def _hook_latest(self) -> None:
        """Before a backward: our timing hook on the latest DDP module, over DDP's own group
        (a sub-group's DDP averages over that group), unless the script hooked it itself."""
        module = self.ddp
        if module is None or self.timer is None or self.reducer_timing is not None or \
                id(module) in self._hooked:
            return
        self._hooked.add(id(module))
        DDP.register_comm_hook(module, module.process_group, self.timer.hook)

    def script_signal_handler(self, signum: int, handler: Any) -> Any:
        """The script installs a handler for one of the rank's signals: ours first (the stop
        request), then the script's; said once in the rank's log."""
        ours = self.stop.handlers.get(signum)
        if ours is None:
            return None
        name = signal_name(int(signum))
        log.info("the script installed its own handler for %s: it runs after Rankscope's "
                 "stop request", name)
        if callable(handler):
            self.reporter.event("warning", step=self.step, cause="signal_handler", signal=name,
                                message=f"the script installed its own {name} handler: it runs "
                                        "after Rankscope's agreed stop (signals reach the ranks "
                                        "only when a stop has not ended in time)")
        return chain(ours, handler, signum)

    def before_backward(self, tensors: Any) -> tuple[Any] | None:
        if self._in_backward or not isinstance(tensors, torch.Tensor) or tensors.numel() != 1:
            return None  # not a loss (or a nested backward)
        loss = tensors.detach()
        if self._scaled is not None and self._scaled[0] == id(tensors):
            loss = self._scaled[1]  # scaler.scale(loss).backward(): the loss, unscaled
        self._scaled = None
        self._saw_loss = True
        if not (self._in_opt and self._opt_loss_seen):  # a closure's later calls: not again
            self._loss = loss if self._loss is None else self._loss + loss
        self._opt_loss_seen = self._in_opt
        self.guard.run("sync", self._hook_latest)
        self._phase("backward")
        self._in_backward = True
        return (self.timer.stamp() if self.timer is not None else None,)

    def after_backward(self, token: tuple[Any]) -> None:
        self._in_backward = False
        timer = self.timer
        if timer is not None and token[0] is not None:
            end = timer.stamp()
            timer.phase("backward", token[0], end)
            timer.mark_backward_end(end)
            if self._in_opt:
                self._opt_stamp = end  # a closure: the optimizer's time goes on from here
        self._idle_since = time.perf_counter()
        self._phase("optimizer" if self._in_opt else "data")

    def scaled(self, outputs: Any, out: Any) -> None:
        if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
            self._scaled = (id(out), outputs.detach())

    def epoch_set(self, epoch: int) -> None:
        if epoch != self.epoch or self.step == 0:
            self.epoch = epoch
            self.reporter.event("epoch_start", epoch=epoch)

    def _before_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not torch.is_grad_enabled():
            return  # an evaluation pass (no_grad): not a training step's batch
        now = time.perf_counter()
        if not self._began:
            self._training_begins(now)
        if self._idle_since is not None and self.timer is not None and not self._in_opt:
            self.timer.add_data_wait(now - self._idle_since)
        self._idle_since = None
        self._samples += first_batch_size(args, kwargs) or 0
        self._phase("forward")
        stamp = self.timer.stamp() if self.timer is not None else None
        if self._in_opt and self.timer is not None and self._opt_stamp is not None:
            self.timer.phase("optimizer", self._opt_stamp, stamp)  # a closure's forward
            self._opt_stamp = None
        self._forward_stamp = stamp

    def _training_begins(self, now: float) -> None:
        """The first report's interval starts with training: the first training forward or
        optimizer step, whichever comes first (its parts are timed from then too)."""
        if self.step == 0 and not self._began:
            self._interval.start = now
            self._began = True

    def _after_forward(self) -> None:
        if self.timer is not None and self._forward_stamp is not None and \
                torch.is_grad_enabled():
            self.timer.phase("forward", self._forward_stamp, self.timer.stamp())
        self._forward_stamp = None

    def before_opt_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.steps.before(optimizer):
            close_pending(self)  # the counting optimizer again: its last step ends first
        if self._opt_owner is None:  # an optimizer's time (not one nested in another's)
            if not self._began:  # LBFGS: its closure's forward comes later
                self._training_begins(time.perf_counter())
            self._opt_owner, self._in_opt, self._opt_loss_seen = optimizer, True, False
            self._phase("optimizer")
            self._opt_stamp = self.timer.stamp() if self.timer is not None else None

    def after_opt_step(self, optimizer: torch.optim.Optimizer) -> None:
        stepped(self, optimizer, skipped=False)

    def scaler_step_begins(self, optimizer: torch.optim.Optimizer) -> None:
        self.steps.scaler_begins(optimizer)
        if self.steps.before(optimizer):
            close_pending(self)

    def scaler_step_ended(self, optimizer: torch.optim.Optimizer) -> None:
        """``scaler.step(optimizer)`` returned: if the optimizer did not step (inf gradients),
        the iteration still ends, as a skipped step whose loss is not kept."""
        if self.steps.scaler_skipped(optimizer):
            stepped(self, optimizer, skipped=True)

    def _end(self, outcome: str) -> None:
        """Every rank agreed to end after this step: the last report, the checkpoint, and
        (unless the script watches should_stop()) out of the script."""
        self.outcome = outcome
        self._finished = True
        if agreeing(self):  # every rank is here, after the same step: collectives are safe
            rounds = [r for r in [self.stop.settle()] if r is not None]
            if self._interval.steps and not self.reporter.poisoned:
                rounds.append(self.stop.gather(self.step, report_row(self)))
            self.reporter.publish(rounds, self.step, self.epoch)
            self._say_unavailable()
        self.profiler.close(self.step)
        if outcome == "stopped":
            self.reporter.event("stopping", step=self.step, reason=self.stop.reason)
            self._phase("checkpoint")
            save_at_stop(self)
        if not self.uses_should_stop:
            raise ScriptStopped(self.step, outcome)

    def finish(self) -> None:
        """The script ends by itself (its destroy_process_group, or its return): this rank's
        last report goes into the run's store, where rank 0 reads every rank's once its own
        script is over (:func:`~ddp_engine.rank.script_stop.post_final`). No collective: the
        other ranks may still be busy with the script's own work (a rank-0 evaluation).
        Idempotent."""
        if self._finished:
            return
        self._finished = True
        self.profiler.close(self.step)
        if self.steps.end_pending() and self._held is not None and "steps" not in self.guard.off:
            self._loss, self._samples, record, _ = self._held  # the script's last step: no round
            self._held = None
            count_step(self, record)
        if agreeing(self) and (self.step or self.group is not None):
            row = report_row(self) if self._interval.steps and not self.reporter.poisoned else None
            post_final(self, row)

    def _say_unavailable(self) -> None:
        """Rank 0 tells viewers what this run cannot show, and why (when that changed)."""
        items = self.unavailable()
        if items != self._said:
            self._said = items
            self.reporter.event("unavailable", step=self.step, items=items)

    def _part_failed(self, part: str, e: BaseException) -> None:
        """A part of the watch failed and is off: said to the viewers, once."""
        self.reporter.event("warning", step=self.step, cause="watch_failed", part=part,
                            message=f"rank {self.info.rank}: Rankscope stopped watching "
                                    f"{PARTS.get(part, part)} ({type(e).__name__}: {e}); the "
                                    "script goes on; the traceback is in this rank's log")
        if part != "steps":  # the reports go on (the steps part itself cannot say it now)
            self._said = {}

    def _kept(self) -> str:
        return "rankscope.on_stop's checkpoint is kept" if self.on_stop_fns else "none is saved"

    # ------------------------------------------------------------------------- the API
    def log(self, scalars: dict[str, Any]) -> None:
        self.logged.log(scalars)

    def on_stop(self, fn: Callable[[], Any]) -> None:
        if not callable(fn):
            raise TypeError(f"rankscope.on_stop: fn must be callable, got {fn!r}")
        self.on_stop_fns.append(fn)

    def should_stop(self) -> bool:
        self.uses_should_stop = True
        if self.steps.end_pending() and self.outcome is None:
            close_pending(self)  # the loop's iteration ends here
        elif not self.steps.started and self.outcome is None:
            end_step(self)  # a loop without optimizer steps: each call ends a step
        return self.outcome is not None

    def _phase(self, phase: str) -> None:
        if self.heartbeat is not None:
            self.heartbeat.device = self.device.type  # on CUDA its host may run ahead of it
            self.heartbeat.enter(phase, self.step)

    def unavailable(self) -> dict[str, str]:
        """What a script run does not show, and why (the dashboard says so)."""
        out: dict[str, str] = {}
        if self.sync_missing and self.info.world_size > 1:
            out["sync"] = self.sync_missing
        if self.ddp is None and not self._ddps:
            out["samples"] = "the script built no DistributedDataParallel (samples/s and " \
                             "forward time come from its forward)"
        if not self._saw_loss:
            out["loss"] = "no one-element tensor was passed to backward()"
        for part, why in self.guard.off.items():
            out[f"watch_{part}"] = (f"Rankscope's watch of {PARTS.get(part, part)} failed and "
                                    f"turned itself off: {why}")
        return out
