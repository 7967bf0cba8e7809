"""On-demand profiles (issue 31): every rank runs torch.profiler over the same steps and writes
its trace to ``RUN_DIR/profiles/<time>-step<S>/rank-<N>.json.gz``; rank 0 then reads them all
into ``summary.json`` (:mod:`ddp_engine.common.profile_summary`), in a thread of its own.

The ask comes to rank 0 (``{"type": "profile", "steps": N}`` from a viewer,
:func:`~ddp_engine.rank.profile_ask.answer`) and is agreed in a round
(:class:`~ddp_engine.rank.profile_ask.ProfileAsk`): the round is read after the same step on
every rank, the profiler starts there, warms up over one step (its start-up cost stays out of
the record) and records the next N. A run that is never profiled pays one call per step
that finds nothing to do. Anything that goes wrong turns the profile off on that rank, says so
(``rank-<N>.error.txt``, a warning on rank 0) and leaves training alone.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from ddp_engine.common.profile_files import (
    PROFILES_DIR,
    RECORDED_KEY,
    error_file,
    errors,
    profile_folder_name,
    trace_file,
    traces,
    wait_for_ranks,
)
from ddp_engine.common.profile_summary import write_summary
from ddp_engine.rank.distributed import DistInfo, StopFlag
from ddp_engine.rank.profile_ask import Agreed, ProfileAsk

log = logging.getLogger("ddp_engine.rank.profiling")

Event = Callable[..., None]
"""Rank 0's reporter.event (kind, **fields); a no-op elsewhere."""

WARMUP_STEPS = 1
SUMMARY_WAIT_S = 120.0
"""How long rank 0 waits for the other ranks' traces before summarizing what came."""


class RankProfiler:
    """This rank's part in the agreed profiles; :meth:`after_step` after every step's round."""

    def __init__(self, run_dir: Path, rank: int, local_ranks: range, device: torch.device,
                 ask: ProfileAsk, event: Event | None = None) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.local_ranks = local_ranks
        """The ranks whose traces land in this node's run folder (rank 0 waits for these)."""
        self.device = device
        self.ask = ask
        self.event = event
        self.folder: Path | None = None
        self._prof: profile | None = None
        self._agreed: Agreed | None = None
        self._calls = 0  # prof.step() calls so far
        self._first = 0  # the first recorded step
        self._last_step = 0
        self._exported = False
        self._dropped = False  # the profile is given up: its trace is not written
        self._window_end = 0
        """The step after which the latest agreed profile is over on every rank, whatever
        became of this rank's profiler: a profile agreed meanwhile starts there everywhere."""
        self.own = OwnProfilers(self._give_way)
        """The script's own torch.profiler objects (installed in script runs)."""
        self.summaries: list[threading.Thread] = []

    @classmethod
    def for_rank(cls, run_dir: Path, info: DistInfo, device: torch.device, stop: StopFlag,
                 event: Event) -> RankProfiler:
        """This rank's profiler, agreeing through ``stop``'s rounds; ``event`` publishes on
        rank 0 (it is not called elsewhere)."""
        first = info.node_rank * info.local_world_size
        return cls(run_dir, info.rank, range(first, first + info.local_world_size), device,
                   stop.profile, event if info.rank == 0 else None)

    @property
    def active(self) -> bool:
        return self._prof is not None

    # ------------------------------------------------------------------ every rank
    def after_step(self, step: int) -> None:
        """After step ``step``'s round on every rank: start an agreed profile, or advance the
        running one (and write it after its last step)."""
        # an ask agreed during a profile waits for its end, the same step on every rank
        agreed = self.ask.take() if step >= self._window_end else None
        try:
            if agreed is not None:
                self._window_end = step + WARMUP_STEPS + agreed.steps
                self.ask.recording = True
                self._begin(step, agreed)
            elif self._prof is not None:
                self._advance(step)
        except Exception as e:  # noqa: BLE001 - a broken profile never stops training
            self._fail(e)
        if step >= self._window_end:
            self.ask.recording = False

    def close(self, step: int) -> None:
        """Training ends (completed, stopped): a profile under way is written with the steps
        it recorded; one still warming up is dropped (its folder says why)."""
        self._window_end = min(self._window_end, step)  # no step comes after this one
        self.ask.recording = False
        if self._prof is None:
            return
        try:
            recorded = self._calls - WARMUP_STEPS
            if recorded > 0:  # stop() closes one more step marker, around no step: not a step
                self._prof.add_metadata_json(RECORDED_KEY, str(recorded))
            self._dropped = recorded <= 0  # stop() may write the trace: of no step, then
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch: "RECORD followed by NONE"
                self._prof.stop()
            if self._dropped:
                self._note(f"training ended at step {step}, before the profile's first "
                           "recorded step")
            elif not self._exported:
                self._last_step = step
                self._write(self._prof)
        except Exception as e:  # noqa: BLE001
            self._fail(e)
        finally:
            self._prof = None

    def _begin(self, step: int, agreed: Agreed) -> None:
        self._agreed = agreed
        self.folder = self.run_dir / PROFILES_DIR / profile_folder_name(agreed.asked_at, step)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._first = step + WARMUP_STEPS + 1
        self._calls = 0
        self._exported = self._dropped = False
        if self.own.live or torch._C._autograd._profiler_enabled():
            self._note("the script's own torch.profiler was running on this rank: torch "
                       "allows one profiler at a time, so this rank was not profiled")
            return
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities,
                       schedule=schedule(wait=0, warmup=WARMUP_STEPS, active=agreed.steps,
                                         repeat=1),
                       on_trace_ready=self._write, record_shapes=agreed.shapes,
                       with_stack=agreed.stacks)
        setattr(prof, OURS, True)  # not the script's (OwnProfilers)
        prof.start()
        self._prof = prof
        if self.event is not None:
            self.event("profile", state="started", folder=str(self.folder), step=step,
                       first_step=self._first, steps=agreed.steps, id=agreed.asked_at)

    def _advance(self, step: int) -> None:
        assert self._prof is not None and self._agreed is not None
        self._last_step = step
        self._calls += 1
        self._prof.step()  # after the last recorded step: on_trace_ready writes the trace
        if self._calls == WARMUP_STEPS:  # recording now: the trace takes metadata
            self._prof.add_metadata_json("rankscope", json.dumps({
                "rank": self.rank, "first_step": self._first, "steps": self._agreed.steps,
                "asked_at": self._agreed.asked_at, "device": str(self.device)}))
        if self._calls >= WARMUP_STEPS + self._agreed.steps:
            self._prof.stop()
            self._prof = None

    def _write(self, prof: profile) -> None:
        """on_trace_ready: this rank's trace, gzipped, under its final name only when whole."""
        assert self.folder is not None
        self._exported = True
        if self._dropped:
            return
        final = trace_file(self.folder, self.rank)
        part = final.with_name(f".{final.name[:-len('.json.gz')]}.part.json.gz")
        prof.export_chrome_trace(str(part))  # torch gzips a name ending in .gz
        os.replace(part, final)
        log.info("profile of steps %d-%d written to %s", self._first, self._last_step, final)
        self._written()

    def _note(self, why: str) -> None:
        """This rank has no trace in this profile: say why, where the summary looks."""
        if self.folder is not None:
            error_file(self.folder, self.rank).write_text(why + "\n", encoding="utf-8")
        log.warning("profile: %s", why)
        self._written()

    def _give_way(self) -> None:
        """The script starts a profiler of its own: ours stops first (torch allows one at a
        time; two crash the process), and this rank's profile is given up, saying why."""
        prof, self._prof = self._prof, None
        if prof is None:
            return
        try:
            self._dropped = True
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                prof.stop()
            self._note("the script started its own torch.profiler during this profile: this "
                       "rank's profile was given up (torch allows one profiler at a time)")
        except Exception as e:  # noqa: BLE001
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    prof.stop()
            except Exception:  # noqa: BLE001,S110 - it is being given up anyway
                pass
        why = f"profiling failed on rank {self.rank} ({type(e).__name__}: {e}); training goes on"
        try:
            self._note(why)
        except Exception:  # noqa: BLE001 - nothing more to say it with
            log.warning("profile: %s", why)
        if self.event is not None:
            try:
                self.event("warning", cause="profile", message=why)
            except Exception:  # noqa: BLE001,S110 - the run's record says it otherwise
                pass

    def _written(self) -> None:
        """Rank 0: read every local rank's trace into summary.json, in a thread (the traces
        of the other ranks may still be on their way)."""
        if self.rank != 0 or self.folder is None:
            return
        folder, event = self.folder, self.event
        ranks = self.local_ranks
        asked = self._agreed.asked_at if self._agreed is not None else None

        def summarize() -> None:
            try:
                missing = wait_for_ranks(folder, ranks, SUMMARY_WAIT_S)
                if not traces(folder):  # every rank said why it has none
                    if event is not None:
                        event("profile", state="failed", folder=str(folder), id=asked,
                              reason="; ".join(f"rank {r}: {w}"
                                               for r, w in errors(folder).items())
                              or f"no trace came within {SUMMARY_WAIT_S:g} s")
                    return
                started = time.monotonic()
                summary = write_summary(folder)
                if event is not None:
                    event("profile", state="written", folder=str(folder), id=asked,
                          summary=str(folder / "summary.json"), missing=missing,
                          analysis_s=round(time.monotonic() - started, 3),
                          steps=summary.get("steps"), step_time_ms=summary.get("step_time_ms"))
            except Exception as e:  # noqa: BLE001 - the traces are there; the app reads them
                log.warning("profile summary failed: %s: %s", type(e).__name__, e)
                if event is not None:
                    event("warning", cause="profile", message=f"the profile in {folder} was "
                          f"written but could not be summarized ({type(e).__name__}: {e})")

        thread = threading.Thread(target=summarize, name="rankscope-profile-summary",
                                  daemon=True)
        thread.start()
        self.summaries.append(thread)




OURS = "_rankscope_profile"
"""Set on Rankscope's own torch.profiler objects, which :class:`OwnProfilers` leaves out."""


class OwnProfilers:
    """The script's own ``torch.profiler.profile`` objects, live from ``start()`` (``with``)
    to ``stop()``, through every phase of their schedule (waiting, warming up, recording):
    torch allows one profiler at a time, so a profile of ours neither starts while one is
    live nor keeps running when the script starts one. Installed in script runs."""

    def __init__(self, give_way: Callable[[], None]) -> None:
        self.live: weakref.WeakSet[profile] = weakref.WeakSet()
        self._give_way = give_way
        self._saved: tuple[Any, Any] | None = None

    def install(self) -> None:
        if self._saved is not None:
            return
        start, stop = profile.start, profile.stop
        owned = self

        def started(prof: profile) -> None:
            if not getattr(prof, OURS, False):
                owned.live.add(prof)
                owned._give_way()
            start(prof)

        def stopped(prof: profile) -> None:
            try:
                stop(prof)
            finally:
                owned.live.discard(prof)

        setattr(profile, "start", started)  # noqa: B010 - a patch of torch's class
        setattr(profile, "stop", stopped)  # noqa: B010
        self._saved = (start, stop)

    def uninstall(self) -> None:
        if self._saved is not None:
            setattr(profile, "start", self._saved[0])  # noqa: B010
            setattr(profile, "stop", self._saved[1])  # noqa: B010
            self._saved = None
