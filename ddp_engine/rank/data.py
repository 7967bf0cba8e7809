"""Built-in datasets, plugin datasets, and the distributed data loader."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_values import DIGITS_VAL_FRACTION, SYNTHETIC_SAMPLES, split_dataset
from ddp_engine.rank.plugins import load_callable


@dataclass
class DataInfo:
    """What a model factory needs to know about the data."""

    task: str
    """"classification", "lm" (next-token) or "regression"."""
    input_shape: tuple[int, ...]
    num_classes: int | None = None
    vocab_size: int | None = None
    block_size: int | None = None


@dataclass
class DataBundle:
    train: Dataset[Any]
    val: Dataset[Any] | None
    info: DataInfo


# Input shape each built-in model prefers when the synthetic dataset is not told one.
_SYNTHETIC_SHAPES = {"mlp": (32,), "convnet": (1, 8, 8), "resnet18": (3, 32, 32)}


def synthetic(model: str, *, num_samples: int = SYNTHETIC_SAMPLES, val_samples: int = 512,
              input_shape: list[int] | None = None, num_classes: int = 10,
              seed: int = 1234, noise: float = 0.05) -> DataBundle:
    """A deterministic, learnable classification set: labels of a fixed random linear teacher.

    The same seed gives the same data on every rank and every run.
    """
    shape = tuple(input_shape) if input_shape else _SYNTHETIC_SHAPES.get(model, (32,))
    if num_samples < 1 or val_samples < 0 or num_classes < 2 or any(d < 1 for d in shape):
        raise ConfigError(f"dataset_args: synthetic needs num_samples >= 1, val_samples >= 0, "
                          f"num_classes >= 2 and a positive input_shape; got num_samples="
                          f"{num_samples}, val_samples={val_samples}, num_classes={num_classes}, "
                          f"input_shape={list(shape)}")
    g = torch.Generator().manual_seed(seed)
    dim = math.prod(shape)
    teacher = torch.randn(dim, num_classes, generator=g)

    def make(n: int) -> TensorDataset:
        x = torch.randn(n, dim, generator=g)
        logits = x @ teacher + noise * torch.randn(n, num_classes, generator=g)
        return TensorDataset(x.reshape(n, *shape), logits.argmax(dim=1))

    train = make(num_samples)
    val = make(val_samples) if val_samples else None
    return DataBundle(train, val, DataInfo("classification", shape, num_classes=num_classes))


def digits(*, val_fraction: float = DIGITS_VAL_FRACTION) -> DataBundle:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, no download)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError("dataset: digits needs scikit-learn (pip install scikit-learn, or "
                          "the project's [sklearn] extra)") from None
    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    n_val = int(len(y) * val_fraction)
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    return DataBundle(TensorDataset(x[train_idx], y[train_idx]),
                      TensorDataset(x[val_idx], y[val_idx]) if n_val else None,
                      DataInfo("classification", (1, 8, 8), num_classes=10))


class CharDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed-length windows of a character sequence: (x[t:t+T], x[t+1:t+T+1])."""

    def __init__(self, tokens: torch.Tensor, block_size: int) -> None:
        self.tokens = tokens
        self.block_size = block_size

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.block_size)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.block_size
        chunk = self.tokens[start:start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


def text(path: str, *, block_size: int = 64, val_fraction: float = 0.1) -> DataBundle:
    """Character-level language modelling over a local UTF-8 text file."""
    body = Path(path).read_text(encoding="utf-8", errors="replace")
    vocab = sorted(set(body))
    if len(body) < 2 * (block_size + 1):
        raise ConfigError(f"dataset: text file {path!r} has {len(body)} characters; it needs at "
                          f"least {2 * (block_size + 1)} for block_size {block_size}")
    index = {c: i for i, c in enumerate(vocab)}
    tokens = torch.tensor([index[c] for c in body], dtype=torch.long)
    n_val = int(len(tokens) * val_fraction)
    if n_val <= block_size + 1:
        n_val = 0
    train = CharDataset(tokens[:len(tokens) - n_val], block_size)
    val = CharDataset(tokens[len(tokens) - n_val:], block_size) if n_val else None
    return DataBundle(train, val, DataInfo("lm", (block_size,), vocab_size=len(vocab),
                                           block_size=block_size))


def _torchvision(what: str) -> Any:
    try:
        import torchvision
    except ImportError:
        raise ConfigError(f"dataset: {what} needs torchvision (install the project's [vision] "
                          "extra)") from None
    return torchvision


def imagefolder(path: str, *, image_size: int = 32) -> DataBundle:
    """torchvision ImageFolder; uses PATH/train and PATH/val when both exist."""
    tv = _torchvision("imagefolder")
    tf = tv.transforms.Compose([tv.transforms.Resize((image_size, image_size)),
                                tv.transforms.ToTensor()])
    root = Path(path)
    if (root / "train").is_dir() and (root / "val").is_dir():
        train = tv.datasets.ImageFolder(str(root / "train"), transform=tf)
        val = tv.datasets.ImageFolder(str(root / "val"), transform=tf)
    else:
        train, val = tv.datasets.ImageFolder(str(root), transform=tf), None
    return DataBundle(train, val, DataInfo("classification", (3, image_size, image_size),
                                           num_classes=len(train.classes)))


def torchvision_set(name: str, *, root: str = "data", download: bool = False) -> DataBundle:
    """MNIST or CIFAR-10 from a local root (downloaded only when ``download`` is true)."""
    tv = _torchvision(name)
    cls = {"mnist": tv.datasets.MNIST, "cifar10": tv.datasets.CIFAR10}[name]
    tf = tv.transforms.ToTensor()
    try:
        train = cls(root, train=True, download=download, transform=tf)
        val = cls(root, train=False, download=download, transform=tf)
    except RuntimeError as e:
        raise ConfigError(f"dataset: {name} not found under root {root!r} ({e}); set "
                          f'[dataset] root = "DIR" or download = true (needs network)') from None
    shape = (1, 28, 28) if name == "mnist" else (3, 32, 32)
    return DataBundle(train, val, DataInfo("classification", shape, num_classes=10))


def plugin(spec: str, kwargs: dict[str, Any]) -> DataBundle:
    """A user factory returning a Dataset of (input, target), or a (train, val) pair."""
    made = load_callable(spec, "dataset")(**kwargs)
    if isinstance(made, tuple) and len(made) == 2:
        train, val = made
    else:
        train, val = made, None
    if not isinstance(train, Dataset) or not isinstance(train, Sized) or len(train) == 0:
        raise ConfigError(f"dataset: {spec} must return a non-empty Dataset of (input, target) "
                          f"pairs or a (train, val) pair of them, got {type(made).__name__}")
    return DataBundle(train, val, infer_info(train))


def infer_info(ds: Dataset[Any]) -> DataInfo:
    """Guess the task from the first samples: integer scalar targets mean classification."""
    x, y = ds[0]
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    if y.dim() == 0 and not y.is_floating_point():
        num_classes = getattr(ds, "num_classes", None)
        if num_classes is None and hasattr(ds, "classes"):
            num_classes = len(ds.classes)
        if num_classes is None:
            n = min(len(ds), 10_000)  # type: ignore[arg-type]
            num_classes = int(max(int(torch.as_tensor(ds[i][1])) for i in range(n))) + 1
        return DataInfo("classification", tuple(x.shape), num_classes=max(num_classes, 2))
    return DataInfo("regression", tuple(x.shape), num_classes=int(y.numel()))


def build_datasets(cfg: RunConfig) -> DataBundle:
    """The train (and val) datasets the config names."""
    kind, path = split_dataset(cfg.dataset)
    args = dict(cfg.dataset_args)
    try:
        if kind == "synthetic":
            return synthetic(cfg.model, **args)
        if kind == "digits":
            return digits(**args)
        if kind == "text":
            return text(path, **args)
        if kind == "imagefolder":
            return imagefolder(path, **args)
        if kind in ("mnist", "cifar10"):
            return torchvision_set(kind, **args)
    except TypeError as e:
        raise ConfigError(f"dataset_args for {cfg.dataset}: {e}") from None
    return plugin(cfg.dataset, args)


class ResumableDistributedSampler(DistributedSampler[Any]):
    """DistributedSampler that can skip the samples of an epoch already trained (on resume).

    It shards and shuffles exactly like DistributedSampler (set_epoch included); ``skip(n)``
    drops the first ``n`` of this rank's indices on the next pass only.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._skip = 0

    def skip(self, n: int) -> None:
        self._skip = n

    def __iter__(self) -> Iterator[Any]:
        skip, self._skip = self._skip, 0
        it = super().__iter__()
        for _ in range(skip):
            next(it, None)
        return it


def make_loader(ds: Dataset[Any], *, rank: int, world_size: int, batch_size: int, seed: int,
                shuffle: bool, num_workers: int, pin_memory: bool,
                drop_last: bool) -> tuple[DataLoader[Any], ResumableDistributedSampler]:
    """A DataLoader whose DistributedSampler gives this rank its own shard."""
    sampler = ResumableDistributedSampler(ds, num_replicas=world_size, rank=rank,
                                          shuffle=shuffle, seed=seed, drop_last=drop_last)
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                        pin_memory=pin_memory, drop_last=drop_last,
                        persistent_workers=num_workers > 0)
    return loader, sampler
