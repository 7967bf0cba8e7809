"""The built-in loop's learning-rate schedule: the factor of each schedule, the LambdaLR built
from it (and rebuilt at a resumed step), and the ``lr`` series a real 2-rank run reports."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.run_dir import iter_metrics
from ddp_engine.rank.lr_schedule import LrSchedule, lr_factor
from tests.conftest import run_engine

WARMUP, TOTAL = 10, 40

# factor at: step 0, mid warm-up, end of warm-up, half, three quarters, the last step
AT = (0, 5, WARMUP, TOTAL // 2, TOTAL * 3 // 4, TOTAL)
EXPECTED = {
    "constant": (0.0, 0.5, 1.0, 1.0, 1.0, 1.0),
    # after warm-up, progress p = (step - 10) / 30: 1/3 at half, 2/3 at three quarters
    "cosine": (0.0, 0.5, 1.0, 0.75, 0.25, 0.0),
    "linear": (0.0, 0.5, 1.0, 2 / 3, 1 / 3, 0.0),
    "step": (0.0, 0.5, 1.0, 0.1, 0.01, 0.01),
}


@pytest.mark.parametrize("schedule", sorted(EXPECTED))
def test_each_schedule_warms_up_from_zero_then_follows_its_shape(schedule: str) -> None:
    factor = lr_factor(schedule, WARMUP, TOTAL)
    assert [factor(s) for s in AT] == pytest.approx(EXPECTED[schedule], abs=1e-12)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_decays_are_monotonic_after_warm_up_and_start_at_full_without_one(schedule) -> None:
    factor = lr_factor(schedule, 0, TOTAL)
    values = [factor(s) for s in range(TOTAL + 1)]
    assert values[0] == 1.0 and values[-1] == pytest.approx(0.0, abs=1e-12)
    assert all(a > b for a, b in zip(values, values[1:], strict=False))


def test_step_drops_at_half_and_three_quarters_of_the_steps_counting_the_warm_up() -> None:
    factor = lr_factor("step", WARMUP, TOTAL)
    assert [factor(s) for s in (19, 20, 29, 30)] == [1.0, 0.1, 0.1, 0.01]


def test_a_warm_up_as_long_as_the_run_never_divides_by_zero() -> None:
    assert lr_factor("cosine", TOTAL, TOTAL)(TOTAL) == 1.0
    assert lr_factor("linear", 50, TOTAL)(TOTAL) == pytest.approx(0.8)


@pytest.mark.parametrize(("changes", "message"), [
    ({"lr_schedule": "exponential"},
     "lr_schedule: 'exponential' is not allowed; choose one of constant, cosine, linear, step"),
    ({"warmup_steps": -1}, "warmup_steps must be >= 0, got -1"),
])
def test_bad_schedules_are_refused_by_the_config_before_any_rank(changes, message) -> None:
    with pytest.raises(ConfigError, match=f"^{message}$"):
        RunConfig(**changes)


def _sgd(lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def test_constant_without_warm_up_builds_no_scheduler_and_leaves_the_lr_alone() -> None:
    opt = _sgd(0.1)
    assert LrSchedule.build(opt, RunConfig(lr=0.1), TOTAL) is None
    assert opt.param_groups[0]["lr"] == 0.1 and "initial_lr" not in opt.param_groups[0]
    assert LrSchedule.build(_sgd(), RunConfig(lr=0.1, warmup_steps=3), TOTAL) is not None


def test_the_lr_after_k_steps_is_the_formula_and_a_resume_rebuilds_it_there() -> None:
    cfg = RunConfig(lr=0.1, lr_schedule="cosine", warmup_steps=WARMUP)
    factor = lr_factor("cosine", WARMUP, TOTAL)
    opt = _sgd(0.1)
    schedule = LrSchedule.build(opt, cfg, TOTAL)
    assert schedule is not None and opt.param_groups[0]["lr"] == 0.0
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(TOTAL):
        opt.step()
        schedule.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([0.1 * factor(k) for k in range(TOTAL + 1)], abs=1e-15)
    for k in (1, WARMUP, 25):
        resumed = _sgd(0.1)
        resumed.load_state_dict(opt.state_dict())  # a checkpoint's lr: the decayed last one
        again = LrSchedule.build(resumed, cfg, TOTAL, start_step=k)
        assert again is not None and resumed.param_groups[0]["lr"] == lrs[k]
        resumed.step()
        again.step()
        assert resumed.param_groups[0]["lr"] == lrs[k + 1]


def test_a_first_optimizer_step_skipped_by_the_grad_scaler_raises_no_warning() -> None:
    opt = _sgd(0.1)
    schedule = LrSchedule.build(opt, RunConfig(lr=0.1, lr_schedule="linear"), TOTAL)
    assert schedule is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schedule.step()  # as after GradScaler.step() skipped the optimizer's step (inf grads)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * (1 - 1 / TOTAL))


# ------------------------------------------------------------------------------ real runs
def _lrs(run_dir: Path) -> dict[int, list[float]]:
    """Reporting step -> every rank's logged lr, from metrics.jsonl."""
    return {m["step"]: [r["logged"]["lr"] for r in m["ranks"]]
            for m in iter_metrics(run_dir) if m["type"] == "metrics"}


@pytest.fixture(scope="module")
def cosine_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("cosine") / "run"
    proc = run_engine("launch", "--nproc", "2", "--max-steps", str(TOTAL), "--lr", "0.01",
                      "--lr-schedule", "cosine", "--warmup-steps", str(WARMUP), "--log-every",
                      "5", "--checkpoint-every", "20", "--keep-step-checkpoints", "--run-dir",
                      str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir


@pytest.mark.slow
def test_a_run_reports_an_lr_that_rises_in_warm_up_and_falls_after(cosine_run: Path) -> None:
    lrs = _lrs(cosine_run)
    assert sorted(lrs) == list(range(5, TOTAL + 1, 5))
    assert all(len(v) == 2 and v[0] == v[1] for v in lrs.values())  # every rank, alike
    series = [lrs[s][0] for s in sorted(lrs)]
    assert series[0] < series[1]  # warm-up: steps 5, 10
    assert all(a > b for a, b in zip(series[1:], series[2:], strict=False))  # decay to 40
    expected = [0.01 * lr_factor("cosine", WARMUP, TOTAL)(s) for s in sorted(lrs)]
    assert series == pytest.approx(expected, abs=1e-12)
    assert series[1] == pytest.approx(0.01) and math.isclose(series[-1], 0.0, abs_tol=1e-12)


@pytest.mark.slow
def test_a_resumed_run_continues_the_schedule_at_its_step(cosine_run: Path,
                                                          tmp_path: Path) -> None:
    run_dir = tmp_path / "resumed"
    proc = run_engine("launch", "--nproc", "2", "--max-steps", str(TOTAL), "--lr", "0.01",
                      "--lr-schedule", "cosine", "--warmup-steps", str(WARMUP), "--log-every",
                      "5", "--resume", str(cosine_run / "checkpoints" / "step-20.pt"),
                      "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    resumed, uninterrupted = _lrs(run_dir), _lrs(cosine_run)
    assert sorted(resumed) == [25, 30, 35, 40]
    assert {s: uninterrupted[s] for s in resumed} == resumed
