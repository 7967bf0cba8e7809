"""Plugins: user files and modules, and the user guide's complete example run end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_engine.common.config import ConfigError
from ddp_engine.common.run_dir import iter_metrics, read_status
from ddp_engine.rank.plugins import load_callable
from tests.conftest import REPO, run_engine


def test_file_and_module_plugins_load(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("VALUE = 7\n")
    plugin = tmp_path / "p.py"
    plugin.write_text("from helper import VALUE\ndef f():\n    return VALUE\n")
    assert load_callable(f"{plugin}:f", "model")() == 7  # neighbours are importable
    fn = load_callable("tests.ddp_engine.rank.plugins.faulty:raise_on_rank1", "loss")
    assert fn.__name__ == "raise_on_rank1"
    with pytest.raises(ConfigError, match=r"model: 'tests.ddp_engine.rank.plugins.faulty' has no "
                                          r"function 'nothing'"):
        load_callable("tests.ddp_engine.rank.plugins.faulty:nothing", "model")
    with pytest.raises(ConfigError, match=r"dataset: module 'nowhere_pkg' cannot be imported"):
        load_callable("nowhere_pkg:f", "dataset")


@pytest.mark.slow
def test_readme_example_trains_custom_model_data_and_loss(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--config", "examples/custom_run.toml",
                      "--run-dir", str(run_dir), cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_status(run_dir)["state"] == "completed"
    evals = [m for m in iter_metrics(run_dir) if m.get("kind") == "eval"]
    assert evals and evals[-1]["val_accuracy"] > 0.8, evals
