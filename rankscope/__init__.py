"""Rankscope's API for your own training script: ``import rankscope``.

Nothing here is needed to be watched: Rankscope sees an unchanged torchrun script's steps,
loss, gradient sync and devices by itself. These calls add what it cannot guess. Outside a
Rankscope run (plain ``python``, plain ``torchrun``) every call does nothing, so a script that
uses them runs anywhere. Inside one, the rank's session (``ddp_engine.rank.script_watch``)
answers them. This module imports nothing heavy (no torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["active", "log", "on_stop", "should_stop"]

_session: Any = None
"""The rank's ScriptWatch while a script runs under Rankscope; None otherwise."""

F = TypeVar("F", bound=Callable[[], Any])


def active() -> bool:
    """True inside a rank of a Rankscope run."""
    return _session is not None


def log(**scalars: Any) -> None:
    """Extra per-rank series, drawn as charts named by their keys: ``rankscope.log(acc=0.91,
    lr=sched.get_last_lr()[0])``. Numbers, or one-element tensors (read on reporting steps
    only, never a sync per call). Between two reports the last value of a key counts.

    Raises:
        ValueError: a key that is not a name, or a value that is not one number.
    """
    if _session is not None:
        _session.log(scalars)


def should_stop() -> bool:
    """Whether every rank has agreed to stop (Stop in the app, ``ddp_engine stop``, SIGTERM).

    Call it at the same point of each step on every rank. In a loop that takes no optimizer
    step, each call ends a step (the agreement is made there). A script that calls it leaves
    its loop itself when it says True (nothing is raised out of ``optimizer.step()``);
    otherwise Rankscope ends the script at the agreed step.
    """
    return bool(_session.should_stop()) if _session is not None else False


def on_stop(fn: F) -> F:
    """Register ``fn()`` for an agreed stop: it runs on every rank, after the same step,
    with the process group still up (it may use collectives). What it returns on rank 0,
    unless None, is saved to the run's ``checkpoints/last.pt`` (torch.save, atomically);
    return None when ``fn`` saves its own checkpoint. Usable as a decorator."""
    if _session is not None:
        _session.on_stop(fn)
    return fn
