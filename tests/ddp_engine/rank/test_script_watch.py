"""The script watch in this process (one rank): what it takes for the loss, the batch and the
steps, and that it leaves torch as it found it. Runs of several ranks: test_script_run.py."""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import rankscope
from ddp_engine.common.config import RunConfig
from ddp_engine.common.heartbeat import Heartbeat
from ddp_engine.common.run_dir import iter_metrics
from ddp_engine.rank.distributed import DistInfo, StopFlag
from ddp_engine.rank.logged import MAX_KEYS, LoggedScalars
from ddp_engine.rank.script_patches import first_batch_size as _first_batch_size
from ddp_engine.rank.script_watch import ScriptWatch
from ddp_engine.rank.telemetry import Telemetry


@pytest.fixture
def watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          request: pytest.FixtureRequest) -> Iterator[ScriptWatch]:
    """A watch in this process; ``--sync-timing`` from an indirect parameter (default
    reducer)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    cfg = RunConfig(script="train.py", log_every=5, run_dir=str(tmp_path),
                    sync_timing=getattr(request, "param", "reducer"))
    stop = StopFlag.from_config(cfg)
    telemetry = Telemetry(tmp_path, welcome_extra={}, on_stop=stop.request, port=None)
    w = ScriptWatch(cfg, DistInfo(0, 0, 1, 1), tmp_path, stop, telemetry, None)
    w.install()
    try:
        yield w
    finally:
        w.uninstall()
        telemetry.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _metrics(w: ScriptWatch) -> list[dict]:
    assert w.reporter.telemetry is not None and w.reporter.telemetry.flush()
    return [m for m in iter_metrics(w.run_dir) if m["type"] == "metrics"]


def test_a_grad_scalers_scaled_loss_is_reported_unscaled(watch: ScriptWatch) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(5):
        x = torch.randn(8, 4, generator=g)
        loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
        losses.append(loss.item())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert watch.step == 5  # optimizer steps, through the scaler
    (m,) = _metrics(watch)
    assert m["step"] == 5
    assert m["ranks"][0]["loss"] == pytest.approx(sum(losses) / 5, rel=1e-5)  # not x1024


def test_backward_of_a_non_scalar_or_a_list_is_no_loss(watch: ScriptWatch) -> None:
    w = torch.ones(3, requires_grad=True)
    (w * 2).backward(torch.ones(3))
    torch.autograd.backward([(w * 3).sum()])
    assert not watch._saw_loss and watch._loss is None
    (w * 4).sum().backward()
    assert watch._saw_loss and watch._loss is not None and watch._loss.item() == 12.0


def test_the_batch_is_counted_from_training_forwards_only(watch: ScriptWatch) -> None:
    dist.init_process_group("gloo")  # the script's call, through the watch
    model = DDP(torch.nn.Linear(4, 2))
    assert watch.ddp is model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(16, 4)).sum().backward()
        opt.step()
        with torch.no_grad():
            model(torch.randn(1000, 4))  # an evaluation pass
    assert watch._interval.samples == 48 and watch.step == 3
    # Sync is timed by DDP's own reducer timers: no comm hook of ours.
    assert id(model) not in watch._hooked and watch.reducer_timing is not None
    assert watch.reducer_timing.watching
    model(torch.randn(7, 4)).sum().backward()
    opt.step()
    opt.step()  # no backward between: a step without a loss
    (m,) = _metrics(watch)  # the report at step 5
    entry = m["ranks"][0]
    assert entry["sync_time_s"] is not None and entry["sync_time_s"] > 0
    assert entry["loss"] is not None  # the mean over the steps that had one


@pytest.mark.parametrize("watch", ["hook"], indirect=True)
def test_with_sync_timing_hook_the_timing_hook_goes_on_at_the_first_backward(
        watch: ScriptWatch) -> None:
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert id(model) not in watch._hooked
    for _ in range(5):
        model(torch.randn(16, 4)).sum().backward()
        opt.step()
    assert id(model) in watch._hooked and watch.reducer_timing is None
    (m,) = _metrics(watch)
    assert m["ranks"][0]["sync_time_s"] > 0 and m["ranks"][0]["sync_buckets"] == 1


def test_the_loss_is_read_in_the_report_phase(watch: ScriptWatch, tmp_path: Path) -> None:
    """The watch's loss read on a reporting step (``.item()``, where a GPU rank's host waits
    for its device and the all-reduce queued on it) happens in the heartbeat's ``report``."""
    (tmp_path / "ranks").mkdir(exist_ok=True)
    watch.heartbeat = hb = Heartbeat(tmp_path, 0)
    reads: list[tuple[str, int]] = []

    class ReadProbe(torch.Tensor):
        """A loss that notes the heartbeat's phase whenever the host reads it."""

        def item(self):  # type: ignore[override]
            reads.append((hb.phase, hb.step))
            return super().item()

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(6):
        # torch.autograd.backward, not loss.backward(): Tensor.backward hands the watch a plain
        # tensor (it runs with the subclass's torch functions off), which would read unseen.
        torch.autograd.backward(model(torch.randn(8, 4)).pow(2).mean().as_subclass(ReadProbe))
        opt.step()
    assert reads == [("report", 5)]  # log_every=5
    assert hb.synced_step == 5 and hb.phase == "data"


def test_first_batch_size_looks_into_containers() -> None:
    t = torch.zeros(5, 3)
    assert _first_batch_size((t,), {}) == 5
    assert _first_batch_size(([{"ids": torch.zeros(9, 2)}],), {}) == 9
    assert _first_batch_size((), {"x": t}) == 5
    assert _first_batch_size((torch.tensor(1.0), "text"), {}) is None
    assert _first_batch_size((), {}) is None


def test_uninstall_gives_torch_back_its_own_functions(tmp_path: Path) -> None:
    before = (torch.autograd.backward, DDP.__init__, DDP.register_comm_hook,
              dist.init_process_group, dist.destroy_process_group,
              torch.amp.GradScaler.scale)
    cfg = RunConfig(script="train.py")
    w = ScriptWatch(cfg, DistInfo(0, 0, 1, 1), tmp_path, StopFlag(10), None, None)
    w.install()
    assert torch.autograd.backward is not before[0]
    w.uninstall()
    after = (torch.autograd.backward, DDP.__init__, DDP.register_comm_hook,
             dist.init_process_group, dist.destroy_process_group,
             torch.amp.GradScaler.scale)
    assert after == before
    p = torch.nn.Parameter(torch.ones(1))
    torch.optim.SGD([p], lr=1.0).step()  # the global step hooks are gone too
    assert w.step == 0


def test_the_api_does_nothing_outside_a_run() -> None:
    assert rankscope._session is None and not rankscope.active()
    rankscope.log(acc=1.0)
    assert rankscope.should_stop() is False

    def save() -> dict:
        return {}

    assert rankscope.on_stop(save) is save


@pytest.mark.parametrize(("scalars", "message"), [
    ({"1st": 1.0}, r"rankscope.log: key '1st' is not allowed"),
    ({"acc": "high"}, r"rankscope.log: acc must be a number, got str 'high'"),
    ({"acc": torch.ones(2)}, r"rankscope.log: acc must be one number, got a tensor of shape "
                             r"\(2,\)"),
])
def test_log_refuses_what_is_not_a_named_number(scalars: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoggedScalars().log(scalars)


def test_log_keeps_the_last_value_and_reads_tensors_at_the_report() -> None:
    logged = LoggedScalars()
    logged.log({"a": 1.0, "b": torch.tensor(2.0)})
    logged.log({"a": 3})
    logged.log_shared("lr", 0.5)
    assert logged.take(10) == 2  # keys of its own; the shared lr is not gathered
    assert logged.gather(10, [2.0], None) == [{"lr": 0.5, "a": 3.0, "b": 2.0}]
    with pytest.raises(ValueError, match=f"at most {MAX_KEYS} keys per report"):
        logged.log({f"k{i}": 0.0 for i in range(MAX_KEYS + 1)})


def _events(w: ScriptWatch, kind: str) -> list[dict]:
    assert w.reporter.telemetry is not None and w.reporter.telemetry.flush()
    return [m for m in iter_metrics(w.run_dir) if m.get("kind") == kind]


def test_ddp_built_with_module_by_keyword_is_watched(watch: ScriptWatch) -> None:
    """Lightning and Fabric call DistributedDataParallel(module=model, ...)."""
    dist.init_process_group("gloo")
    model = DDP(module=torch.nn.Linear(4, 2), find_unused_parameters=False)
    assert watch.ddp is model


def test_a_failing_part_of_the_watch_turns_itself_off_and_training_goes_on(
        watch: ScriptWatch, monkeypatch: pytest.MonkeyPatch) -> None:
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def broken(*_a: object) -> None:
        raise KeyError("a batch of a shape nobody expected")

    monkeypatch.setattr(watch, "_before_forward", broken)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(5):
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert watch.step == 5 and list(watch.guard.off) == ["forward"]
    (warning,) = _events(watch, "warning")
    assert warning["part"] == "forward" and "KeyError" in warning["message"]
    assert "samples/s" in warning["message"] and "the script goes on" in warning["message"]
    assert "watch_forward" in watch.unavailable()
    (m,) = _metrics(watch)
    assert m["ranks"][0]["loss"] is not None  # the other parts still report


def test_a_step_the_grad_scaler_skips_is_counted_skipped_and_its_loss_dropped(
        watch: ScriptWatch) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    losses = []
    for i in range(5):
        loss = model(torch.ones(8, 4)).pow(2).mean()
        if i == 1:
            loss = loss * math.inf  # this step's gradients are inf: the scaler skips it
        else:
            losses.append(loss.item())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert watch.step == 5  # the skipped iteration counts as a step
    (m,) = _metrics(watch)
    entry = m["ranks"][0]
    assert entry["skipped_steps"] == 1
    assert entry["loss"] == pytest.approx(sum(losses) / 4, rel=1e-5)  # inf not carried over
    assert not _events(watch, "warning")  # a skip is what a scaler is for: no divergence


def test_a_closure_step_counts_its_loss_once(watch: ScriptWatch) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    firsts = []
    for _ in range(5):
        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        firsts.append(float(opt.step(closure).detach()))  # LBFGS: its first evaluation
    assert watch.step == 5
    (m,) = _metrics(watch)
    assert m["ranks"][0]["loss"] == pytest.approx(sum(firsts) / 5, rel=1e-5)


def test_a_new_stages_optimizer_takes_over_the_step_count(watch: ScriptWatch) -> None:
    model = torch.nn.Linear(4, 1)
    first = torch.optim.SGD(model.parameters(), lr=0.01)
    second = torch.optim.Adam(model.parameters(), lr=0.01)
    for opt, n in ((first, 3), (second, 4)):
        for _ in range(n):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
    assert watch.step == 6  # the second stage's first step, before it took over, is not
    assert watch.optimizers[0] is second
    del first
    assert len(watch.optimizers) == 1  # a stage the script let go of is not kept alive

