"""What the in-process benches (step_costs, step_toggles, report_cost) share: each runs itself
under torchrun on 2 CPU ranks (gloo, OMP_NUM_THREADS=1), the ranks train the overhead workload
(bench/telemetry_overhead.py's MLP) and rank 0 writes a JSON result that the launching side
prints."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def on_two_ranks(script: str, args: list[str]) -> Any:
    """Run ``script --rank-side --out FILE *args`` on 2 CPU ranks under torchrun; rank 0's
    JSON result."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", script, "--rank-side", "--out", str(out),
                        *args], check=True, env=env, cwd=REPO)
        return json.loads(out.read_text())


def workload(hidden: int) -> Any:
    """The overhead workload's RunConfig at MLP width ``hidden``, endless (a RunConfig)."""
    from ddp_engine.common.config import RunConfig

    return RunConfig(model="mlp", model_args={"hidden": hidden, "depth": 2},
                     dataset="synthetic", dataset_args={"num_samples": 80_000, "val_samples": 0,
                                                        "input_shape": [256]},
                     device="cpu", max_steps=10**9, eval_every=0, batch_size=64,
                     optimizer="sgd", lr=0.01, momentum=0.0)


def rank_folder(prefix: str, rank: int) -> Path:
    """A run folder of this rank's own, with the subfolders a trainer writes to."""
    work = Path(tempfile.mkdtemp(prefix=f"{prefix}-{rank}-"))
    (work / "checkpoints").mkdir()
    (work / "ranks").mkdir()
    return work


def endless(trainer: Any) -> Iterator[Any]:
    """The trainer's batches, epoch after epoch."""
    while True:
        yield from trainer.loader


def main(doc: str, launch: Callable[[argparse.Namespace], None],
         rank_side: Callable[[argparse.Namespace], None],
         add: Callable[[argparse.ArgumentParser], None]) -> None:
    """A bench's command line: its own options (``add``) plus the hidden rank-side ones."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    add(parser)
    parser.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_side:
        rank_side(args)
    else:
        launch(args)
