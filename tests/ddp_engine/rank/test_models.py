"""Built-in models build for the data they are given and say clearly when they cannot."""

from __future__ import annotations

import pytest
import torch

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.rank.data import DataInfo
from ddp_engine.rank.models import build_model


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_convnet_fits_each_supported_image_size(shape: tuple[int, ...]) -> None:
    model = build_model(RunConfig(model="convnet"), DataInfo("classification", shape, 10))
    assert model(torch.randn(2, *shape)).shape == (2, 10)


def test_mlp_flattens_any_input_and_takes_model_args() -> None:
    model = build_model(RunConfig(model_args={"hidden": 16, "depth": 1}),
                        DataInfo("classification", (1, 8, 8), 5))
    assert model(torch.randn(3, 1, 8, 8)).shape == (3, 5)
    with pytest.raises(ConfigError, match=r"model_args for mlp: .*unexpected keyword.*width"):
        build_model(RunConfig(model_args={"width": 3}), DataInfo("classification", (4,), 2))


def test_gpt_tiny_predicts_every_next_token() -> None:
    info = DataInfo("lm", (16,), vocab_size=11, block_size=16)
    model = build_model(RunConfig(model="gpt-tiny", dataset="text:x"), info)
    assert model(torch.randint(0, 11, (2, 16))).shape == (2, 16, 11)
    with pytest.raises(ConfigError, match=r"dim \(30\) must be divisible by heads \(4\)"):
        build_model(RunConfig(model="gpt-tiny", dataset="text:x", model_args={"dim": 30}), info)


def test_convnet_refuses_flat_inputs_with_a_hint() -> None:
    with pytest.raises(ConfigError, match=r"convnet needs square images .* gives 32"):
        build_model(RunConfig(model="convnet"), DataInfo("classification", (32,), 10))


def test_resnet18_builds_when_torchvision_is_installed() -> None:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match=r"resnet18 needs torchvision"):
            build_model(RunConfig(model="resnet18"), DataInfo("classification", (3, 32, 32), 10))
        return
    model = build_model(RunConfig(model="resnet18"), DataInfo("classification", (1, 28, 28), 10))
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_plugin_model_must_return_a_module(tmp_path) -> None:
    plugin = tmp_path / "m.py"
    plugin.write_text("import torch\ndef good(width=4):\n    return torch.nn.Linear(3, width)\n"
                      "def bad():\n    return 'nope'\n")
    model = build_model(RunConfig(model=f"{plugin}:good", model_args={"width": 2}),
                        DataInfo("regression", (3,), 2))
    assert model(torch.randn(1, 3)).shape == (1, 2)
    with pytest.raises(ConfigError, match=r"must return a torch.nn.Module, got str"):
        build_model(RunConfig(model=f"{plugin}:bad"), DataInfo("regression", (3,), 2))
