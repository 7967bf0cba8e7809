"""The training step inside a real (one-rank, gloo) process group: DDP, no_sync, accumulation."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from ddp_engine.config import RunConfig
from ddp_engine.distributed import StopFlag, init_distributed, teardown
from ddp_engine.run_dir import iter_metrics
from ddp_engine.telemetry import Telemetry
from ddp_engine.trainer import Trainer


@pytest.fixture
def ctx(monkeypatch: pytest.MonkeyPatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    context = init_distributed("cpu", 60)
    yield context
    teardown()


def _trainer(ctx, tmp_path: Path, **overrides) -> Trainer:
    base = {"optimizer": "sgd", "momentum": 0.0, "lr": 0.1, "max_steps": 3, "log_every": 1,
            "dataset_args": {"num_samples": 256}}
    base.update(overrides)
    folder = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / "checkpoints").mkdir()
    stop = StopFlag(5, ctx.side_group)
    telemetry = Telemetry(folder, welcome_extra={}, on_stop=lambda: stop.request("test"),
                          port=None)  # metrics.jsonl only
    return Trainer(RunConfig(**base), ctx, folder, stop, telemetry)


def _one_step(trainer: Trainer) -> None:
    trainer.sampler.set_epoch(0)
    trainer._train_step(iter(trainer.loader))


def test_gradient_accumulation_equals_the_larger_batch(ctx, tmp_path: Path) -> None:
    a = _trainer(ctx, tmp_path, batch_size=8, grad_accum=2)
    b = _trainer(ctx, tmp_path, batch_size=16, grad_accum=1)
    _one_step(a)
    _one_step(b)
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_no_sync_skips_the_allreduce_on_non_final_micro_steps(ctx, tmp_path: Path) -> None:
    """The comm hook (the engine's own timing hook) sees the buckets once per optimizer step,
    however many micro-steps are accumulated."""
    buckets = {}
    for accum in (1, 4):
        trainer = _trainer(ctx, tmp_path, batch_size=4, grad_accum=accum)
        assert trainer.timer is not None
        _one_step(trainer)
        buckets[accum] = trainer.timer.collect()["sync_buckets"]
    assert buckets[1] >= 1 and buckets[4] == buckets[1]


def test_a_replacement_hook_counts_the_same(ctx, tmp_path: Path) -> None:
    """Cross-check with a plain counting hook wrapping the stock all-reduce (telemetry off)."""
    calls = {}
    for accum in (1, 4):
        trainer = _trainer(ctx, tmp_path, batch_size=4, grad_accum=accum, telemetry=False)
        count = [0]

        def counting_hook(state, bucket, count=count):
            count[0] += 1
            return allreduce_hook(state, bucket)

        trainer.model.register_comm_hook(None, counting_hook)
        _one_step(trainer)
        calls[accum] = count[0]
    assert calls[1] >= 1 and calls[4] == calls[1]


def test_bf16_autocast_and_grad_clipping_train_on_cpu(ctx, tmp_path: Path) -> None:
    trainer = _trainer(ctx, tmp_path, precision="bf16", grad_clip=0.5, max_steps=20)
    assert trainer.run() == "completed"
    ms = [m for m in iter_metrics(trainer.run_dir) if m["type"] == "metrics"]
    assert len(ms) == 20 and all(m["ranks"][0]["loss"] is not None for m in ms)


def test_a_stop_request_ends_the_loop_at_a_check_step(ctx, tmp_path: Path) -> None:
    trainer = _trainer(ctx, tmp_path, max_steps=1000, stop_check_every=5)
    trainer.stop.request("test")
    assert trainer.run() == "stopped"
    assert trainer.pos.step == 5
    kinds = [m.get("kind") for m in iter_metrics(trainer.run_dir) if m["type"] == "event"]
    assert kinds[-3:] == ["stopping", "checkpoint_saved", "stopped"]


def test_max_steps_loops_over_epochs_and_epochs_limit(ctx, tmp_path: Path) -> None:
    # 256 samples / batch 32 = 8 steps an epoch.
    t = _trainer(ctx, tmp_path, max_steps=20)
    assert t.run() == "completed" and (t.pos.step, t.pos.epoch) == (20, 2)
    t = _trainer(ctx, tmp_path, max_steps=None, epochs=2)
    assert t.total_steps == 16 and t.run() == "completed" and t.pos.step == 16
