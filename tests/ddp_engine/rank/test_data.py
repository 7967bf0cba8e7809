"""Datasets and the distributed loader: shards disjoint in an epoch, reshuffled across epochs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.rank.data import build_datasets, make_loader


def _epoch_indices(n: int, world: int, epoch: int, skip: int = 0) -> list[list[int]]:
    ds = TensorDataset(torch.arange(n), torch.zeros(n, dtype=torch.long))
    shards = []
    for rank in range(world):
        loader, sampler = make_loader(ds, rank=rank, world_size=world, batch_size=4, seed=7,
                                      shuffle=True, num_workers=0, pin_memory=False,
                                      drop_last=True)
        assert isinstance(sampler, DistributedSampler)
        sampler.set_epoch(epoch)
        sampler.skip(skip)
        shards.append([int(i) for x, _ in loader for i in x])
    return shards


def test_shards_are_disjoint_and_cover_the_data_within_an_epoch() -> None:
    shards = _epoch_indices(64, 2, epoch=0)
    assert len(shards[0]) == len(shards[1]) == 32
    assert not set(shards[0]) & set(shards[1])
    assert set(shards[0]) | set(shards[1]) == set(range(64))


def test_set_epoch_reshuffles_and_is_reproducible() -> None:
    e0, e1 = _epoch_indices(64, 2, epoch=0), _epoch_indices(64, 2, epoch=1)
    assert e0[0] != e1[0]
    assert _epoch_indices(64, 2, epoch=1) == e1
    assert not set(e1[0]) & set(e1[1])


def test_skip_resumes_inside_an_epoch() -> None:
    full = _epoch_indices(64, 2, epoch=3)
    resumed = _epoch_indices(64, 2, epoch=3, skip=8)
    assert [r[:] for r in resumed] == [f[8:] for f in full]


def test_synthetic_is_deterministic_learnable_and_shaped_for_the_model() -> None:
    a = build_datasets(RunConfig(dataset_args={"num_samples": 100, "num_classes": 3}))
    b = build_datasets(RunConfig(dataset_args={"num_samples": 100, "num_classes": 3}))
    assert torch.equal(a.train.tensors[0], b.train.tensors[0])
    assert a.info.num_classes == 3 and a.info.input_shape == (32,)
    assert len(a.train) == 100 and a.val is not None
    conv = build_datasets(RunConfig(model="convnet"))
    assert conv.train[0][0].shape == (1, 8, 8)
    with pytest.raises(ConfigError, match=r"synthetic needs num_samples >= 1"):
        build_datasets(RunConfig(dataset_args={"num_samples": 0}))
    with pytest.raises(ConfigError, match=r"dataset_args for synthetic: .*unexpected keyword"):
        build_datasets(RunConfig(dataset_args={"colour": 1}))


def test_digits_is_real_data_split_into_train_and_val() -> None:
    bundle = build_datasets(RunConfig(dataset="digits"))
    assert len(bundle.train) + len(bundle.val) == 1797
    assert bundle.train[0][0].shape == (1, 8, 8) and bundle.info.num_classes == 10


def test_text_dataset_gives_shifted_windows(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("abcdefghij" * 30)
    bundle = build_datasets(RunConfig(model="gpt-tiny", dataset=f"text:{f}",
                                      dataset_args={"block_size": 8}))
    x, y = bundle.train[1]
    assert x.shape == y.shape == (8,)
    assert torch.equal(x[1:], y[:-1])
    assert bundle.info.vocab_size == 10 and bundle.info.task == "lm"
    f.write_text("short")
    with pytest.raises(ConfigError, match=r"has 5 characters; it needs at least"):
        build_datasets(RunConfig(model="gpt-tiny", dataset=f"text:{f}"))


def test_plugin_dataset_pair_and_inferred_classes(tmp_path: Path) -> None:
    plugin = tmp_path / "ds.py"
    plugin.write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\n"
        "def make(n=20):\n"
        "    x = torch.randn(n, 3); y = torch.arange(n) % 4\n"
        "    return TensorDataset(x, y), TensorDataset(x[:5], y[:5])\n"
        "def bad():\n    return 42\n")
    bundle = build_datasets(RunConfig(dataset=f"{plugin}:make", dataset_args={"n": 12}))
    assert len(bundle.train) == 12 and len(bundle.val) == 5
    assert bundle.info.num_classes == 4 and bundle.info.input_shape == (3,)
    with pytest.raises(ConfigError, match=r"must return a non-empty Dataset"):
        build_datasets(RunConfig(dataset=f"{plugin}:bad"))


def test_torchvision_datasets_say_what_is_missing(tmp_path: Path) -> None:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match=r"mnist needs torchvision"):
            build_datasets(RunConfig(dataset="mnist"))
        return
    with pytest.raises(ConfigError, match=r"mnist not found under root"):
        build_datasets(RunConfig(dataset="mnist", dataset_args={"root": str(tmp_path)}))
