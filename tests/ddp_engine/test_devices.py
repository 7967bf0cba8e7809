"""The NVML side of devices.py: what it says where there is no GPU, and on a GPU."""

from __future__ import annotations

import os

from ddp_engine.devices import gpu_count, gpu_leftovers, gpu_processes
from tests.conftest import cuda


def test_without_nvml_nothing_is_listed_and_nothing_is_claimed_left() -> None:
    if gpu_count():
        procs = gpu_processes()
        assert procs is not None and all(p.pid > 0 for p in procs)
    else:  # "cannot check" must not read as "nothing left": None, not []
        assert gpu_processes() is None
    assert gpu_leftovers([os.getpid()], timeout_s=0) == []  # this process has no CUDA context


@cuda
def test_a_process_with_a_cuda_context_is_listed_until_it_exits() -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import torch, sys; "
                              "torch.zeros(1 << 20, device='cuda'); print('up', flush=True); "
                              "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        held = gpu_leftovers([child.pid], timeout_s=0)
        assert [p.pid for p in held] == [child.pid], (
            f"NVML lists {gpu_processes()}, not pid {child.pid}: another pid namespace?")
        assert held[0].used_bytes is None or held[0].used_bytes > 0
    finally:
        child.kill()
        child.wait()
    assert gpu_leftovers([child.pid], timeout_s=10) == []
