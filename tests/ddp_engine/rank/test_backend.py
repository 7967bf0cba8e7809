"""The backend a rank chooses, and where eager NCCL init (device_id) is safe."""

from __future__ import annotations

import pytest

from ddp_engine.rank.backend import choose_backend, device_id_is_safe


def test_device_cuda_with_a_cpu_build_of_torch_says_so_and_how_to_fix_it() -> None:
    """Not "too few GPUs (CUDA_VISIBLE_DEVICES=...)": the torch installed cannot use CUDA."""
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    with pytest.raises(RuntimeError, match=r"^device: cuda: the installed torch .* CPU-only "
                       r"build; install the CUDA build: make clean install TORCH=cuda$"):
        choose_backend("cuda", 2)
    assert choose_backend("auto", 2) == "gloo"


@pytest.mark.parametrize(("version", "safe"), [
    ("2.2.2", False), ("2.3.0", True), ("2.5.1+cu124", True), ("2.6.0", False),
    ("2.7.0+cu128", False), ("2.7.1", True), ("2.13.0+cpu", True), ("2.8.0a0+git1234", True)])
def test_device_id_is_passed_only_where_torch_is_known_not_to_hang_with_it(version: str,
                                                                           safe: bool) -> None:
    assert device_id_is_safe(version) is safe


def test_the_torch_floor_is_the_first_release_with_device_id() -> None:
    """pyproject's torch floor: 2.3 brought init_process_group(device_id=...) and
    torch.amp.GradScaler("cuda"), which the ranks use; 2.2 (the floor before) had neither."""
    import re
    import tomllib

    from tests.conftest import REPO

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (floor,) = [m.group(1) for d in deps if (m := re.fullmatch(r"torch>=([\d.]+)", d))]
    major, minor = (int(p) for p in floor.split(".")[:2])
    assert device_id_is_safe(f"{major}.{minor}.0")
    assert not device_id_is_safe(f"{major}.{minor - 1}.99")
