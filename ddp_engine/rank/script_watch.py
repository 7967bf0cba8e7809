"""Watching a user's own training script from inside its rank, without changing it.

A :class:`ScriptWatch` hooks what every DDP script does anyway:

- ``init_process_group``: right after it, the watch's own CPU side group (agreed-stop rounds
  and reports, as in built-in runs); ``destroy_process_group``: just before it, the last report.
- ``DistributedDataParallel``: a forward pre-hook sees the batch (samples/s from its first
  dimension) and when compute starts (data wait: since the last step or backward ended); the
  timing comm hook is registered at the first forward, or the script's own Python hook is
  wrapped with the same timing (DDP's built-in C++ hooks cannot be: the run says so).
- ``torch.autograd.backward``: a one-element tensor passed to it is the loss, kept on the
  device and read on reporting steps only (a ``GradScaler``'s scaled loss counts unscaled).
- torch's global optimizer step hooks: the first optimizer that steps counts the steps, each
  followed by the agreed-stop round. At an agreed stop, rank 0 saves (:mod:`script_stop`) and
  :class:`ScriptStopped` leaves the script from ``optimizer.step()`` on every rank.
- ``DistributedSampler.set_epoch``: the epoch.

:meth:`ScriptWatch.uninstall` undoes every patch.
"""

from __future__ import annotations

import datetime
import logging
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.optim.optimizer as optim_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from ddp_engine.common.config import RunConfig
from ddp_engine.common.heartbeat import Heartbeat
from ddp_engine.rank.device_sampler import DeviceSampler
from ddp_engine.rank.distributed import DistInfo, StopFlag, rank_places
from ddp_engine.rank.logged import LoggedScalars
from ddp_engine.rank.reporter import Reporter
from ddp_engine.rank.reports import Interval
from ddp_engine.rank.script_stop import ScriptStopped, save_at_stop
from ddp_engine.rank.sync_timing import StepTimer
from ddp_engine.rank.telemetry import Telemetry

log = logging.getLogger("ddp_engine.rank.script_watch")

SYNC_FIELDS = ("sync_time_s", "sync_exposed_s", "sync_bytes", "sync_buckets")


def _first_batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The first dimension of the first tensor among a forward's arguments (a step or two
    into lists, tuples and dicts), or None."""
    todo: list[Any] = [*args, *kwargs.values()]
    for _ in range(64):
        if not todo:
            return None
        item = todo.pop(0)
        if isinstance(item, torch.Tensor):
            return int(item.shape[0]) if item.dim() > 0 else None
        if isinstance(item, list | tuple):
            todo[:0] = list(item)[:8]
        elif isinstance(item, dict):
            todo[:0] = list(item.values())[:8]
    return None


class ScriptWatch:
    """One rank's view of a running script; installed with :meth:`install` before it runs."""

    _active: ScriptWatch | None = None

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
        self.group: dist.ProcessGroup | None = None  # the side group, once the script joined
        self.step = 0
        self.epoch = 0
        self.outcome: str | None = None
        """"completed" or "stopped" once every rank agreed to end (max_steps or a stop)."""
        self.device = torch.device("cpu")
        self.timer: StepTimer | None = None
        self.sampler: DeviceSampler | None = None
        self.ddp: DDP | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self.on_stop_fns: list[Callable[[], Any]] = []
        self.uses_should_stop = False
        self.sync_missing: str | None = "the script built no DistributedDataParallel"
        self._script_hook = False  # the script registered a comm hook of its own
        self._ours_registered = False
        self._interval = Interval()
        self._loss: torch.Tensor | None = None
        self._samples = 0
        self._idle_since: float | None = None
        self._forward_stamp: Any = None
        self._opt_stamp: Any = None
        self._in_backward = False
        self._saw_loss = False
        self._said: dict[str, str] = {}
        self._scaled: tuple[int, torch.Tensor] | None = None  # (id of a scaled loss, unscaled)
        self._finished = False
        self._undo: list[Callable[[], None]] = []

    # ------------------------------------------------------------------------- install
    def install(self) -> None:
        """Patch torch's entry points (see the module docstring); :meth:`uninstall` undoes."""
        ScriptWatch._active = self
        self._patch(c10d, "init_process_group", self._wrap_init)
        self._patch(dist, "init_process_group", self._wrap_init)
        self._patch(c10d, "destroy_process_group", self._wrap_destroy)
        self._patch(dist, "destroy_process_group", self._wrap_destroy)
        self._patch(torch.autograd, "backward", self._wrap_backward)
        self._patch(DDP, "__init__", self._wrap_ddp_init)
        self._patch(DDP, "register_comm_hook", self._wrap_register_hook)
        self._patch(DDP, "_register_builtin_comm_hook", self._wrap_builtin_hook)
        self._patch(torch.amp.GradScaler, "scale", self._wrap_scale)
        self._patch(DistributedSampler, "set_epoch", self._wrap_set_epoch)
        pre = optim_hooks.register_optimizer_step_pre_hook(self._before_opt_step)
        post = optim_hooks.register_optimizer_step_post_hook(self._after_opt_step)
        self._undo += [pre.remove, post.remove]

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        self.ddp, self.optimizers, self.on_stop_fns = None, [], []  # no cycle via the hooks
        if ScriptWatch._active is self:
            ScriptWatch._active = None
        if self.sampler is not None:
            self.sampler.request_stop()

    def _patch(self, owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Any]) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, wrap(original))
        self._undo.append(lambda: setattr(owner, name, original))

    # ------------------------------------------------------------------------- the wrappers
    def _wrap_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            self._joined()
            return out
        return init_process_group

    def _wrap_destroy(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def destroy_process_group(group: Any = None) -> Any:
            if group is None or group is c10d.GroupMember.WORLD:
                # The last report (collectives), unless on an exception's way out through a
                # ``finally``: the other ranks may be training on.
                self._finished = self._finished or sys.exc_info()[0] is not None
                self.finish()
                if not dist.is_initialized():
                    return None  # gone already (the watch ended it at an agreed stop)
            return original(group)
        return destroy_process_group

    def _wrap_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if self._in_backward or not isinstance(tensors, torch.Tensor) or tensors.numel() != 1:
                return original(tensors, *args, **kwargs)  # not a loss (or a nested backward)
            loss = tensors.detach()
            if self._scaled is not None and self._scaled[0] == id(tensors):
                loss = self._scaled[1]  # scaler.scale(loss).backward(): the loss, unscaled
            self._scaled = None
            self._saw_loss = True
            self._loss = loss if self._loss is None else self._loss + loss
            self._phase("backward")
            timer = self.timer
            start = timer.stamp() if timer is not None else None
            self._in_backward = True
            try:
                return original(tensors, *args, **kwargs)
            finally:
                self._in_backward = False
                if timer is not None:
                    end = timer.stamp()
                    timer.phase("backward", start, end)
                    timer.mark_backward_end(end)
                self._idle_since = time.perf_counter()
                self._phase("data")
        return backward

    def _wrap_scale(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def scale(scaler: Any, outputs: Any) -> Any:
            out = original(scaler, outputs)
            if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
                self._scaled = (id(out), outputs.detach())
            return out
        return scale

    def _wrap_set_epoch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def set_epoch(sampler: Any, epoch: int) -> None:
            original(sampler, epoch)
            if epoch != self.epoch or self.step == 0:
                self.epoch = epoch
                self.reporter.event("epoch_start", epoch=epoch)
        return set_epoch

    def _wrap_ddp_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(module: DDP, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            original(module, *args, **kwargs)
            if self.ddp is None:
                self._adopt(module)
        return __init__

    def _wrap_register_hook(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def register_comm_hook(module: DDP, state: object, hook: Callable[..., Any]) -> None:
            if module is self.ddp and self.timer is not None and not self._ours_registered:
                self._script_hook = True
                self.sync_missing = None
                hook = self.timer.wrap(hook)  # the script's hook, timed
            original(module, state, hook)
        return register_comm_hook

    def _wrap_builtin_hook(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def _register_builtin_comm_hook(module: DDP, comm_hook_type: Any) -> None:
            if module is self.ddp:
                self._script_hook = True
                self.sync_missing = (f"the script registered DDP's built-in comm hook "
                                     f"{getattr(comm_hook_type, 'name', comm_hook_type)}, "
                                     "which cannot be timed from Python")
            original(module, comm_hook_type)
        return _register_builtin_comm_hook

    # ------------------------------------------------------------------------- events
    def _joined(self) -> None:
        """After the script's init_process_group: the side group (every rank makes it at the
        same point), where every rank runs, the device, and the run's start."""
        backend = dist.get_backend()
        if backend == "nccl" and torch.cuda.is_available():
            self.device = torch.device("cuda", self.info.local_rank)  # the standard recipe
        if self.info.world_size > 1:
            self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(
                seconds=self.cfg.dist_timeout_s))
            self.stop.attach(self.group)
        self.reporter.attach(self.group, rank_places(self.info, self.group, self.device))
        places = self.reporter.places
        self.reporter.event("run_start", total_steps=self.cfg.max_steps,
                            world_size=self.info.world_size, steps_per_epoch=None,
                            backend=backend, start_step=0, source="script",
                            script=self.cfg.script,
                            nnodes=len({p.get("node") for p in places}),
                            hosts=sorted({str(p.get("host")) for p in places}))
        self._start_sampling()

    def _start_sampling(self) -> None:
        if not self.cfg.telemetry or self.sampler is not None:
            return
        on_cuda = self.device.type == "cuda"
        uuid = f"GPU-{torch.cuda.get_device_properties(self.device).uuid}" if on_cuda else None
        self.sampler = DeviceSampler(self.device.type, self.info.local_rank, uuid)
        self.sampler.start()

    def _adopt(self, module: DDP) -> None:
        """The script's DDP module: watch its forward, time its gradient sync."""
        self.ddp = module
        params = list(module.module.parameters())
        if params and params[0].device.type == "cuda":
            self.device = params[0].device
        self.sync_missing = None if self.cfg.telemetry else "telemetry is off"
        if self.cfg.telemetry:
            self.timer = StepTimer(self.device, divide=True)  # the script's loss is not divided
        module.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        module.register_forward_hook(self._after_forward)

    def _before_forward(self, module: DDP, args: tuple[Any, ...], kwargs: dict[str, Any]
                        ) -> None:
        if self.timer is not None and not self._script_hook and not self._ours_registered:
            self._ours_registered = True  # first forward: the script registered no hook
            DDP.register_comm_hook(module, None, self.timer.hook)
        if not torch.is_grad_enabled():
            return  # an evaluation pass (no_grad): not a training step's batch
        now = time.perf_counter()
        if self.step == 0 and self._idle_since is None:
            self._interval.start = now  # the first report's rates start with training
        if self._idle_since is not None and self.timer is not None:
            self.timer.add_data_wait(now - self._idle_since)
        self._idle_since = None
        self._samples += _first_batch_size(args, kwargs) or 0
        self._phase("forward")
        self._forward_stamp = self.timer.stamp() if self.timer is not None else None

    def _after_forward(self, module: DDP, args: Any, output: Any) -> None:
        if self.timer is not None and self._forward_stamp is not None and \
                torch.is_grad_enabled():
            self.timer.phase("forward", self._forward_stamp, self.timer.stamp())
        self._forward_stamp = None

    def _before_opt_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.optimizers or optimizer is self.optimizers[0]:
            self._phase("optimizer")
            self._opt_stamp = self.timer.stamp() if self.timer is not None else None

    def _after_opt_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if optimizer not in self.optimizers:
            self.optimizers.append(optimizer)
        if optimizer is not self.optimizers[0]:
            return  # the first optimizer counts the steps (a GAN's second one does not)
        if self.timer is not None and self._opt_stamp is not None:
            self.timer.phase("optimizer", self._opt_stamp, self.timer.stamp())
        self._end_step()

    # ------------------------------------------------------------------------- steps
    def _end_step(self) -> None:
        """A step ended (the first optimizer's, or a should_stop() call in a loop without
        one): count it, and take part in the agreed-stop round when one is due."""
        if self.outcome is not None:
            return
        if self.timer is not None:
            self.timer.end_step()
        self.step += 1
        self._interval.add(self._loss, self._samples)
        self._loss, self._samples = None, 0
        last = self.cfg.max_steps is not None and self.step >= self.cfg.max_steps
        self._phase("stop_check")
        stopping = False
        if self._agreeing():
            due = self.step % self.cfg.log_every == 0 or last
            rounds = self.stop.after_step(self.step, self._row if due else None, flush=last)
            stopping = self.reporter.publish(rounds, self.step, self.epoch) or self.stop.stopping
            if due:
                self._say_unavailable()
        self._idle_since = time.perf_counter()
        self._phase("data")
        if stopping or last:
            self._end("stopped" if stopping else "completed")

    def _agreeing(self) -> bool:
        """Whether the ranks can agree (a side group, or one rank alone): a script that
        never calls init_process_group in a run of several ranks cannot be stopped at an
        agreed step (torchrun's signals still end it)."""
        return self.group is not None or self.info.world_size == 1

    def _row(self) -> list[float]:
        """This rank's report since the last one, as the round's row (reporting steps
        only)."""
        self._phase("report")  # the loss read waits for the device (on CUDA: its all-reduce)
        values: dict[str, float | None] = dict(self._interval.take())  # the loss's .item():
        # a host-device sync point, on reporting steps only
        if self.heartbeat is not None:
            self.heartbeat.synced(self.step)
        if self.ddp is None:
            values["samples_per_s"] = None  # no forward seen: the batch size is unknown
        if self.timer is not None:
            values.update(self.timer.collect())
            if self.sync_missing:  # no timed hook: zeros would claim a sync that took no time
                values.update(dict.fromkeys(SYNC_FIELDS))
        if self.sampler is not None:
            values.update(self.sampler.latest())
        values["process_cpu_s"] = time.process_time()
        values["logged_keys"] = self.logged.take(self.step)
        values["local_rank"] = self.info.local_rank
        values["on_cuda"] = 1.0 if self.device.type == "cuda" else 0.0
        row = self.reporter.row(self.step, self.epoch, values)
        self._phase("stop_check")  # the round that carries it
        return row

    def _end(self, outcome: str) -> None:
        """Every rank agreed to end after this step: the last report, the checkpoint, and
        (unless the script watches should_stop()) out of the script."""
        self.outcome = outcome
        self._last_report()
        if outcome == "stopped":
            self.reporter.event("stopping", step=self.step, reason=self.stop.reason)
            self._phase("checkpoint")
            save_at_stop(self)
        self._finished = True
        if not self.uses_should_stop:
            raise ScriptStopped(self.step, outcome)

    def finish(self) -> None:
        """The last report of a script that ends by itself (at its destroy_process_group, or
        when it returns): every rank calls it at the same point. Idempotent."""
        if self._finished:
            return
        self._finished = True
        if self._agreeing() and (self.step or self.group is not None):
            self._last_report()

    def _last_report(self) -> None:
        """The round left in flight, and the report of the steps since the last one."""
        if not self._agreeing():
            return
        rounds = [r for r in [self.stop.settle()] if r is not None]  # in flight: its report too
        if self._interval.steps and not self.reporter.poisoned:
            rounds.append(self.stop.gather(self.step, self._row()))
        self.reporter.publish(rounds, self.step, self.epoch)
        self._say_unavailable()

    def _say_unavailable(self) -> None:
        """Rank 0 tells viewers what this run cannot show, and why (when that changed)."""
        items = self.unavailable()
        if items != self._said:
            self._said = items
            self.reporter.event("unavailable", step=self.step, items=items)

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
        if not self.optimizers and self.outcome is None:
            self._end_step()  # a loop without optimizer steps: each call ends a step
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
        if self.ddp is None:
            out["samples"] = "the script built no DistributedDataParallel (samples/s and " \
                             "forward time come from its forward)"
        if not self._saw_loss:
            out["loss"] = "no one-element tensor was passed to backward()"
        return out
