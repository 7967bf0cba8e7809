"""The framework matrix (issue 28): PyTorch Lightning, the Hugging Face Trainer and Accelerate,
each in a script written the way that framework's users write it, run on 2 CPU ranks under plain
torchrun and the same file under Rankscope. A script that succeeds under torchrun succeeds under
Rankscope, with the same outputs and the loss the framework logs, and stops at one agreed step
however it is asked to. The other ways people train: test_script_patterns.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ddp_engine.rank.script_matrix import (
    SCRIPTS,
    assert_breakdown_within_step,
    assert_completed,
    assert_losses_match,
    assert_same_weights,
    assert_stopped_at_one_step,
    assert_sync_timed_or_explained,
    load_weights,
    logged_losses,
    rank_losses,
    rankscope,
    reference,
    stop_run,
)

pytest.importorskip("pytorch_lightning")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

pytestmark = pytest.mark.slow
__all__ = ["reference"]  # the module-scoped fixture, shared by this module's tests

LIGHTNING = SCRIPTS / "lightning_train.py"
HF_TRAINER = SCRIPTS / "hf_trainer_clm.py"
ACCELERATE = SCRIPTS / "accelerate_loop.py"


@pytest.mark.parametrize("accumulate", [1, 2])
def test_lightning_ddp_trains_as_under_torchrun(tmp_path: Path, reference, accumulate: int
                                                ) -> None:
    """``Trainer(accelerator="cpu", devices=2, strategy="ddp")``, with and without
    ``accumulate_grad_batches``. Lightning builds ``DistributedDataParallel(module=model,
    ...)`` by keyword, and steps the optimizer with a closure (forward and backward inside
    ``optimizer.step()``)."""
    args = ("--accumulate", str(accumulate))
    plain = reference(LIGHTNING, *args)
    run_dir = tmp_path / "run"
    proc = rankscope(run_dir, LIGHTNING, "--out", str(tmp_path / "out"), *args)
    assert_completed(run_dir, proc)
    assert_same_weights(load_weights(plain / "weights.pt"),
                        load_weights(tmp_path / "out" / "weights.pt"))
    logged = logged_losses(tmp_path / "out")
    # 256 samples / 2 ranks / 16 a batch = 8 batches an epoch, 2 epochs
    assert len(logged) == 16 // accumulate
    assert logged == pytest.approx(logged_losses(plain), rel=1e-6)
    # Lightning's step loss (the mean over the step's micro-batches) is what Rankscope shows
    assert_losses_match(rank_losses(run_dir, 0), logged)
    assert_sync_timed_or_explained(run_dir)
    assert_breakdown_within_step(run_dir)


def test_hf_trainer_trains_a_tiny_gpt2_as_under_torchrun(tmp_path: Path, reference) -> None:
    """run_clm.py's recipe, small. The Trainer logs (logging_steps=1) the loss gathered from
    every rank and averaged: Rankscope's per-rank losses of that step, averaged, are that."""
    plain = reference(HF_TRAINER)
    run_dir = tmp_path / "run"
    proc = rankscope(run_dir, HF_TRAINER, "--out", str(tmp_path / "out"))
    assert_completed(run_dir, proc)
    assert_same_weights(load_weights(plain / "weights.pt"),
                        load_weights(tmp_path / "out" / "weights.pt"))
    logged = logged_losses(tmp_path / "out")
    assert len(logged) == 22  # 2 epochs of 11 steps (8 blocks of 32 characters a batch)
    assert logged == pytest.approx(logged_losses(plain), rel=1e-6)
    r0, r1 = rank_losses(run_dir, 0), rank_losses(run_dir, 1)
    assert_losses_match({s: (r0[s] + r1[s]) / 2 for s in r0}, logged)
    assert_sync_timed_or_explained(run_dir)


def test_accelerate_loop_trains_as_under_torchrun(tmp_path: Path, reference) -> None:
    """``Accelerator(cpu=True)``, ``prepare`` and ``accelerator.backward``; rank 0 logs its own
    loss of every step."""
    plain = reference(ACCELERATE)
    run_dir = tmp_path / "run"
    proc = rankscope(run_dir, ACCELERATE, "--out", str(tmp_path / "out"))
    assert_completed(run_dir, proc)
    assert_same_weights(load_weights(plain / "weights.pt"),
                        load_weights(tmp_path / "out" / "weights.pt"))
    logged = logged_losses(tmp_path / "out")
    assert len(logged) == 16  # 512 samples / 2 ranks / 32 a batch, 2 epochs
    assert logged == pytest.approx(logged_losses(plain), rel=1e-6)
    assert_losses_match(rank_losses(run_dir, 0), logged)
    assert_sync_timed_or_explained(run_dir)


@pytest.mark.parametrize(("script", "args", "how"), [
    (LIGHTNING, ("--epochs", "100000"), "sigterm"),  # Lightning chains its own handler
    (HF_TRAINER, ("--epochs", "100000"), "ctrl-c"),
    (ACCELERATE, ("--epochs", "100000", "--samples", "4096"), "socket"),
], ids=["lightning-sigterm", "hf-trainer-ctrl-c", "accelerate-stop"])
def test_a_framework_run_stops_at_one_step_with_a_checkpoint(
        tmp_path: Path, script: Path, args: tuple[str, ...], how: str) -> None:
    """Each framework stopped one of the three ways (rotating: each way is covered once):
    ``stopped``, every rank after the same step, a checkpoint that loads, nothing left."""
    run_dir, children = stop_run(tmp_path, script, "--out", str(tmp_path / "out"), *args,
                                 how=how)
    state = assert_stopped_at_one_step(run_dir, children)
    assert state["source"] == "script" and state["model"], sorted(state)
    assert not (tmp_path / "out" / "weights.pt").exists()  # left at the stop, not finished
