"""Which GPUs a run can train on: NVML's GPUs, less those in MIG mode, and none at all when the
installed PyTorch cannot use CUDA (the CPU wheel, or a CUDA build newer than the driver).

Torch-free: what torch was built for is read from its ``version.py`` without importing it, so
the app's device box and the launcher's checks cost milliseconds and never initialise CUDA.
A torch that passes this check can still fail at ``torch.cuda.is_available()`` (a broken
install): the ranks then say so (``ddp_engine.rank.distributed.choose_backend``).
"""

from __future__ import annotations

import ast
import importlib.util
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ddp_engine.common import gpus as nvml_gpus

FIX_CPU_BUILD = "make clean install TORCH=cuda"
NVML_TIMEOUT_S = 20.0
"""How long a launch, a sweep or doctor waits for NVML's inventory before it says NVML did not
answer (a wedged GPU or driver) instead of hanging."""


@dataclass(frozen=True)
class TorchBuild:
    """The installed PyTorch, as its version.py describes it."""

    version: str | None
    """``2.13.0+cpu``; None when torch is not installed in this Python."""
    cuda: str | None
    """The CUDA it was built for (``12.4``); None for a CPU (or ROCm) build."""


def installed_torch(version_file: Path | None = None) -> TorchBuild:
    """The PyTorch this Python would import (or the one of ``version_file``), not imported."""
    if version_file is None:
        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            spec = None
        if spec is None or spec.origin is None:
            return TorchBuild(None, None)
        version_file = Path(spec.origin).parent / "version.py"
    try:
        tree = ast.parse(version_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return TorchBuild(None, None)
    values: dict[str, object] = {}
    for node in tree.body:
        target = (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1
                  else node.target if isinstance(node, ast.AnnAssign) else None)
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    version, cuda = values.get("__version__"), values.get("cuda")
    return TorchBuild(version if isinstance(version, str) else None,
                      cuda if isinstance(cuda, str) else None)


def cuda_problem(build: TorchBuild, driver: str | None,
                 driver_cuda: tuple[int, int] | None) -> str | None:
    """Why ``build`` cannot train on this machine's NVIDIA GPUs, with the fix; None if it can.

    ``driver_cuda`` is the newest CUDA the driver supports (NVML). A build for a newer CUDA
    *major* version cannot run; a newer minor one runs under CUDA's minor version
    compatibility, so it is not refused here.
    """
    if build.version is None:
        return "PyTorch is not installed in this Python; run: make install"
    if build.cuda is None:
        return (f"the installed torch {build.version} is a CPU-only build and cannot use them; "
                f"install the CUDA build: {FIX_CPU_BUILD}")
    try:
        major = int(build.cuda.split(".")[0])
    except ValueError:
        return None
    if driver_cuda is not None and major > driver_cuda[0]:
        newest = f"{driver_cuda[0]}.{driver_cuda[1]}"
        return (f"the installed torch {build.version} is built for CUDA {build.cuda}, but the "
                f"NVIDIA driver {driver or '(version unknown)'} supports CUDA up to {newest}; "
                f"update the driver, or install a torch built for CUDA {driver_cuda[0]}: "
                f"make clean install TORCH=\"torch --index-url "
                f"https://download.pytorch.org/whl/cu{driver_cuda[0]}{driver_cuda[1]}\"")
    return None


@dataclass(frozen=True)
class GpuInventory:
    """What NVML lists (MIG-mode GPUs included) and whether torch can use any of it."""

    gpus: list[nvml_gpus.GpuInfo] = field(default_factory=list)
    problem: str | None = None
    """Why no GPU can be used although NVML lists some (see :func:`cuda_problem`)."""

    @classmethod
    def counted(cls, n: int) -> GpuInventory:
        """``n`` usable GPUs with NVML indices 0..n-1: planning for a GPU count (the sweep's
        and the checks' callers that know only how many GPUs there are)."""
        return cls([nvml_gpus.GpuInfo(i, "GPU", f"GPU-{i}", "", None) for i in range(n)])

    @property
    def usable(self) -> list[nvml_gpus.GpuInfo]:
        """The GPUs a rank can be given: none when torch cannot use CUDA, never a MIG GPU."""
        return [] if self.problem else [g for g in self.gpus if not g.mig]

    def cpu_note(self) -> str | None:
        """Why ``device: auto`` trains on CPU although there may be GPUs (NVML lists some, or
        did not answer); None otherwise."""
        if self.usable:
            return None
        if self.problem:
            return (f"{len(self.gpus)} GPU(s) found, but {self.problem}" if self.gpus
                    else self.problem)
        return "every GPU is in MIG mode: " + mig_advice(self.gpus) if self.gpus else None

    def why_not(self, index: int) -> str | None:
        """Why GPU ``index`` (NVML) cannot be given to a rank; None when it can."""
        gpu = next((g for g in self.gpus if g.index == index), None)
        if gpu is None:
            return None
        if self.problem:
            return self.problem
        return mig_advice([gpu]) if gpu.mig else None


def mig_advice(mig: list[nvml_gpus.GpuInfo]) -> str:
    """What to say of GPUs in MIG mode."""
    names = ", ".join(g.label for g in mig if g.mig)
    first = next((g.index for g in mig if g.mig), 0)
    return (f"{names} in MIG mode, where CUDA sees only MIG instances and NCCL cannot "
            f"all-reduce between them; a DDP rank needs a whole GPU: disable MIG "
            f"(sudo nvidia-smi -i {first} -mig 0) or choose other GPUs")


def gpu_inventory(environ: Mapping[str, str] | None = None,
                  build: TorchBuild | None = None) -> GpuInventory:
    """NVML's GPUs visible to this process and whether the installed torch can use them."""
    listed = nvml_gpus.list_gpus(environ)
    if not listed:
        return GpuInventory()
    driver, driver_cuda = nvml_gpus.driver_versions()
    return GpuInventory(listed, cuda_problem(build or installed_torch(), driver, driver_cuda))


def gpu_inventory_within(timeout_s: float, environ: Mapping[str, str] | None = None,
                         build: TorchBuild | None = None) -> GpuInventory:
    """:func:`gpu_inventory`, waiting for NVML at most ``timeout_s``: a wedged GPU or driver
    can block an NVML call for good, and neither the window nor a launch may hang on it. Past
    the timeout: no GPU, and a problem that says why (the daemon thread asking is left to
    finish whenever NVML answers)."""
    box: list[GpuInventory] = []
    asker = threading.Thread(target=lambda: box.append(gpu_inventory(environ, build)),
                             name="gpu-inventory", daemon=True)
    asker.start()
    asker.join(timeout_s)
    if box:
        return box[0]
    return GpuInventory([], problem=f"NVML did not answer within {timeout_s:g} s (a wedged GPU "
                                    "or driver?); see whether nvidia-smi answers")
