"""Resuming costs no copy of the checkpoint: the launcher checks a checkpoint without reading its
tensors, and a rank loads it memory-mapped, straight into its model and optimizer.

Each measurement runs in a fresh Python (the test process's own memory does not matter) on a
~400 MB checkpoint: a model of 12 2048x2048 layers and SGD's momentum buffers of the same size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, engine_env

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(),
                                reason="measures memory in /proc (Linux)")

CHILD = r'''
import gc, json, re, sys, threading
import torch
from ddp_engine.rank import checkpoint

def status_kb(field):
    return int(re.search(field + r":\s+(\d+) kB", open("/proc/self/status").read()).group(1))

def reset_peak():
    """VmHWM (peak RSS) from here on, where the kernel allows resetting it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass

def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(12)])
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

def weights_sum(model):
    return sum(float(p.double().sum()) for p in model.parameters())

mode, path = sys.argv[1], sys.argv[2]
if mode == "save":
    model, opt = build()
    model(torch.randn(4, 2048)).square().mean().backward()
    opt.step()  # momentum buffers: optimizer state as large as the model
    checkpoint.save_atomic({
        "format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
        "model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": None,
        "step": 7, "epoch": 0, "step_in_epoch": 7, "world_size": 1,
        "rng": [checkpoint.capture_rng()], "config": {}}, path)
    print(json.dumps({"weights_sum": weights_sum(model)}))
elif mode == "launcher":
    from ddp_engine.common.config import ConfigError, RunConfig
    from ddp_engine.launch.plan import plan_launch
    reset_peak()
    before = status_kb("VmHWM")
    try:  # max_steps 7 at step 7: refused once the step is read, before anything is made
        plan_launch(RunConfig(resume=path, max_steps=7, device="cpu"), create_run_dir=False)
        error = ""
    except ConfigError as e:
        error = str(e)
    print(json.dumps({"error": error, "peak_growth_kb": status_kb("VmHWM") - before}))
else:
    model, opt = build()
    gc.collect()
    before = status_kb("RssAnon")  # memory of the process's own; the mapped file is page cache
    samples = [before]
    model.register_load_state_dict_post_hook(lambda *_: samples.append(status_kb("RssAnon")))
    opt.register_load_state_dict_post_hook(lambda *_: samples.append(status_kb("RssAnon")))
    done = threading.Event()
    def sample():
        while not done.wait(0.002):
            samples.append(status_kb("RssAnon"))
    sampler = threading.Thread(target=sample)
    sampler.start()
    rest = checkpoint.load_into(path, model, opt)
    gc.collect()
    done.set()
    sampler.join()
    after = status_kb("RssAnon")
    state_bytes = sum(t.nbytes for s in opt.state.values() for t in s.values()
                      if isinstance(t, torch.Tensor))
    loaded_sum = weights_sum(model)
    model(torch.randn(4, 2048)).square().mean().backward()
    opt.step()  # the optimizer state is its own, writable memory
    print(json.dumps({
        "step": rest["step"], "weights_sum": loaded_sum,
        "peak_growth_kb": max(samples + [after]) - before, "final_growth_kb": after - before,
        "optimizer_state_kb": state_bytes // 1024,
        "still_mapped": path in open("/proc/self/maps").read()}))
'''


def _child(mode: str, path: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], capture_output=True,
                          text=True, timeout=120, env=engine_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def big_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict]]:
    path = tmp_path_factory.mktemp("big") / "last.pt"
    saved = _child("save", path)
    yield path, saved
    path.unlink(missing_ok=True)  # ~400 MB: not left for pytest's tmp retention


def test_the_launcher_checks_a_resume_without_reading_the_tensors(big_checkpoint) -> None:
    path, _ = big_checkpoint
    size_kb = path.stat().st_size // 1024
    assert size_kb > 350_000
    got = _child("launcher", path)
    assert got["error"].startswith("max_steps: the checkpoint is at step 7 and max_steps is 7")
    # Reading the file whole (as before) grows the peak by the file's size.
    assert got["peak_growth_kb"] < 0.1 * size_kb, (got, size_kb)


def test_a_rank_resumes_without_a_private_copy_of_the_checkpoint(big_checkpoint) -> None:
    path, saved = big_checkpoint
    size_kb = path.stat().st_size // 1024
    got = _child("rank", path)
    assert got["step"] == 7 and got["weights_sum"] == saved["weights_sum"]
    # The optimizer's momentum buffers are the one thing a CPU rank must hold in memory of its
    # own (half the file here); reading the file whole held all of it, model included, at once.
    state_kb = got["optimizer_state_kb"]
    assert 0.4 * size_kb < state_kb < 0.6 * size_kb
    assert got["peak_growth_kb"] < state_kb + 0.1 * size_kb, (got, size_kb)
    assert got["final_growth_kb"] < state_kb + 0.1 * size_kb, (got, size_kb)
    assert not got["still_mapped"]  # nothing the rank kept is a view of the file
