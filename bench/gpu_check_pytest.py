"""pytest plugin of ``make gpu-check``: ``-m cuda`` selects every test that needs a GPU.

    python -m pytest -p bench.gpu_check_pytest -m cuda tests

The tests that need a GPU carry tests/conftest.py's ``cuda``, a ``skipif`` mark (skipped where
NVML sees no GPU), not a mark named ``cuda``: on their own, ``-m cuda`` selects none of them.
This plugin gives each of them the ``cuda`` mark (registered in pyproject.toml) before pytest
deselects by mark, so that they are found by what they need, not by a list kept by hand.
"""

from __future__ import annotations

import pytest

CUDA_REASON = "needs a CUDA device"
"""The start of tests/conftest.py's ``cuda`` skip reason."""


def needs_cuda(item: pytest.Item) -> bool:
    """Whether ``item`` carries tests/conftest.py's ``cuda`` skip mark (or the mark itself)."""
    if item.get_closest_marker("cuda") is not None:
        return True
    return any(str(m.kwargs.get("reason", "")).startswith(CUDA_REASON)
               for m in item.iter_markers("skipif"))


@pytest.hookimpl(tryfirst=True)  # before the mark plugin deselects by ``-m``
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if needs_cuda(item):
            item.add_marker(pytest.mark.cuda)
