"""The loss-spike warning: the detector on made-up loss curves, then a real 2-rank run whose loss
jumps tenfold."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from ddp_engine.common.run_dir import iter_metrics, read_status
from ddp_engine.rank.loss_watch import LossSpike, LossWatch
from tests.conftest import FAULTY, run_engine


def _feed(watch: LossWatch, losses: list[float], ranks: int = 2,
          first_step: int = 10) -> list[LossSpike]:
    """Each mean loss as a report of ``ranks`` ranks around it, every 10 steps."""
    spikes = []
    for i, loss in enumerate(losses):
        rows = [loss * (1 + 0.01 * (r - (ranks - 1) / 2)) for r in range(ranks)]
        spike = watch.add(first_step + 10 * i, rows)
        if spike is not None:
            spikes.append(spike)
    return spikes


def _training_curve(reports: int, noise: float, seed: int = 0) -> list[float]:
    """A falling loss (2.3 down to about 0.1) with multiplicative noise of ``noise``."""
    rng = random.Random(seed)
    return [(0.1 + 2.2 * math.exp(-i / (reports / 5))) * (1 + rng.gauss(0, noise))
            for i in range(reports)]


def test_a_noisy_flat_loss_gives_no_warning() -> None:
    rng = random.Random(1)
    assert _feed(LossWatch(6, 3), [0.82 + rng.gauss(0, 0.1) for _ in range(2_000)]) == []
    # So flat that the MAD is next to nothing: the spread's floor (5% of the median) holds.
    flat = [0.5 + rng.gauss(0, 1e-9) for _ in range(500)]
    flat[300:303] = [0.55, 0.56, 0.57]  # 14% above: noise for a loss, not a spike
    assert _feed(LossWatch(6, 3), flat) == []


@pytest.mark.parametrize("seed", range(5))
def test_a_falling_noisy_training_curve_gives_no_warning(seed: int) -> None:
    assert _feed(LossWatch(6, 3), _training_curve(3_000, 0.08, seed)) == []


def test_a_tenfold_jump_for_three_reports_warns_once_at_the_third() -> None:
    losses = _training_curve(200, 0.05)
    losses[120:123] = [10 * v for v in losses[120:123]]
    watch = LossWatch(6, 3)
    spikes = _feed(watch, losses)
    assert len(spikes) == 1
    spike = spikes[0]
    assert (spike.step, spike.since_step, spike.reports) == (10 + 10 * 122, 10 + 10 * 120, 3)
    assert spike.loss == pytest.approx(losses[122]) and len(spike.losses) == 2
    # judged against the 50 reports before it, the first two of the three among them
    assert spike.median == pytest.approx(statistics.median(losses[72:122]))
    assert spike.median < spike.threshold < spike.loss
    assert spike.message.startswith(f"loss {spike.loss:.4g} at step {spike.step} is far above "
                                     f"its recent median {spike.median:.4g}")
    assert spike.message.endswith("3 reports in a row): the run may be diverging")
    fields = spike.event_fields()
    assert fields["cause"] == "loss_spike" and fields["step"] == 1230
    assert fields["losses"] == spike.losses and fields["threshold"] == spike.threshold
    # two reports above are not enough
    losses[122] = losses[121] / 10
    assert _feed(LossWatch(6, 3), losses) == []


def test_it_stays_quiet_while_the_loss_is_high_and_warns_again_after_recovering() -> None:
    losses = _training_curve(300, 0.05)
    losses[100:115] = [10 * v for v in losses[100:115]]  # 15 reports high: one warning
    losses[118:121] = [10 * v for v in losses[118:121]]  # 3 back under, then high again
    losses[200:203] = [10 * v for v in losses[200:203]]
    losses[205:208] = [10 * v for v in losses[205:208]]  # only 2 back under: not re-armed
    spikes = _feed(LossWatch(6, 3), losses)
    assert [s.step for s in spikes] == [10 + 10 * 102, 10 + 10 * 120, 10 + 10 * 202]
    losses[205] /= 10  # 3 back under now, then 3 high
    losses[208] *= 10
    assert [s.step for s in _feed(LossWatch(6, 3), losses)][2:] == [10 + 10 * 202,
                                                                    10 + 10 * 208]


def test_zero_turns_it_off_and_nothing_is_judged_before_the_warmup() -> None:
    losses = _training_curve(200, 0.05)
    losses[120:130] = [10 * v for v in losses[120:130]]
    assert _feed(LossWatch(0, 3), losses) == []
    assert len(_feed(LossWatch(6, 3), losses)) == 1
    early = [1.0] * 7 + [10.0] * 3 + [1.0] * 5  # judged from the 11th report on
    assert _feed(LossWatch(6, 3), early) == []
    assert [s.step for s in _feed(LossWatch(6, 3), [1.0] * 10 + [10.0] * 3)] == [130]


def test_the_threshold_is_the_median_plus_k_scaled_mads_at_least_5_percent_of_it() -> None:
    watch = LossWatch(6, 3)
    _feed(watch, [float(v) for v in range(1, 12)])  # median 6, MAD 3
    assert watch.threshold() == pytest.approx((6.0, 6.0 + 6 * 1.4826 * 3))
    flat = LossWatch(4, 3)
    _feed(flat, [2.0] * 9 + [2.001] * 9)  # MAD 0.0005: the floor, 5% of the median
    assert flat.threshold() == pytest.approx((2.0005, 2.0005 * (1 + 4 * 0.05)))
    assert LossWatch(6, 3).threshold() is None  # nothing to judge by yet


def test_a_report_with_a_non_finite_loss_is_left_to_the_nan_check() -> None:
    watch = LossWatch(6, 1)
    _feed(watch, [1.0] * 20)
    assert watch.add(500, [math.nan, 50.0]) is None and watch.add(510, [math.inf, 1.0]) is None
    assert len(watch.recent) == 20
    spike = watch.add(520, [50.0, 50.0])
    assert spike is not None and spike.message.endswith("(threshold 1.3, 1 report): the run "
                                                        "may be diverging")


@pytest.mark.slow
def test_a_run_whose_loss_jumps_warns_once_and_trains_on(tmp_path: Path) -> None:
    """2 ranks, 80 steps, a report every 2: the loss is 10 times itself from step 51 on, so the
    reports of steps 52, 54 and 56 are the three in a row."""
    run_dir = tmp_path / "run"
    done = run_engine("launch", "--nproc", "2", "--max-steps", "80", "--log-every", "2",
                      "--loss", f"{FAULTY}:spike_from_step_51", "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr[-2000:]
    assert read_status(run_dir)["state"] == "completed"
    lines = list(iter_metrics(run_dir))
    warnings = [m for m in lines if m["type"] == "event" and m["kind"] == "warning"]
    assert len(warnings) == 1, warnings
    warning = warnings[0]
    assert (warning["cause"], warning["step"], warning["since_step"]) == ("loss_spike", 56, 52)
    report = next(m for m in lines if m["type"] == "metrics" and m["step"] == 56)
    assert warning["losses"] == [r["loss"] for r in report["ranks"]]
    assert warning["median"] < warning["threshold"] < warning["loss"]
    assert f"[rankscope] warning: {warning['message']}" in done.stdout


@pytest.mark.slow
def test_an_ordinary_run_reported_every_step_gives_no_warning(tmp_path: Path) -> None:
    """The defaults on a run that does not blow up: 2 ranks, 200 steps, a report every step
    (200 judged reports of a noisy, falling loss), no loss_spike warning."""
    run_dir = tmp_path / "run"
    done = run_engine("launch", "--nproc", "2", "--max-steps", "200", "--log-every", "1",
                      "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = list(iter_metrics(run_dir))
    assert sum(m["type"] == "metrics" for m in lines) == 200
    assert not [m for m in lines if m.get("kind") == "warning"]
