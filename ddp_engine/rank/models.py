"""Built-in models and plugin models."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_values import BUILTIN_MODELS
from ddp_engine.rank.data import DataInfo
from ddp_engine.rank.plugins import load_callable


class MLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int, hidden: int = 128,
                 depth: int = 2) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvNet(nn.Module):
    """Two or three conv blocks and a linear head, for 1x8x8, 1x28x28 and 3x32x32 images."""

    def __init__(self, in_channels: int, size: int, num_classes: int, width: int = 32) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        ch = in_channels
        while size >= 8 and len(blocks) < 9:
            blocks += [nn.Conv2d(ch, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                       nn.MaxPool2d(2)]
            ch, size = width, size // 2
            width *= 2
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(ch * size * size, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTTiny(nn.Module):
    """A small character-level GPT: token + position embeddings, causal blocks, tied head."""

    def __init__(self, vocab_size: int, block_size: int, dim: int = 64, layers: int = 2,
                 heads: int = 4) -> None:
        super().__init__()
        if dim % heads:
            raise ConfigError(f"model_args: gpt-tiny dim ({dim}) must be divisible by heads "
                              f"({heads})")
        self.block_size = block_size
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(block_size, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        return self.head(self.ln(self.blocks(x)))


def _resnet18(info: DataInfo, **kwargs: Any) -> nn.Module:
    try:
        import torchvision
    except ImportError:
        raise ConfigError("model: resnet18 needs torchvision (install the project's [vision] "
                          "extra)") from None
    model = torchvision.models.resnet18(num_classes=info.num_classes or 10, **kwargs)
    if len(info.input_shape) == 3 and info.input_shape[0] != 3:
        model.conv1 = nn.Conv2d(info.input_shape[0], 64, 7, 2, 3, bias=False)
    return model


def build_model(cfg: RunConfig, info: DataInfo) -> nn.Module:
    """The model the config names, sized for the data."""
    args = dict(cfg.model_args)
    name = cfg.model
    try:
        if name == "mlp":  # classification, or regression with num_classes outputs
            return MLP(math.prod(info.input_shape), info.num_classes or 1, **args)
        if name == "convnet":
            shape = info.input_shape
            if len(shape) != 3 or shape[1] != shape[2] or shape[1] < 8:
                raise ConfigError(f"model: convnet needs square images CxHxW with H >= 8 (such "
                                  f"as 1x8x8, 1x28x28, 3x32x32); dataset {cfg.dataset!r} gives "
                                  f"{'x'.join(map(str, shape))}")
            _need_classes(name, info)
            return ConvNet(shape[0], shape[1], info.num_classes or 1, **args)
        if name == "resnet18":
            _need_classes(name, info)
            return _resnet18(info, **args)
        if name == "gpt-tiny":
            if info.task != "lm" or info.vocab_size is None or info.block_size is None:
                raise ConfigError(f"model: gpt-tiny needs token data (text:PATH), got dataset "
                                  f"{cfg.dataset!r}")
            return GPTTiny(info.vocab_size, info.block_size, **args)
    except TypeError as e:
        raise ConfigError(f"model_args for {name}: {e}") from None
    assert name not in BUILTIN_MODELS
    model = load_callable(name, "model")(**args)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model: {name} must return a torch.nn.Module, got "
                          f"{type(model).__name__}")
    return model


def _need_classes(name: str, info: DataInfo) -> None:
    if info.task != "classification":
        raise ConfigError(f"model: {name} is a classifier; the dataset is a {info.task} task")
