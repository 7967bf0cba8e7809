"""The FLOPs of a training step, counted once before the loop: the count matches a count by
hand, the counting pass leaves no trace (no all-reduce, no gradient, RNG and BatchNorm
statistics as they were, the first step as without it), and a real 2-process run publishes
it for the dashboard's achieved FLOP/s."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from app.charts.breakdown import flops_text
from app.metric_store import MetricStore
from ddp_engine.common.config import RunConfig
from ddp_engine.common.run_dir import iter_metrics
from ddp_engine.rank.distributed import StopFlag
from ddp_engine.rank.flops import count_step_flops, flops_event_fields
from ddp_engine.rank.trainer import Trainer
from tests.conftest import run_engine

CPU = torch.device("cpu")


def mlp_step_flops(batch: int, widths: list[int]) -> int:
    """FLOPs of an MLP's linear layers (``widths``: input, hidden..., output) for one forward
    and backward of ``batch`` samples, by hand: 2*b*in*out for each layer's forward, as much
    for its weight gradient, and as much again for its input gradient, except the first
    layer's (the data needs no gradient). Biases and activations are not matmuls."""
    layers = [a * b for a, b in zip(widths, widths[1:], strict=False)]
    return 2 * batch * (2 * sum(layers) + sum(layers[1:]))


def _loader(model_in: int, n: int = 64, batch: int = 16) -> DataLoader:
    data = TensorDataset(torch.randn(n, model_in), torch.randint(0, 10, (n,)))
    return DataLoader(data, batch_size=batch)


def test_the_count_is_the_matmuls_of_forward_and_backward_times_accumulation() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    loss = nn.CrossEntropyLoss()
    one = count_step_flops(model, _loader(32), loss, CPU, None, 1)
    assert one == mlp_step_flops(16, [32, 128, 128, 10]) == 1_957_888
    assert count_step_flops(model, _loader(32), loss, CPU, None, 3) == 3 * one
    assert count_step_flops(model, _loader(32), loss, CPU, torch.bfloat16, 1) == one


def test_counting_leaves_no_trace_on_the_model_or_the_rng() -> None:
    """Dropout draws random numbers and BatchNorm updates its running statistics in a
    training forward: both are undone, and no gradient is left."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5),
                          nn.Linear(16, 10))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loader = _loader(8)
    rng = torch.get_rng_state()
    assert count_step_flops(model, loader, nn.CrossEntropyLoss(), CPU, None, 1)
    assert torch.equal(torch.get_rng_state(), rng)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in model.parameters())


def test_a_model_the_counter_cannot_run_gives_no_count_and_a_warning(caplog) -> None:
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.linear(x).sum().backward()  # a gradient, then a failure
            raise RuntimeError("no forward today")

    model = Broken()
    with caplog.at_level(logging.WARNING, "ddp_engine.rank.flops"):
        assert count_step_flops(model, _loader(8), nn.CrossEntropyLoss(), CPU, None, 1) is None
    assert "FLOPs of a step not counted: RuntimeError: no forward today" in caplog.text
    assert all(p.grad is None for p in model.parameters())


def test_the_event_names_the_precision_the_peak_is_looked_up_in_and_each_ranks_gpu() -> None:
    places: list[dict[str, object]] = [{"host": "a", "gpu": {"index": 7, "name": "NVIDIA H200"}},
                                       {"host": "a"}]
    assert flops_event_fields(10, "bf16", CPU, 32, 2, places) == {
        "flops_per_step": 10, "batch_size": 32, "grad_accum": 2, "precision": "bf16",
        "gpus": ["NVIDIA H200", None]}
    assert flops_event_fields(10, "fp32", CPU, 32, 1, places)["precision"] == "fp32"




def _trainer(ctx, folder: Path) -> Trainer:
    folder.mkdir()
    cfg = RunConfig(model="convnet", optimizer="sgd", lr=0.1, max_steps=1, batch_size=16,
                    dataset_args={"num_samples": 256})  # convnet: BatchNorm
    return Trainer(cfg, ctx, folder, StopFlag.from_config(cfg, ctx.side_group))


def test_counting_on_the_ddp_module_starts_no_allreduce_and_changes_no_step(ctx, tmp_path) -> None:
    counted, plain = _trainer(ctx, tmp_path / "a"), _trainer(ctx, tmp_path / "b")
    assert counted.timer is not None
    flops = count_step_flops(counted.model.module, counted.loader, counted.loss_fn, CPU, None, 1)
    assert flops and counted.timer._current.buckets == []  # the comm hook was never called
    for t in (counted, plain):
        t.sampler.set_epoch(0)
        t._train_step(iter(t.loader))
    for a, b in zip(counted.model.module.state_dict().values(),
                    plain.model.module.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert counted.timer.collect()["sync_buckets"] == plain.timer.collect()["sync_buckets"]


@pytest.mark.slow
def test_a_real_run_publishes_its_step_flops_and_the_dashboard_says_the_rate(tmp_path) -> None:
    """2 gloo ranks of the built-in MLP (32 -> 128 -> 128 -> 10, 32 samples a rank)."""
    run_dir = tmp_path / "run"
    done = run_engine("launch", "--nproc", "2", "--max-steps", "20", "--log-every", "5",
                      "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = list(iter_metrics(run_dir))
    kinds = [m.get("kind") for m in lines if m["type"] == "event"]
    assert kinds[:3] == ["run_start", "flops", "epoch_start"]
    event = next(m for m in lines if m.get("kind") == "flops")
    assert event["flops_per_step"] == mlp_step_flops(32, [32, 128, 128, 10]) == 3_915_776
    assert (event["precision"], event["gpus"], event["grad_accum"]) == ("fp32", [None, None], 1)
    store = MetricStore()
    store.load_run(run_dir)
    text = flops_text(store, event)
    assert text is not None and text.startswith("model FLOPs 3.92 MFLOP a step: ")
    assert text.endswith("; CPU: no peak")
    steps = [r["step_time_s"] for m in lines if m["type"] == "metrics" for r in m["ranks"]]
    assert len(steps) == 8 and all(event["flops_per_step"] / s > 0 for s in steps)
