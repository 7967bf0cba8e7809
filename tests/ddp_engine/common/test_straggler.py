"""The straggler verdict (ddp_engine/common/straggler.py): the rank that waits least in the
all-reduce, once sustained, with how much longer its compute takes and the likely cause; on
synthetic reports, on simulated GPUs, and in a real 2-rank gloo run whose rank 1 is slower."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ddp_engine.common.run_dir import iter_metrics
from ddp_engine.common.straggler import StragglerWatch, run_verdict, throttle_names, verdict_of
from ddp_engine.rank.device_sampler import DeviceSampler
from tests.conftest import REPO, run_engine
from tests.simulated_nvml import SimGpu, SimulatedNvml

SLOW_RANK = REPO / "tests" / "ddp_engine" / "rank" / "plugins" / "slow_rank.py"


SYNC_S = 0.0002  # the all-reduce itself, once every rank has handed its gradients over


def _report(t: float, compute_s: list[float], **fields: list[Any]) -> dict[str, Any]:
    """A metrics message of ranks whose own work per step takes ``compute_s``: every step is
    as long as the slowest rank's plus the all-reduce, and each rank waits for the rest.
    ``fields`` adds a value per rank (None: null on the wire)."""
    step = max(compute_s) + SYNC_S
    ranks = []
    for r, c in enumerate(compute_s):
        entry = {"rank": r, "device": "cpu", "step_time_s": step, "eval_s": 0.0,
                 "sync_time_s": step - c, "sync_exposed_s": step - c, "data_wait_s": 0.0001}
        entry.update({k: v[r] for k, v in fields.items()})
        ranks.append(entry)
    return {"type": "metrics", "time": t, "step": int(10 * t), "ranks": ranks}


def _feed(watch: StragglerWatch, reports: int, compute_s: list[float], t0: float = 0.0,
          **fields: list[Any]) -> None:
    for i in range(reports):
        watch.add(_report(t0 + i, compute_s, **fields))


SLOW1 = [0.010, 0.014, 0.010]  # rank 1 computes 40% longer than ranks 0 and 2


def test_a_rank_is_named_only_once_it_waited_least_for_the_sustained_stretch() -> None:
    watch = StragglerWatch()
    _feed(watch, 19, SLOW1)
    assert watch.verdict is None  # 19 reports: not yet
    _feed(watch, 1, SLOW1, t0=19)
    v = watch.verdict
    assert v is not None and v.rank == 1 and v.excess == pytest.approx(0.4)
    assert v.wait_s == pytest.approx(0.0002) and v.others_wait_s == pytest.approx(0.0042)
    assert v.text.startswith("rank 1: compute 40% longer than the median rank's (waits 0.2 ms "
                             "in the all-reduce, the others 4.2 ms)")


def test_one_odd_report_breaks_a_streak_before_it_is_named_but_not_a_named_straggler() -> None:
    watch = StragglerWatch(sustain=5)
    _feed(watch, 4, SLOW1)
    watch.add(_report(4, [0.012, 0.010, 0.010]))  # a hiccup: rank 0 slowest once
    _feed(watch, 4, SLOW1, t0=5)
    assert watch.verdict is None  # the window still holds the hiccup
    _feed(watch, 1, SLOW1, t0=9)
    assert watch.verdict is not None and watch.verdict.rank == 1
    watch.add(_report(10, [0.012, 0.010, 0.010]))
    assert watch.verdict is not None and watch.verdict.rank == 1  # named: it stays


def test_when_another_rank_becomes_the_slow_one_the_verdict_moves_to_it() -> None:
    watch = StragglerWatch(sustain=6)
    _feed(watch, 6, SLOW1)
    assert watch.verdict is not None and watch.verdict.rank == 1
    _feed(watch, 3, [0.010, 0.010, 0.015], t0=6)
    assert watch.verdict is None  # rank 1 waited least in only half of the last six
    _feed(watch, 2, [0.010, 0.010, 0.015], t0=9)
    assert watch.verdict is None  # rank 2 not yet in all six
    _feed(watch, 1, [0.010, 0.010, 0.015], t0=11)
    assert watch.verdict is not None and watch.verdict.rank == 2
    assert watch.verdict.excess == pytest.approx(0.5)


def test_a_balanced_run_names_nobody_even_if_one_rank_always_waits_a_little_less() -> None:
    watch = StragglerWatch(sustain=5)
    _feed(watch, 30, [0.0100, 0.0105, 0.0100])  # 5%: noise, not a straggler
    assert watch.verdict is None


def test_one_rank_and_reports_without_timings_name_nobody() -> None:
    watch = StragglerWatch(sustain=3)
    _feed(watch, 10, [0.010])  # one rank waits for nobody
    assert watch.verdict is None
    nulls = _report(0, SLOW1)  # a script whose sync cannot be timed: null sync fields
    for r in nulls["ranks"]:
        r.update(sync_time_s=None, sync_exposed_s=None)
    for _ in range(10):
        watch.add(nulls)
    watch.add({"type": "metrics", "ranks": [{"rank": 0, "step_time_s": "x"}, "junk", {}]})
    watch.add({"type": "event", "kind": "eval"})
    assert watch.verdict is None
    # Reports without timings are no news: they neither count nor break the streak.
    for i in range(3):
        watch.add(_report(i, SLOW1))
        watch.add(nulls)
    assert watch.verdict is not None and watch.verdict.rank == 1


def test_without_exposed_time_the_sync_time_is_the_wait() -> None:
    report = _report(0, SLOW1)
    for r in report["ranks"]:
        r["sync_exposed_s"] = None
    v = verdict_of([report] * 3, sustain=3)
    assert v is not None and v.rank == 1


def test_a_sustain_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match=r"sustain must be an integer >= 1 \(reports\), got 0"):
        StragglerWatch(sustain=0)


def test_input_bound_when_its_data_wait_explains_the_excess() -> None:
    v = verdict_of([_report(t, SLOW1, data_wait_s=[0.0005, 0.0045, 0.0005])
                    for t in range(5)], sustain=5)
    assert v is not None and v.rank == 1
    assert "likely cause: input-bound (waits 4.5 ms per step for data, the others 0.5 ms)" in v.text
    v = verdict_of([_report(t, SLOW1, data_wait_s=[0.0005, 0.001, 0.0005]) for t in range(5)],
                   sustain=5)
    assert v is not None and "input-bound" not in v.text


def test_a_cpu_rank_that_got_less_cpu_time_says_so() -> None:
    cpu = [[1.0 * t, 0.5 * t, 1.0 * t] for t in range(6)]  # rank 1 gets half a core
    v = verdict_of([_report(t, SLOW1, process_cpu_s=cpu[t]) for t in range(6)], sustain=6)
    assert v is not None and v.rank == 1
    assert "likely cause: it got less CPU time than the others" in v.text
    assert "CPU time 0.50 cores (the others 1.00)" in v.text
    # psutil's CPU % where there is no process CPU time
    v = verdict_of([_report(t, SLOW1, cpu_pct=[100.0, 95.0, 100.0]) for t in range(6)],
                   sustain=6)
    assert v is not None and "less CPU" not in v.text and "CPU time 0.95 cores" in v.text


def test_throttle_bits_are_named_and_normal_reasons_are_not() -> None:
    assert throttle_names(0x1 | 0x2 | 0x10 | 0x100) == []  # idle, app clocks, sync boost...
    assert throttle_names(0x4 | 0x40) == ["software power cap", "hardware thermal slowdown"]
    assert throttle_names(None) == []


def test_a_thermally_throttled_simulated_gpu_is_the_likely_cause(
        simulated_nvml: SimulatedNvml) -> None:
    """Four GPU ranks; GPU 2 is hot, thermally throttled and clocked down. Each rank's sampler
    reads its GPU through the (simulated) NVML; the verdict names GPU 2's rank and why."""
    simulated_nvml.gpus = [SimGpu(uuid=f"GPU-{i}", pci_bus_id=f"00000000:0{i}:00.0",
                                  power_mw=690_000, temp_c=61, util_pct=100,
                                  clocks_event_reasons=0x1 if i == 1 else 0)
                           for i in range(4)]
    hot = simulated_nvml.gpus[2]
    hot.clocks_event_reasons, hot.sm_clock_mhz, hot.temp_c, hot.power_mw = 0x40, 1410, 87, 410_000
    readings = []
    for i in range(4):
        sampler = DeviceSampler("cuda", local_rank=i, gpu_uuid=f"GPU-{i}")
        sampler.start()  # its NVML session opens in the thread
        try:
            readings.append(sampler.poll_once())
        finally:
            sampler.request_stop()
            sampler.join(timeout=10)
    assert readings[2]["gpu_throttle"] == 0x40 and readings[2]["gpu_clock_mhz"] == 1410
    compute = [0.010, 0.010, 0.014, 0.010]
    reports = [_report(t, compute, **{k: [r[k] for r in readings] for k in readings[0]},
                       device=[f"GPU {i}" for i in range(4)]) for t in range(20)]
    v = verdict_of(reports)
    assert v is not None and v.rank == 2
    assert v.text == ("rank 2 (GPU 2): compute 40% longer than the median rank's (waits 0.2 ms "
                      "in the all-reduce, the others 4.2 ms); likely cause: hardware thermal "
                      "slowdown; its GPU: 1410 MHz SM clock, 410 W, 87 °C (the other GPUs: 1980 "
                      "MHz SM clock, 690 W, 61 °C)")


def test_the_verdict_of_a_run_folder_reads_only_its_end(tmp_path: Path) -> None:
    lines = [_report(t, [0.010, 0.010, 0.015]) for t in range(200)]
    lines += [_report(200 + t, SLOW1) for t in range(60)]
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for m in lines:
            f.write(json.dumps(m, separators=(",", ":")) + "\n")
            f.write('{"type":"event","kind":"epoch_start"}\n')
        f.write('{"type":"metrics","ranks":[')  # being written
    whole = verdict_of(iter_metrics(tmp_path))
    assert whole is not None and whole.rank == 1
    for block in (300, 1 << 20):
        assert run_verdict(tmp_path, block_bytes=block) == whole
    assert run_verdict(tmp_path / "nowhere") is None


@pytest.mark.slow
def test_a_real_run_names_its_slower_rank_1_never_rank_0(tmp_path: Path) -> None:
    """Two gloo ranks; rank 1's forward takes twice as long (tests/.../plugins/slow_rank.py). The
    launcher's progress line, ``status`` and the run's reports name rank 1, with a slower
    compute; no line ever names rank 0."""
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--nproc", "2", "--max-steps", "240", "--log-every", "3",
                      "--eval-every", "0", "--model", f"{SLOW_RANK}:slow_forward_on_rank1",
                      "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    named = re.findall(r"straggler: rank (\d+): compute (\d+)% longer", out)
    assert named, out
    assert {rank for rank, _ in named} == {"1"}, out
    status = run_engine("status", str(run_dir))
    found = re.search(r"^straggler: rank 1: compute (\d+)% longer than the median rank's "
                      r"\(waits [\d.]+ ms in the all-reduce, the others [\d.]+ ms\); "
                      # under load rank 1 may also get less CPU, which the status then says
                      r"(likely cause: it got less CPU time [^;]*; )?CPU time",
                      status.stdout, re.M)
    assert found and int(found[1]) >= 15, status.stdout
    # Every stretch of 20 reports that named a straggler named rank 1.
    watch, seen = StragglerWatch(), set()
    for m in iter_metrics(run_dir):
        watch.add(m)
        if watch.verdict is not None:
            seen.add(watch.verdict.rank)
    assert seen == {1}
