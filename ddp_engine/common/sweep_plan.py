"""Scaling sweeps, as planned and as recorded (no torch: the app plans and reads sweeps here).

A sweep trains one config on 1, 2, ... N devices in turn and measures the throughput of each
count (the runner is :mod:`ddp_engine.launch.sweep`). It is a *run group*::

    <runs_dir>/<name>-sweep-<YYYYmmdd-HHMMSS>/   (or exactly --run-dir)
        group.json        the sweep: state, counts, steps, results per count
        nproc-1/          an ordinary run folder (docs/RUN_FOLDER.md) trained on 1 device
        nproc-2/          ... on 2 devices, and so on

Every count is an ordinary launch, ``python -m ddp_engine launch --config nproc-N/launch.toml``,
started as a child process in a session of its own (a Ctrl+C in the terminal reaches only the
sweep, which forwards one SIGTERM: the launcher's agreed stop) with the kernel's parent-death
signal armed (a sweep that is killed takes its launcher along). Counts run one after the other,
never at once. The per-process batch size is kept (weak scaling, as DDP itself scales), so ideal
scaling is a throughput ``n`` times that of one device.

group.json is rewritten atomically after every change; its only writer is the sweep process.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddp_engine.common import gpus
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.inventory import NVML_TIMEOUT_S, GpuInventory, gpu_inventory_within
from ddp_engine.common.machine_checks import check_devices, check_environment, resolved_device
from ddp_engine.common.run_dir import new_run_dir, read_json

GROUP_FILE = "group.json"
GROUP_KIND = "scaling_sweep"
GROUP_VERSION = 1
LAUNCH_FILE = "launch.toml"
LAUNCHER_LOG = "launcher.log"
DEFAULT_STEPS = 50
SWEEP_LOG_EVERY = 10
"""A count's report interval in steps, unless the config gives ``log_every``."""
MAX_DEFAULT_CPU_COUNT = 8
"""Default counts on CPU go up to the number of cores, at most this many."""



def subrun_name(nproc: int) -> str:
    """The folder of one count inside the group: ``nproc-N``."""
    return f"nproc-{nproc}"


# ------------------------------------------------------------------------- throughput math
def line_throughput(msg: Mapping[str, Any]) -> float | None:
    """Samples/s of one ``metrics`` line: the sum over its ranks (missing values skipped).

    Returns:
        The total, or None when no rank reported a number.
    """
    values = [r.get("samples_per_s") for r in msg.get("ranks") or []]
    numbers = [float(v) for v in values if isinstance(v, int | float)]
    return sum(numbers) if numbers else None


def line_step_time(msg: Mapping[str, Any]) -> float | None:
    """Seconds per step of one ``metrics`` line: the slowest rank's (the all-reduce makes the
    others wait for it), or None when no rank reported one."""
    values = [r.get("step_time_s") for r in msg.get("ranks") or []]
    numbers = [float(v) for v in values if isinstance(v, int | float)]
    return max(numbers) if numbers else None


def steady_median(values: Sequence[float | None]) -> float | None:
    """The median of per-report values, without the first report (warm-up) when there are 3 or
    more reports. None values are reports without a number: they count as reports for the
    warm-up rule and are then skipped.

    Args:
        values: one value per metrics line, in order.

    Returns:
        The median, or None when nothing is left.
    """
    kept = list(values[1:] if len(values) >= 3 else values)
    numbers = [v for v in kept if v is not None]
    return statistics.median(numbers) if numbers else None


def run_throughput(metrics: Iterable[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """Throughput of one run from its metrics.jsonl lines (other message types are skipped).

    Args:
        metrics: parsed metrics.jsonl lines, e.g. ``run_dir.iter_metrics(folder)``.

    Returns:
        ``(samples_per_s, step_time_s)``: medians over the metrics lines (see
        :func:`steady_median`), each None when there is no number.
    """
    lines = [m for m in metrics if m.get("type") == "metrics"]
    return (steady_median([line_throughput(m) for m in lines]),
            steady_median([line_step_time(m) for m in lines]))


def efficiencies(throughputs: Mapping[int, float | None]) -> dict[int, float | None]:
    """Scaling efficiency per process count: ``thr(n) / (thr(base) * n / base)``.

    ``base`` is the smallest count that has a throughput; counts without one get None.

    Args:
        throughputs: samples/s by process count (None: no measurement).

    Returns:
        Efficiency by process count (1.0 for the base; 1.0 everywhere is perfect scaling).
    """
    measured = {n: t for n, t in throughputs.items() if t is not None and t > 0}
    if not measured:
        return {n: None for n in throughputs}
    base = min(measured)
    per_device = measured[base] / base
    return {n: (measured[n] / (per_device * n) if n in measured else None) for n in throughputs}


MIN_REPORTS = 3
"""Fewer reports than this leave no steady median (the first, warm-up, is kept)."""
MAX_EFFICIENCY = 1.1
"""Above this, scaling better than linear: a measurement to distrust, not a result."""


def count_warning(reports: int, efficiency: float | None) -> str | None:
    """Why a count's numbers should not be trusted, in words, or None: too few reports to leave
    out the warm-up, or an efficiency above :data:`MAX_EFFICIENCY`."""
    if reports < MIN_REPORTS:
        return (f"only {reports} report{'s' if reports != 1 else ''}: the throughput includes "
                f"the warm-up; raise --steps (at least {MIN_REPORTS} reports)")
    if efficiency is not None and efficiency > MAX_EFFICIENCY:
        return (f"efficiency {efficiency:.2f} is above {MAX_EFFICIENCY}, better than linear: "
                "the smaller count was slowed (warm-up, other work on the machine); raise "
                "--steps or run again")
    return None


def result_rows(runs: Sequence[tuple[int, str | None, float | None, float | None, int]]
                ) -> list[dict[str, Any]]:
    """group.json's ``results``: one row per finished count, with ``warning`` (see
    :func:`count_warning`) where its numbers are not to be trusted.

    Args:
        runs: ``(nproc, state, samples_per_s, step_time_s, reports)`` per finished count.
    """
    eff = efficiencies({n: thr for n, _, thr, _, _ in runs})
    return [{"nproc": n, "run": subrun_name(n), "state": state, "samples_per_s": thr,
             "samples_per_s_per_device": thr / n if thr is not None else None,
             "efficiency": eff[n], "step_time_s": step_time, "reports": reports,
             "warning": count_warning(reports, eff[n]) if thr is not None else None}
            for n, state, thr, step_time, reports in runs]


# ---------------------------------------------------------------------------------- planning
def parse_counts(text: str) -> list[int]:
    """``--counts 1,2,4`` as a list (an argparse ``type``; ranges are checked by plan_sweep)."""
    try:
        counts = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"counts must be comma-separated process counts such as 1,2,4; got {text!r}") from None
    if not counts:
        raise argparse.ArgumentTypeError(f"counts must list at least one process count such as "
                                         f"1,2,4; got {text!r}")
    return counts


@dataclasses.dataclass
class SweepPlan:
    """A checked sweep: the base config, the counts in order, and where they run."""

    cfg: RunConfig
    """The config as given (its max_steps, epochs, nproc and gpus are replaced per count)."""
    counts: list[int]
    """Process counts, ascending, each at most once."""
    steps: int
    """Optimizer steps per count."""
    device: str
    """``cuda`` or ``cpu``."""
    gpus: list[int] | None
    """The chosen GPUs on CUDA (count n uses the first n), None on CPU."""

    def group_dir(self) -> Path:
        """The group folder: ``--run-dir`` exactly, else a new ``<name>-sweep-<stamp>`` folder
        under ``runs_dir`` (created by this call)."""
        if self.cfg.run_dir:
            path = Path(self.cfg.run_dir).resolve()
            path.mkdir(parents=True, exist_ok=True)
            return path
        return new_run_dir(self.cfg.runs_dir, self.cfg.default_name() + "-sweep").resolve()

    def subrun_config(self, nproc: int, group_dir: Path) -> RunConfig:
        """The launch config of one count: the base with nproc, devices, steps and folder set,
        and reports every :data:`SWEEP_LOG_EVERY` steps unless ``log_every`` was given (a
        count's throughput is a median over its reports: the default pace, at least 0.2 s
        apart, would leave two reports in 50 short steps)."""
        suffix = "-" + subrun_name(nproc)
        return dataclasses.replace(  # a script's folder explicit: the sweep's caller's
            self.cfg.with_script_paths(), nproc=nproc, device=self.device,
            gpus=self.gpus[:nproc] if self.gpus is not None else None, max_steps=self.steps,
            epochs=None, run_dir=str(group_dir / subrun_name(nproc)), dry_run=False,
            name=self.cfg.default_name()[:64 - len(suffix)] + suffix,
            log_every=self.cfg.log_every or SWEEP_LOG_EVERY)


def plan_sweep(cfg: RunConfig, counts: list[int] | None = None, steps: int = DEFAULT_STEPS, *,
               gpu_count: int | None = None, cpu_count: int | None = None,
               inventory: GpuInventory | None = None) -> SweepPlan:
    """Check a sweep against this machine before anything is written or started.

    Args:
        cfg: the base config (every launch flag).
        counts: process counts; default 1..nproc when the config sets nproc, else 1..(chosen
            GPUs) on CUDA, 1..min(CPU cores, 8) on CPU.
        steps: optimizer steps per count.
        gpu_count: plan for this many usable GPUs, indices 0..n-1 (default: ask NVML and
            the installed torch, :func:`~ddp_engine.common.inventory.gpu_inventory`).
        cpu_count: usable CPU cores (default: this process's affinity).
        inventory: the GPUs NVML lists and whether torch can use them (instead of
            ``gpu_count``; the app passes its device picker's).

    Raises:
        ConfigError: naming the flag, the value and what is allowed.
    """
    if inventory is None:
        inventory = (gpu_inventory_within(NVML_TIMEOUT_S) if gpu_count is None
                     else GpuInventory.counted(gpu_count))
    usable = [g.index for g in inventory.usable]
    cpus = gpus.cpu_count() if cpu_count is None else cpu_count
    if steps < 1:
        raise ConfigError(f"steps must be >= 1, got {steps}")
    if cfg.resume is not None:
        raise ConfigError(f"resume: a sweep trains every count from scratch; drop --resume "
                          f"{cfg.resume!r}")
    check_devices(dataclasses.replace(cfg, nproc=None), inventory, cpus)  # device, gpus
    device = resolved_device(cfg, len(usable))
    chosen: list[int] | None = None
    if device == "cuda":
        chosen = cfg.gpus if cfg.gpus is not None else usable
        limit = len(chosen)
        what = f"the {limit} GPUs chosen"
    else:
        limit = cpus
        what = f"the {cpus} CPU cores of this machine"
    flag = "counts"
    if counts is None:
        if cfg.nproc is not None:
            flag = "nproc"  # the largest count
        top = cfg.nproc or (limit if device == "cuda" else min(cpus, MAX_DEFAULT_CPU_COUNT))
        counts = list(range(1, top + 1))
    for n in counts:
        if n < 1:
            raise ConfigError(f"counts: {n} is not allowed; each count must be >= 1")
    if max(counts) > limit:
        raise ConfigError(f"{flag}: {max(counts)} is more than {what}; allowed: 1..{limit}")
    plan = SweepPlan(cfg, sorted(set(counts)), steps, device, chosen)
    run_dir = Path(cfg.run_dir) if cfg.run_dir else None
    if run_dir is not None and ((run_dir / GROUP_FILE).exists() or any(
            (run_dir / subrun_name(n)).exists() for n in plan.counts)):
        raise ConfigError(f"run_dir: {cfg.run_dir!r} already holds a sweep; choose a new folder")
    # The largest count is the strictest check of devices, plugins and paths.
    widest = plan.subrun_config(plan.counts[-1], run_dir or Path(cfg.runs_dir))
    check_environment(dataclasses.replace(widest, run_dir=cfg.run_dir), inventory=inventory,
                      cpu_count=cpus)
    return plan


# ----------------------------------------------------------------------------------- reading
def is_group(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a run group folder (it holds group.json)."""
    return (Path(path) / GROUP_FILE).is_file()


def read_group(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """group.json of a run group folder, or None when missing, unreadable or not a sweep."""
    data = read_json(Path(path) / GROUP_FILE)
    if isinstance(data, dict) and data.get("kind") == GROUP_KIND:
        return data
    return None
