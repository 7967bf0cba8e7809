"""StepCounter: which optimizer steps end a step of the run, with real optimizers stepped in
the orders real scripts step them (one optimizer, a GAN, a WGAN's critic, staged training, an
optimizer that steps now and then)."""

from __future__ import annotations

import gc

import torch

from ddp_engine.rank.script_steps import StepCounter


def _opt() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)


def _run(counter: StepCounter, order: list[torch.optim.Optimizer]) -> list[str]:
    """Steps the optimizers in ``order`` through the counter as the watch does (``before``,
    then ``stepped``); per optimizer step, what ended: "p" a pending step ended before it,
    "s" a step ended at it, "-" nothing."""
    out = []
    for opt in order:
        mark = "p" if counter.before(opt) else ""
        mark += "s" if counter.stepped(opt) else ""
        out.append(mark or "-")
    return out


def test_one_optimizer_learns_from_its_second_step() -> None:
    counter, opt = StepCounter(), _opt()
    assert _run(counter, [opt] * 4) == ["-", "ps", "s", "s"]
    assert not counter.pending


def test_a_gan_ends_each_iteration_at_the_generators_step() -> None:
    counter, d, g = StepCounter(), _opt(), _opt()
    assert _run(counter, [d, g] * 3) == ["-", "s"] * 3
    assert counter.optimizers == [d, g]


def test_a_generator_that_skips_an_iteration_still_gives_one_step_per_iteration() -> None:
    counter, d, g = StepCounter(), _opt(), _opt()
    assert _run(counter, [d, g, d, d, g]) == ["-", "s", "-", "p", "s"]


def test_a_critic_stepping_five_times_per_generator_step_counts_its_steps() -> None:
    """A WGAN: the critic steps first and alone: it closes its own steps; the generator's
    steps end nothing (its loss goes into the next critic step)."""
    counter, critic, gen = StepCounter(), _opt(), _opt()
    ends = _run(counter, ([critic] * 5 + [gen]) * 2)
    assert ends == ["-", "ps", "s", "s", "s", "-", "s", "s", "s", "s", "s", "-"]


def test_an_optimizer_stepping_now_and_then_does_not_take_over() -> None:
    counter, main, aux = StepCounter(), _opt(), _opt()
    ends = _run(counter, [main, main, aux, main, main, aux, main])
    assert ends == ["-", "ps", "-", "s", "s", "-", "s"]


def test_a_new_stage_takes_over_whether_or_not_the_old_optimizer_is_kept() -> None:
    counter, first, second = StepCounter(), _opt(), _opt()
    assert _run(counter, [first] * 3 + [second] * 3) == ["-", "ps", "s", "-", "s", "s"]
    counter, first = StepCounter(), _opt()
    assert _run(counter, [first] * 3) == ["-", "ps", "s"]
    del first
    gc.collect()
    third = _opt()  # the first stage's optimizer was freed: the third counts, learnt afresh
    assert _run(counter, [third] * 3) == ["-", "ps", "s"]


def test_the_end_of_an_iteration_or_of_the_script_ends_a_pending_step() -> None:
    counter, opt = StepCounter(), _opt()
    assert _run(counter, [opt]) == ["-"] and counter.pending
    assert counter.end_pending() and not counter.pending
    assert not counter.end_pending()


def test_a_scaler_skip_of_the_counting_optimizer_is_counted() -> None:
    counter, opt = StepCounter(), _opt()
    _run(counter, [opt, opt])
    counter.scaler_begins(opt)
    assert counter.scaler_skipped(opt)  # scaler.step returned and opt never stepped
    assert counter.stepped(opt, skipped=True)
    assert counter.take_skipped() == 1 and counter.skipped_in_row == 1
    counter.scaler_begins(opt)
    assert counter.stepped(opt)  # stepped for real inside scaler.step
    assert not counter.scaler_skipped(opt)
    assert counter.skipped_in_row == 0 and counter.take_skipped() == 0
