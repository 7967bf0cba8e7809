"""The training loop: the standard DDP recipe, with an agreed stop at step boundaries."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_values import batch_exceeds_data
from ddp_engine.common.heartbeat import Heartbeat
from ddp_engine.rank import checkpoint
from ddp_engine.rank.data import DataBundle, build_datasets, make_loader
from ddp_engine.rank.device_sampler import DeviceSampler
from ddp_engine.rank.distributed import DistContext, StopFlag
from ddp_engine.rank.evaluation import validation_metrics
from ddp_engine.rank.flops import count_step_flops, flops_event_fields
from ddp_engine.rank.logged import LoggedScalars
from ddp_engine.rank.losses import build_loss
from ddp_engine.rank.lr_schedule import LrSchedule
from ddp_engine.rank.models import build_model
from ddp_engine.rank.places import rank_places
from ddp_engine.rank.profiling import RankProfiler
from ddp_engine.rank.reducer_timing import ReducerTiming, sync_source
from ddp_engine.rank.report_pace import ReportPace
from ddp_engine.rank.reporter import Reporter
from ddp_engine.rank.reports import (
    DEVICE_KEYS,
    TIMING_FIELDS,
    Interval,
)
from ddp_engine.rank.save_wait import while_rank0_writes
from ddp_engine.rank.sync_timing import StepTimer
from ddp_engine.rank.telemetry import Telemetry

log = logging.getLogger("ddp_engine.rank.trainer")

@dataclass
class Position:
    """Where training is: optimizer steps done, and the place within the current epoch."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0


def build_optimizer(cfg: RunConfig, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer ``cfg`` names (sgd, adam or adamw) with its lr, momentum and decay."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


class Trainer:
    """Builds model, data and optimizer from a RunConfig and runs the loop on one rank."""

    def __init__(self, cfg: RunConfig, ctx: DistContext, run_dir: Path, stop: StopFlag,
                 telemetry: Telemetry | None = None, heartbeat: Heartbeat | None = None) -> None:
        self.cfg = cfg
        self.heartbeat = heartbeat
        if heartbeat is not None:
            heartbeat.device = ctx.device.type  # on CUDA its host may run ahead of the GPU
        self.ctx = ctx
        self.rank = ctx.info.rank
        self.world = ctx.info.world_size
        self.device = ctx.device
        self.run_dir = run_dir
        self.stop = stop
        self.telemetry = telemetry  # rank 0 only
        self.logged = LoggedScalars()  # the lr, and what rankscope.log adds
        self.reporter = Reporter(cfg, stop, telemetry, self.logged, self._kept)
        self.pos = Position()
        self._last_eval_step = -1
        self._last_checkpoint_step: int | None = None
        # RANKSCOPE_SYNC_DEBUG=1: torch.cuda.set_sync_debug_mode("warn") around each step, so a
        # host-device synchronization inside the step shows up as a warning in the rank's log.
        self._sync_debug = (os.environ.get("RANKSCOPE_SYNC_DEBUG") == "1"
                            and ctx.device.type == "cuda")

        self.places = rank_places(ctx.info, ctx.side_group, ctx.device)  # host, node, GPU per rank
        self.reporter.attach(ctx.side_group, self.places)
        self.profiler = RankProfiler.for_rank(run_dir, ctx.info, ctx.device, stop,
                                              self.reporter.event)
        self.data: DataBundle = self._build_data()
        torch.manual_seed(cfg.seed)  # same initial weights everywhere (DDP broadcasts rank 0's)
        model = build_model(cfg, self.data.info).to(self.device)
        on_cuda = self.device.type == "cuda"
        self.model = DDP(model, device_ids=[self.device.index] if on_cuda else None,
                         find_unused_parameters=cfg.find_unused_parameters)
        torch.manual_seed(cfg.seed + self.rank)  # each rank its own dropout, augmentation, ...
        # Sync timing from DDP's reducer timers (sampled once per report: nothing per step),
        # or with --sync-timing hook from the timing hook: then the step divides its loss by
        # the world size and the hook sums the buckets, the same mean gradient as DDP's
        # all-reduce without the extra pass over every gradient that a hook dividing each
        # bucket costs (sync_timing's docstring).
        self.timer = StepTimer(self.device, divide=False) if cfg.telemetry else None
        self.reducer_timing: ReducerTiming | None = None
        self.sync_note: str | None = None
        self._loss_factor = 1.0
        if self.timer is not None:
            source, self.sync_note = sync_source(cfg.sync_timing)
            if source == "reducer":
                self.reducer_timing = ReducerTiming(ReportPace.of(cfg).every)
                self.reducer_timing.watch(self.model)
            else:
                self._loss_factor = 1.0 / self.world
                self.model.register_comm_hook(None, self.timer.hook)
        self.sync_timing = (None if self.timer is None
                            else "reducer" if self.reducer_timing is not None else "hook")
        """Where this run's sync timing comes from (run_start's ``sync_timing``)."""
        gpu_uuid = (f"GPU-{torch.cuda.get_device_properties(self.device).uuid}"
                    if on_cuda and cfg.telemetry else None)
        self.device_sampler = (DeviceSampler(self.device.type, ctx.info.local_rank, gpu_uuid)
                               if cfg.telemetry else None)
        self.optimizer = build_optimizer(cfg, self.model.parameters())
        self.loss_fn = build_loss(cfg.loss)
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
        self.scaler = torch.amp.GradScaler("cuda") if cfg.precision == "fp16" else None

        self.loader, self.sampler = make_loader(
            self.data.train, rank=self.rank, world_size=self.world, batch_size=cfg.batch_size,
            seed=cfg.seed, shuffle=True, num_workers=cfg.num_workers, pin_memory=on_cuda,
            drop_last=True)
        self.steps_per_epoch = len(self.loader) // cfg.grad_accum
        if self.steps_per_epoch == 0:
            n = len(self.data.train)  # type: ignore[arg-type]
            raise ConfigError(batch_exceeds_data(cfg.batch_size, cfg.grad_accum, self.world, n)
                              or f"batch_size: no step fits the {n} training samples")
        limits = [cfg.max_steps or math.inf]
        if cfg.total_epochs is not None:
            limits.append(cfg.total_epochs * self.steps_per_epoch)
        self.total_steps = int(min(limits))
        self.reporter.total_steps = self.total_steps
        self.val_loader = None
        if self.data.val is not None and len(self.data.val) > 0:  # type: ignore[arg-type]
            self.val_loader, _ = make_loader(
                self.data.val, rank=self.rank, world_size=self.world, batch_size=cfg.batch_size,
                seed=cfg.seed, shuffle=False, num_workers=0, pin_memory=on_cuda,
                drop_last=False)
        if cfg.resume:
            self._resume(cfg.resume)
        # After the resume: a function of the global step, rebuilt at the step resumed from.
        self.lr_schedule = LrSchedule.build(self.optimizer, cfg, self.total_steps, self.pos.step)

    # ------------------------------------------------------------------------------ set-up
    def _build_data(self) -> DataBundle:
        """Build the datasets; when they are downloaded, local rank 0 alone downloads first."""
        if not self.cfg.dataset_args.get("download"):
            return build_datasets(self.cfg)
        first = self.ctx.info.local_rank == 0
        data = build_datasets(self.cfg) if first else None
        dist.barrier(group=self.ctx.side_group)
        if data is None:
            data = build_datasets(dataclasses.replace(
                self.cfg, dataset_args={**self.cfg.dataset_args, "download": False}))
        return data

    def _resume(self, path: str) -> None:
        # Mapped on the CPU, not read: load_state_dict copies into the parameters on their
        # devices, and RNG states must stay CPU byte tensors.
        state = checkpoint.load_into(path, self.model.module, self.optimizer, self.scaler)
        self.pos = Position(int(state["step"]), int(state["epoch"]),
                            int(state["step_in_epoch"]))
        rngs = state.get("rng") or []
        if len(rngs) == self.world:
            checkpoint.restore_rng(rngs[self.rank])
        else:
            torch.manual_seed(self.cfg.seed + self.rank + 1_000_003 * self.pos.step)
        log.info("resumed from %s at step %d (epoch %d, step %d of it)", path, self.pos.step,
                 self.pos.epoch, self.pos.step_in_epoch)

    # ------------------------------------------------------------------------------ the loop
    def run(self) -> str:
        """Train until done or an agreed stop. Returns "completed" or "stopped"."""
        if self.device_sampler is not None:
            self.device_sampler.start()
        try:
            return self._run()
        finally:
            if self.device_sampler is not None:
                self.device_sampler.request_stop()

    def _run(self) -> str:
        cfg = self.cfg
        flops = (count_step_flops(self.model.module, self.loader, self.loss_fn, self.device,
                                  self.autocast_dtype, cfg.grad_accum)
                 if cfg.telemetry else None)  # once, before the first timed step
        self.reporter.event("run_start", total_steps=self.total_steps, world_size=self.world,
                         steps_per_epoch=self.steps_per_epoch, backend=self.ctx.backend,
                         start_step=self.pos.step,
                         nnodes=len({p.get("node") for p in self.places}),
                         hosts=sorted({str(p.get("host")) for p in self.places}),
                         sync_timing=self.sync_timing)
        if self.sync_note is not None:
            self.reporter.event("warning", step=self.pos.step, cause="sync_timing",
                                message=self.sync_note)
        if flops is not None:
            self.reporter.event("flops", **flops_event_fields(
                flops, cfg.precision, self.device, cfg.batch_size, cfg.grad_accum, self.places))
        outcome = "completed"
        interval = Interval()
        self.model.train()
        while self.pos.step < self.total_steps:
            self.sampler.set_epoch(self.pos.epoch)
            self.sampler.skip(self.pos.step_in_epoch * cfg.grad_accum * cfg.batch_size)
            self.reporter.event("epoch_start", epoch=self.pos.epoch)
            batches = iter(self.loader)
            while self.pos.step_in_epoch < self.steps_per_epoch:
                if self._sync_debug:  # report any host-device sync inside the step
                    torch.cuda.set_sync_debug_mode("warn")
                loss = self._train_step(batches)
                if self._sync_debug:
                    torch.cuda.set_sync_debug_mode("default")
                self.pos.step += 1
                self.pos.step_in_epoch += 1
                interval.add(loss, cfg.batch_size * cfg.grad_accum)
                step = self.pos.step
                last = step >= self.total_steps
                checkpoint_due = bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0
                # A checkpoint step is a reporting step too, read at once: the loss is checked
                # before the weights are saved, so a NaN never reaches last.pt.
                report_due = self.stop.report_due(step) or last or checkpoint_due
                self._phase("stop_check")
                rounds = self.stop.after_step(
                    step, (lambda: self._report(interval)) if report_due else None,
                    flush=checkpoint_due or last)
                self.profiler.after_step(step)
                if self.reporter.publish(rounds, step, self.pos.epoch) or self.stop.stopping:
                    outcome = "stopped"
                    break
                if checkpoint_due:
                    self.save_checkpoint(periodic=True)
                if self.val_loader is not None and cfg.eval_every and step % cfg.eval_every == 0:
                    interval.eval_s += self.evaluate()["eval_s"]  # work the steps waited for
                    self.model.train()
                if last:
                    break
            if outcome == "stopped":
                break
            if self.pos.step_in_epoch >= self.steps_per_epoch:
                self.pos.epoch += 1
                self.pos.step_in_epoch = 0
        self.stop.settle()  # a round left in flight by a break (its report is not needed)
        self.profiler.close(self.pos.step)
        if interval.steps and not self.reporter.poisoned:  # the steps since the last report
            self.reporter.publish([self.stop.gather(self.pos.step, self._report(interval))],
                                  self.pos.step, self.pos.epoch)
        if outcome == "stopped":
            self.reporter.event("stopping", step=self.pos.step, reason=self.stop.reason)
        elif self.val_loader is not None and self._last_eval_step != self.pos.step:
            self.evaluate()
        if not self.reporter.poisoned:  # weights after a NaN loss are not worth keeping
            self.save_checkpoint(periodic=False)
        self.reporter.event(outcome, step=self.pos.step, epoch=self.pos.epoch)
        return outcome

    def _train_step(self, batches: Iterator[Any]) -> torch.Tensor:
        """One optimizer step over grad_accum micro-batches; returns the mean loss (on device,
        detached). Per-step work only: what can wait for a reporting step, waits."""
        cfg = self.cfg
        timer = self.timer
        accum = cfg.grad_accum
        on_cpu = self.device.type == "cpu"
        total: torch.Tensor | None = None
        for micro in range(accum):
            self._phase("data")
            t0 = time.perf_counter()
            x, y = next(batches)
            if timer is not None:
                timer.add_data_wait(time.perf_counter() - t0)
            if not on_cpu:
                x = x.to(self.device, non_blocking=True)
                y = y.to(self.device, non_blocking=True)
            last = micro == accum - 1
            # no_sync skips the gradient all-reduce on all but the last micro-step.
            with contextlib.nullcontext() if last else self.model.no_sync():
                self._phase("forward")
                s0 = timer.stamp() if timer is not None else None
                if self.autocast_dtype is None:
                    loss = self.loss_fn(self.model(x), y)
                else:
                    with torch.autocast(self.device.type, dtype=self.autocast_dtype):
                        loss = self.loss_fn(self.model(x), y)
                if accum > 1:
                    loss = loss / accum
                grad_loss = loss if self._loss_factor == 1.0 else loss * self._loss_factor
                s1 = timer.stamp() if timer is not None else None
                self._phase("backward")  # ends waiting for the gradient all-reduce
                if self.scaler is not None:
                    self.scaler.scale(grad_loss).backward()
                else:
                    grad_loss.backward()
                if timer is not None:
                    s2 = timer.stamp()
                    timer.phase("forward", s0, s1)
                    timer.phase("backward", s1, s2)
                    if last:
                        timer.mark_backward_end(s2)
            part = loss.detach()
            total = part if total is None else total + part
        s3 = timer.stamp() if timer is not None else None
        self._phase("optimizer")
        if cfg.grad_clip is not None:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        if self.scaler is not None:
            self._phase("sync")  # the scaler reads found_inf: the host waits for the all-reduce
            self.scaler.step(self.optimizer)
            self._synced()
            self._phase("optimizer")
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.lr_schedule is not None:  # after the step, taken or skipped by the scaler
            self.lr_schedule.step()
        # The lr the next step uses, a Python float: no sync; read on reporting steps.
        self.logged.log_shared("lr", self.optimizer.param_groups[0]["lr"])  # alike everywhere
        self.optimizer.zero_grad(set_to_none=True)
        if timer is not None:
            timer.phase("optimizer", s3, timer.stamp())
            timer.end_step()
        assert total is not None
        return total

    # ------------------------------------------------------------------------------ reporting
    def _phase(self, phase: str) -> None:
        """Tell the heartbeat where the loop is (two attribute writes, no I/O)."""
        if self.heartbeat is not None:
            self.heartbeat.enter(phase, self.pos.step)

    def _synced(self) -> None:
        """Tell the heartbeat the host saw the device finish this step (a sync point)."""
        if self.heartbeat is not None:
            self.heartbeat.synced(self.pos.step)

    def _report(self, interval: Interval) -> list[float]:
        """:meth:`_row` in the ``report`` phase: its loss read is where the host waits for the
        device (on CUDA, for the step's queued all-reduce too), and a hang there is in it."""
        self._phase("report")
        row = self._row(interval)
        self._synced()
        self._phase("stop_check")
        return row

    def _kept(self) -> str:
        """Which checkpoint a run that ends now leaves, in words."""
        last = self._last_checkpoint_step
        return (f"checkpoints/last.pt (step {last}) is kept" if last is not None
                else "no checkpoint was saved before it")

    def _row(self, interval: Interval) -> list[float]:
        """This rank's report since the last one, as floats in REPORT_FIELDS order (NaN for
        None). Taken on reporting steps only."""
        values: dict[str, float | None] = dict(interval.take())  # the loss's .item(): a
        # host-device sync point, on reporting steps only
        values.update(self.timer.collect() if self.timer is not None
                      else dict.fromkeys(TIMING_FIELDS))
        if self.reducer_timing is not None:
            values.update(self.reducer_timing.read())  # sync: DDP's own timers, one sample
        values.update(self.device_sampler.latest() if self.device_sampler is not None
                      else dict.fromkeys(DEVICE_KEYS))
        values["process_cpu_s"] = time.process_time()  # CPU work so far: what a cost costs
        values["logged_keys"] = self.logged.take(self.pos.step)
        values["local_rank"] = self.ctx.info.local_rank
        values["on_cuda"] = 1.0 if self.device.type == "cuda" else 0.0
        return self.reporter.row(self.pos.step, self.pos.epoch, values)

    def evaluate(self) -> dict[str, float]:
        """Validation loss (and accuracy for classification) over all ranks' shards, and how
        long it took (``eval_s``, this rank's seconds)."""
        assert self.val_loader is not None
        self._phase("eval")
        started = time.perf_counter()
        result = validation_metrics(self.model, self.val_loader, self.loss_fn, self.device,
                                    self.autocast_dtype, self.data.info.task == "classification")
        self._synced()  # its metrics were read off the device
        result["eval_s"] = time.perf_counter() - started
        self._last_eval_step = self.pos.step
        self.reporter.event("eval", step=self.pos.step, epoch=self.pos.epoch, **result)
        return result

    # ------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, *, periodic: bool) -> None:
        """Collective: every rank contributes its RNG state; rank 0 alone writes the file while
        the others wait for it on the side group, however long the write takes (no collective
        timeout, no stop watchdog meanwhile: :mod:`ddp_engine.rank.save_wait`)."""
        self._phase("checkpoint")
        group = self.ctx.side_group
        rngs: list[Any] = [None] * self.world
        dist.all_gather_object(rngs, checkpoint.capture_rng(), group=group)
        while_rank0_writes(group, self.rank, lambda: self._write_checkpoint(rngs, periodic),
                           self.cfg.dist_timeout_s, self.stop)
        self._last_checkpoint_step = self.pos.step

    def _write_checkpoint(self, rngs: list[Any], periodic: bool) -> None:
        """Rank 0: last.pt (and step-N.pt, if kept) from this rank's state and ``rngs``, in the
        heartbeat's ``save`` phase (not a collective: the others wait for this rank)."""
        self._phase("save")
        pos = self.pos
        epoch, step_in_epoch = pos.epoch, pos.step_in_epoch
        if step_in_epoch >= self.steps_per_epoch:
            epoch, step_in_epoch = epoch + 1, 0
        payload = {
            "format": checkpoint.FORMAT,
            "format_version": checkpoint.FORMAT_VERSION,
            "model": self.model.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "step": pos.step,
            "epoch": epoch,
            "step_in_epoch": step_in_epoch,
            "world_size": self.world,
            "rng": rngs,
            "config": self.cfg.to_dict(),
        }
        folder = self.run_dir / "checkpoints"
        paths = [folder / "last.pt"]
        if periodic and self.cfg.keep_step_checkpoints:
            paths.append(folder / f"step-{pos.step}.pt")
        for path in paths:
            try:
                checkpoint.save_atomic(payload, path)
            except OSError as e:  # full disk, quota, permissions: the previous file is intact
                raise checkpoint.write_error(e, pos.step, path, self._kept()) from e
            if path.name == "last.pt":
                self._last_checkpoint_step = pos.step
        self._synced()  # the weights were copied off the device
        self._phase("checkpoint")
        self.reporter.event("checkpoint_saved", step=pos.step, epoch=epoch,
                            paths=[str(p) for p in paths])
