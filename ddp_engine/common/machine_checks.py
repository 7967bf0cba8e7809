"""Checks of a config against this machine: devices, files, plugins, ports (still no torch)."""

from __future__ import annotations

import ast
import importlib.util
import os
import zipfile
from pathlib import Path

from ddp_engine.common.config import RunConfig
from ddp_engine.common.config_values import (
    BUILTIN_DATASETS,
    BUILTIN_LOSSES,
    BUILTIN_MODELS,
    DIGITS_SAMPLES,
    DIGITS_VAL_FRACTION,
    MODULE_RE,
    PATH_DATASETS,
    SYNTHETIC_SAMPLES,
    ConfigError,
    batch_exceeds_data,
    split_dataset,
    split_plugin,
)
from ddp_engine.common.inventory import GpuInventory
from ddp_engine.common.rendezvous import check_monitor_address
from ddp_engine.common.run_dir import read_status


def check_environment(cfg: RunConfig, *, cpu_count: int, gpu_count: int | None = None,
                      inventory: GpuInventory | None = None) -> None:
    """Checks that need the file system or the devices (still no torch).

    Args:
        cfg: the config to check.
        cpu_count: CPU cores usable by this process.
        gpu_count: planning for this many usable GPUs, NVML indices 0..n-1 (when
            ``inventory`` is not given).
        inventory: the GPUs NVML lists and whether torch can use them (``gpu_inventory()``).

    Raises:
        ConfigError: naming the field, the value and what is allowed.
    """
    gpus = inventory if inventory is not None else GpuInventory.counted(gpu_count or 0)
    usable = [g.index for g in gpus.usable]
    device = resolved_device(cfg, len(usable))
    if cfg.script is not None:
        check_script(cfg.script, cfg.script_cwd)
    check_devices(cfg, gpus, cpu_count)
    if cfg.precision == "fp16" and device != "cuda":
        raise ConfigError("precision: fp16 needs CUDA and no GPU is in use; use fp32 or bf16")
    for field_name in ("model", "dataset", "loss"):
        spec = getattr(cfg, field_name)
        kind, path = split_dataset(spec) if field_name == "dataset" else ("", "")
        if kind in PATH_DATASETS:
            if not Path(path).exists():
                raise ConfigError(f"dataset: path {path!r} of {spec!r} does not exist")
            if kind == "text" and not Path(path).is_file():
                raise ConfigError(f"dataset: {spec!r} must name a text file, {path!r} is not "
                                  "a file")
            if kind == "imagefolder" and not Path(path).is_dir():
                raise ConfigError(f"dataset: {spec!r} must name a folder, {path!r} is not one")
        elif spec not in BUILTIN_MODELS + BUILTIN_DATASETS + BUILTIN_LOSSES:
            check_plugin(field_name, spec)
    samples = builtin_train_samples(cfg)
    if samples is not None:
        nproc = cfg.nproc or (len(cfg.gpus) if cfg.gpus else
                              len(usable) if device == "cuda" else min(2, cpu_count))
        why = batch_exceeds_data(cfg.batch_size, cfg.grad_accum, max(1, nproc), samples)
        if why:
            raise ConfigError(why)
    if cfg.resume is not None:
        check_checkpoint_file(cfg.resume)
        check_steps_left(cfg, checkpoint_step(cfg.resume))
    if cfg.run_dir is not None and Path(cfg.run_dir).exists() and not Path(cfg.run_dir).is_dir():
        raise ConfigError(f"run_dir: {cfg.run_dir!r} is a file, not a folder")
    if Path(cfg.runs_dir).exists() and not Path(cfg.runs_dir).is_dir():
        raise ConfigError(f"runs_dir: {cfg.runs_dir!r} is a file, not a folder")
    check_monitor_address(cfg)  # rank 0 serves, on node 0


def check_script(script: str, cwd: str | None = None) -> None:
    """A script run's file is a Python file that parses (it is not run), and its working
    folder, when given, exists.

    Raises:
        ConfigError: naming script (or script_cwd), the value and what is wrong.
    """
    path = Path(script)
    if not path.exists():
        raise ConfigError(f"script: {script!r} does not exist; give the path of your training "
                          "script (a .py file)")
    if path.is_dir():
        raise ConfigError(f"script: {script!r} is a folder; give the path of a .py file in it")
    try:
        source = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"script: cannot read {script!r}: {e.strerror or e}") from None
    try:
        ast.parse(source, filename=str(path))
    except (SyntaxError, ValueError) as e:
        where = f" at line {e.lineno}" if isinstance(e, SyntaxError) and e.lineno else ""
        msg = e.msg if isinstance(e, SyntaxError) else str(e)
        raise ConfigError(f"script: {script!r} is not a Python file Python can parse{where}: "
                          f"{msg}") from None
    if cwd is not None and not Path(cwd).is_dir():
        raise ConfigError(f"script_cwd: {cwd!r} is not a folder; give the folder the script "
                          "should run in (relative paths in its arguments start there), or "
                          "leave it unset for the folder you launch from")


def check_devices(cfg: RunConfig, gpus: GpuInventory, cpu_count: int) -> None:
    """``device``, ``gpus`` and ``nproc`` against the GPUs torch can use and the CPU cores.

    Raises:
        ConfigError: naming the field, the value and what is allowed.
    """
    usable = [g.index for g in gpus.usable]
    device = resolved_device(cfg, len(usable))
    if cfg.device == "cuda" and not usable:
        why = (f": {gpus.cpu_note()}; or" if gpus.cpu_note() else
               " but no GPU is visible on this machine;")
        raise ConfigError(f"device: 'cuda' asked for{why} use --device cpu")
    for g in cfg.gpus or []:
        listed = [x.index for x in gpus.gpus]
        if g not in listed:
            allowed = (", ".join(map(str, usable)) if usable else "none: no GPU is visible"
                       if not listed else f"none: {gpus.cpu_note()}")
            raise ConfigError(f"gpus: GPU {g} does not exist; allowed: {allowed}")
        why_not = gpus.why_not(g)
        if why_not:
            raise ConfigError(f"gpus: GPU {g} cannot be used: {why_not}")
    if cfg.nproc is not None:
        limit = len(usable) if device == "cuda" else cpu_count
        what = "GPUs" if device == "cuda" else "CPU cores"
        if cfg.nproc > limit:
            raise ConfigError(f"nproc must be between 1 and the number of {what} ({limit}), "
                              f"got {cfg.nproc}")


def resolved_device(cfg: RunConfig, gpu_count: int) -> str:
    """``"cuda"`` or ``"cpu"``: what ``device`` means on a machine with ``gpu_count`` GPUs
    that the installed torch can use."""
    if cfg.device == "cpu":
        return "cpu"
    if cfg.device == "cuda" or cfg.gpus is not None:
        return "cuda"
    return "cuda" if gpu_count > 0 else "cpu"


def check_plugin(field_name: str, spec: str) -> None:
    """Check that a plugin's file (or module) exists and defines the function, without running
    it: the source is parsed, not imported."""
    target, func = split_plugin(spec)
    if target.endswith(".py") or "/" in target or os.sep in target:
        path = Path(target)
        if not path.is_file():
            raise ConfigError(f"{field_name}: plugin file {target!r} of {spec!r} does not exist")
    else:
        if not MODULE_RE.match(target):
            raise ConfigError(f"{field_name}: {target!r} of {spec!r} is neither a .py file nor a "
                              "module name")
        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise ConfigError(f"{field_name}: module {target!r} of {spec!r} cannot be found")
        if not found.origin or not found.origin.endswith(".py"):
            return  # compiled or namespace module: checked when the worker imports it
        path = Path(found.origin)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        raise ConfigError(f"{field_name}: plugin file {str(path)!r} has a syntax error at line "
                          f"{e.lineno}: {e.msg}") from None
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    if func not in names:
        defined = ", ".join(sorted(n for n in names if not n.startswith("_"))) or "nothing"
        raise ConfigError(f"{field_name}: {str(path)!r} has no function {func!r} (it defines: "
                          f"{defined})")


def check_checkpoint_file(path: str) -> None:
    """A cheap stdlib check that ``path`` looks like a torch checkpoint (a zip with data.pkl).

    The engine checks the contents with torch before the run starts.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"resume: checkpoint {path!r} does not exist")
    try:
        with zipfile.ZipFile(p) as z:
            ok = any(n.endswith("/data.pkl") for n in z.namelist())
    except (zipfile.BadZipFile, OSError):
        ok = False
    if not ok:
        raise ConfigError(f"resume: {path!r} is not a Rankscope checkpoint (not a torch.save file)")


def checkpoint_step(path: str) -> int | None:
    """The step of a run folder's ``checkpoints/last.pt``, as that run's status.json says
    (``checkpoint_step``, written by the launcher at each save; no torch); None for any other
    file, or when the folder does not say (the launcher then reads the file itself)."""
    p = Path(path)
    if p.name != "last.pt" or p.parent.name != "checkpoints":
        return None
    status = read_status(p.parent.parent) or {}
    named = status.get("checkpoint")
    if not isinstance(named, str) or Path(named).resolve() != p.resolve():
        return None  # status.json speaks of another file
    step = status.get("checkpoint_step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def check_steps_left(cfg: RunConfig, step: int | None) -> None:
    """A resume from ``step`` must leave steps to train: ``max_steps`` above it.

    Raises:
        ConfigError: naming max_steps, the checkpoint's step and what to do.
    """
    if step is not None and cfg.max_steps is not None and cfg.max_steps <= step:
        raise ConfigError(f"max_steps: the checkpoint is at step {step} and max_steps is "
                          f"{cfg.max_steps}, so there is nothing left to train; raise max_steps "
                          f"above {step}")


def builtin_train_samples(cfg: RunConfig) -> int | None:
    """How many training samples a built-in dataset has (synthetic, digits), known without
    building it; None for the others (their size is known once a rank loads them)."""
    kind, _ = split_dataset(cfg.dataset)
    args = cfg.dataset_args
    try:
        if kind == "synthetic":
            return int(args.get("num_samples", SYNTHETIC_SAMPLES))
        if kind == "digits":
            fraction = float(args.get("val_fraction", DIGITS_VAL_FRACTION))
            return DIGITS_SAMPLES - int(DIGITS_SAMPLES * fraction)
    except (TypeError, ValueError):
        return None  # a bad argument: the rank names it
    return None
