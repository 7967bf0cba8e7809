"""``python -m ddp_engine doctor``: the GPUs' links and the warnings against the simulated NVML
(tests/simulated_nvml.py), the choice of devices as launch makes it, and real all-reduces of 2
CPU processes (gloo) under torchrun, end to end."""

from __future__ import annotations

import argparse
import dataclasses
import io
import itertools
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_engine.common import inventory
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.doctor_result import (
    DOCTOR_FILE,
    DoctorResult,
    SizeResult,
    bandwidths_gbs,
    busbw_factor,
    load_doctor,
)
from ddp_engine.common.gpus import Nvml, list_gpus
from ddp_engine.common.inventory import cuda_problem
from ddp_engine.launch import doctor_facts
from ddp_engine.launch.doctor import (
    add_doctor_arguments,
    examine,
    fmt_gbs,
    measure,
    print_facts,
    print_measurement,
    report_dict,
)
from ddp_engine.launch.doctor_facts import GpuFacts, PairLink
from ddp_engine.launch.launcher import EXIT_FORCED
from ddp_engine.launch.plan import plan_launch
from tests.conftest import REPO, cuda, engine_env, processes_mentioning, run_engine, wait_for
from tests.simulated_nvml import CPU_BUILD, CUDA_BUILD, SimGpu, SimulatedNvml, four_gpus, mig_gpu

CPU_BUILD_PROBLEM = cuda_problem(CPU_BUILD, "550.54.15", (12, 4))
ROW = re.compile(r"^\s+(\d+ [KMG]iB)\s+(\d+)\s+([\d.]+ (?:µs|ms))\s+(\S+) GB/s\s+(\S+) GB/s$",
                 re.MULTILINE)


def doctor_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_doctor_arguments(parser)
    return parser.parse_args(list(argv))


def workstation() -> list[SimGpu]:
    """four_gpus() with links: GPUs 0 and 1 share a PCIe switch but P2P is off between them
    (ACS); 2 and 3 sit under different CPU sockets, where no P2P is normal; GPU 1's link runs
    at x8 of x16; GPU 3 is thermally throttled; the others idle."""
    g0, g1, g2, g3 = gpus = four_gpus()
    g0.topology, g0.p2p_read = {g1.uuid: 10}, {g1.uuid: 1}  # PIX, chipset not supported
    g2.topology, g3.p2p_read = {g3.uuid: 50}, {g2.uuid: 3}  # SYS, IOH topology
    g1.pcie, g1.pcie_max = (1, 8), (4, 16)
    g2.pcie_max = g3.pcie_max = (3, 16)
    g0.clocks_event_reasons = 0x1  # idle: no warning
    g3.clocks_event_reasons = 0x1 | 0x40  # idle and hardware thermal slowdown
    return gpus


def facts_of(sim: SimulatedNvml, gpus: list[SimGpu]) -> tuple[list[GpuFacts], list[PairLink]]:
    sim.gpus = gpus
    with Nvml() as nvml:
        facts = doctor_facts.gpu_facts(nvml, list_gpus({}))
        return facts, doctor_facts.pair_links(nvml, facts)


# ------------------------------------------------------------------------- links (NVML)
def test_each_pair_has_its_p2p_status_topology_and_link_speed(
        simulated_nvml: SimulatedNvml) -> None:
    facts, pairs = facts_of(simulated_nvml, workstation())
    assert [(f.pcie, f.pcie_max) for f in facts] == [((4, 16), (4, 16)), ((1, 8), (4, 16)),
                                                     ((4, 16), (3, 16)), ((4, 16), (3, 16))]
    by_pair = {(p.a, p.b): p for p in pairs}
    assert len(pairs) == 6
    assert (by_pair[0, 1].p2p, by_pair[0, 1].topology) == (1, 10)
    assert (by_pair[2, 3].p2p, by_pair[2, 3].topology) == (3, 50)
    assert (by_pair[0, 2].p2p, by_pair[0, 2].topology) == (0, 30)
    assert by_pair[0, 1].allows_gbs == pytest.approx(1.969 * 16)  # gen4 x16 (its maximum)
    assert by_pair[0, 2].allows_gbs == pytest.approx(0.985 * 16)  # the slower side: gen3
    assert by_pair[0, 2].via == "PCIe gen3 x16"
    assert doctor_facts.link_allows_gbs(pairs) == pytest.approx(0.985 * 16)
    assert "GPU 0 - GPU 1  P2P chipset not supported  PIX (one PCIe switch)  link allows " \
           "~31.5 GB/s (PCIe gen4 x16)" == by_pair[0, 1].describe()
    assert simulated_nvml.initialised == 0


def test_nvlink_speed_counts_the_links_between_two_gpus_or_through_an_nvswitch(
        simulated_nvml: SimulatedNvml) -> None:
    bridged = four_gpus()[:2]  # NVLink 3.1 bridge, 4 links; the remote bus id in short form
    bridged[0].nvlinks = [("0000:01:00.0", 5)] * 4
    bridged[1].nvlinks = [("00000000:41:00.0", 5)] * 4
    facts, pairs = facts_of(simulated_nvml, bridged)
    assert [p.via for p in pairs] == ["NVLink 3.1 x4"]
    assert pairs[0].allows_gbs == pytest.approx(4 * 14.0625)
    assert "NVLink 3.1 x4" in doctor_facts.describe_gpu(facts[0])
    switched = four_gpus()[:2]  # NVLink 4.0 to an NVSwitch (a bus id that is no GPU's)
    for g in switched:
        g.nvlinks = [("00000000:C5:00.0", 6)] * 18
    _, pairs = facts_of(simulated_nvml, switched)
    assert (pairs[0].via, pairs[0].allows_gbs) == ("NVLink via NVSwitch 4.0 x18", 450.0)


def test_a_gpu_that_cannot_say_gives_unknowns_not_errors(simulated_nvml: SimulatedNvml) -> None:
    gpus = four_gpus()[:2]
    gpus[1].unsupported = {"pcie", "nvlink", "p2p", "topology", "clocks"}
    facts, pairs = facts_of(simulated_nvml, gpus)
    assert (facts[1].pcie, facts[1].pcie_max, facts[1].nvlinks, facts[1].throttle) == (
        (None, None), (None, None), [], None)
    assert (pairs[0].p2p, pairs[0].topology, pairs[0].allows_gbs) == (None, None, None)
    assert pairs[0].describe() == "GPU 0 - GPU 1  P2P ?  topology ?  link ? (PCIe, speed " \
                                  "unknown)"
    assert doctor_facts.warnings(facts, pairs) == []


# ------------------------------------------------------------------------------- warnings
def test_p2p_off_between_gpus_on_one_switch_is_a_warning_with_the_fix(
        simulated_nvml: SimulatedNvml) -> None:
    facts, pairs = facts_of(simulated_nvml, workstation())
    p2p = [w for w in doctor_facts.warnings(facts, pairs) if "P2P" in w]
    assert len(p2p) == 1  # not 2-3: no P2P across CPU sockets is normal
    assert p2p[0].startswith("P2P is disabled between GPU 0 and GPU 1 although they share a "
                             "PCIe switch (PIX; NVML: chipset not supported)")
    assert "ACS" in p2p[0] and "iommu=pt" in p2p[0] and "NCCL_P2P_DISABLE=1" in p2p[0]


def test_mixed_models_are_a_warning_naming_a_set_of_one_model(
        simulated_nvml: SimulatedNvml) -> None:
    facts, pairs = facts_of(simulated_nvml, workstation())
    mixed = [w for w in doctor_facts.warnings(facts, pairs) if w.startswith("mixed")]
    assert mixed == ["mixed GPU models: 2x NVIDIA RTX 6000 Ada Generation (GPU 0, 1), 2x NVIDIA "
                     "GeForce RTX 4090 (GPU 2, 3): DDP runs every rank at the slowest GPU's "
                     "pace; train on one model, e.g. --gpus 0,1"]
    same = [f for f in facts if f.info.index in (0, 1)]
    assert not [w for w in doctor_facts.warnings(same, []) if w.startswith("mixed")]


def test_a_busy_gpu_is_a_warning_with_its_load_and_processes(
        simulated_nvml: SimulatedNvml) -> None:
    facts, pairs = facts_of(simulated_nvml, workstation())
    busy = [w for w in doctor_facts.warnings(facts, pairs) if "busy" in w]
    assert busy == ["GPU 2 (NVIDIA GeForce RTX 4090) is busy: 97% utilization, 15.0 GiB of "
                    "24.0 GiB used, 1 process (pid 31337): a rank there runs at its pace, and "
                    "every rank waits for it; choose free GPUs with --gpus, or wait"]


def test_throttled_clocks_and_a_narrow_pcie_link_are_warnings(
        simulated_nvml: SimulatedNvml) -> None:
    facts, pairs = facts_of(simulated_nvml, workstation())
    found = doctor_facts.warnings(facts, pairs)
    throttled = [w for w in found if "throttled" in w]
    assert throttled == ["GPU 3 (NVIDIA GeForce RTX 4090) clocks are throttled (hardware "
                         "thermal slowdown): the GPU is too hot; check airflow and fans"]
    assert [w for w in found if "PCIe link runs" in w] == [
        "GPU 1 (NVIDIA RTX 6000 Ada Generation) PCIe link runs at x8 of its x16: the slot (or "
        "a riser) has fewer lanes; move it to a x16 slot"]


# ------------------------------------------------------------------------ choice of devices
@pytest.fixture
def machine(simulated_nvml: SimulatedNvml, monkeypatch: pytest.MonkeyPatch) -> SimulatedNvml:
    """workstation()'s GPUs, no CUDA_VISIBLE_DEVICES, and the CPU wheel of torch (a test
    describes a CUDA build where it needs one, as tests/ddp_engine/launch/test_plan.py does)."""
    simulated_nvml.gpus = workstation()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(inventory, "installed_torch", lambda: CPU_BUILD)
    return simulated_nvml


def test_the_gpus_measured_are_those_launch_would_give_the_same_flags(
        machine: SimulatedNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(inventory, "installed_torch", lambda: CUDA_BUILD)
    machine.gpus.append(mig_gpu())
    for flags, gpus in (([], [0, 1, 2, 3]), (["--nproc", "2"], [0, 1]),
                        (["--gpus", "3,1"], [3, 1])):
        report = examine(doctor_args(*flags, "--runs-dir", str(tmp_path)))
        assert (report.plan.device, report.measured) == ("cuda", gpus)
        same = plan_launch(RunConfig(**{k: v for k, v in vars(doctor_args(*flags)).items()
                                        if k in ("gpus", "nproc")}), create_run_dir=False)
        assert _devices(report.plan.env) == _devices(same.env) and same.cfg.gpus == gpus
        assert [(p.a, p.b) for p in report.links] == list(itertools.combinations(sorted(gpus), 2))
    assert len(report.gpus) == 5  # every GPU NVML lists is shown
    with pytest.raises(ConfigError, match=r"^gpus: GPU 4 cannot be used: GPU 4 \(NVIDIA "
                                          r"A100-SXM4-80GB\) in MIG mode"):
        examine(doctor_args("--gpus", "0,4"))


def test_gpus_torch_cannot_use_are_a_warning_and_the_check_runs_on_cpu(
        machine: SimulatedNvml, tmp_path: Path) -> None:
    report = examine(doctor_args("--runs-dir", str(tmp_path)))
    assert (report.plan.device, report.plan.cfg.nproc, report.measured) == ("cpu", 2, [])
    assert report.plan.env["CUDA_VISIBLE_DEVICES"] == ""
    assert report.warnings[0] == f"4 GPU(s) found, but {CPU_BUILD_PROBLEM}"
    assert any("P2P is disabled between GPU 0 and GPU 1" in w for w in report.warnings)
    report.result = DoctorResult(0.0, "cpu", "gloo", 2, [], [SizeResult(1024, 3, 1e-5, 0.1,
                                                                         0.1)])
    assert report.verdict() == ("OK: this machine can train: 2 CPU processes all-reduced with "
                                f"gloo (on CPU only: 4 GPU(s) found, but {CPU_BUILD_PROBLEM})")
    with pytest.raises(ConfigError, match=r"^gpus: GPU 0 cannot be used: the installed torch "
                                          r"2\.13\.0\+cpu is a CPU-only build"):
        examine(doctor_args("--gpus", "0"))
    with pytest.raises(ConfigError, match=r"^device: 'cuda' asked for: 4 GPU\(s\) found"):
        examine(doctor_args("--device", "cuda"))


def test_the_gpu_report_names_each_gpu_link_and_warning_and_compares_with_the_links(
        machine: SimulatedNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inventory, "installed_torch", lambda: CUDA_BUILD)
    report = examine(doctor_args())
    sizes = [SizeResult(s, 20, t, *bandwidths_gbs(s, t, 4)) for s, t in ((2**20, 2e-4),
                                                                         (2**28, 3e-2))]
    report.result = DoctorResult(1.0, "cuda", "nccl", 4, [], sizes, link_allows_gbs=15.76)
    out = io.StringIO()
    print_facts(report, out)
    print_measurement(report, out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("versions: Python ") and "NVIDIA driver 550.54.15 (CUDA up to " \
        "12.4)" in lines[0]
    assert lines[3] == ("  GPU 1 (NVIDIA RTX 6000 Ada Generation)  48.0 GiB  bus "
                        "00000000:01:00.0  PCIe gen1 x8 (max gen4 x16)  0% busy  1.0 GiB used  "
                        "40 C")
    assert "  GPU 2 - GPU 3  P2P IOH topology not supported  SYS (between CPU sockets)  link " \
           "allows ~15.8 GB/s (PCIe gen3 x16)" in lines
    assert sum(line.startswith("warning: ") for line in lines) == 5
    assert "  256 MiB          20  30.00 ms  8.95 GB/s  13.42 GB/s" in lines
    assert "bus bandwidth: best 13.42 GB/s (busbw = algbw x 2(n-1)/n, n = 4)" in lines
    assert ("  link allows ~15.8 GB/s per direction (slowest: GPU 0 - GPU 2, PCIe gen3 x16): "
            "measured 85% of it") in lines
    assert lines[-1] == ("OK: this machine can train: 4 GPU(s) (0, 1, 2, 3) all-reduced with "
                         "nccl; 5 warning(s) above")
    data = json.loads(json.dumps(report_dict(report)))
    assert data["links"][0] == {"a": 0, "b": 1, "p2p": "chipset not supported",
                                "topology": "PIX", "allows_gbs": pytest.approx(31.504),
                                "via": "PCIe gen4 x16"}
    assert data["gpus"][2]["pids"] == [31337] and data["gpus_measured"] == [0, 1, 2, 3]


def test_no_gpu_means_no_links_and_a_cpu_check(machine: SimulatedNvml) -> None:
    machine.fail_init = True  # no driver
    report = examine(doctor_args())
    assert (report.gpus, report.links, report.warnings, report.plan.device) == ([], [], [],
                                                                                "cpu")
    assert report.versions["driver"] is None and report.versions["python"]


# ------------------------------------------------------------------ end to end, on CPU
def table(stdout: str) -> list[tuple[str, float, float]]:
    """(size, algbw, busbw) of each row of the printed table."""
    return [(m[0], float(m[3]), float(m[4])) for m in ROW.findall(stdout)]


def test_doctor_all_reduces_on_cpu_and_keeps_the_bus_bandwidth(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = run_engine("doctor", "--nproc", "2", "--seconds", "1", "--runs-dir", str(runs),
                      timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table(proc.stdout)
    assert [size for size, _, _ in rows] == ["64 KiB", "256 KiB", "1 MiB", "4 MiB", "16 MiB"]
    for _, algbw, busbw in rows:
        assert busbw > 0 and busbw == algbw * busbw_factor(2)  # n = 2: busbw = algbw
    assert "all-reduce across 2 CPU processes (gloo)" in proc.stdout
    assert "OK: this machine can train: 2 CPU processes all-reduced with gloo" in proc.stdout
    kept = load_doctor(runs)
    assert kept is not None
    assert (kept.device, kept.backend, kept.world_size, kept.gpus) == ("cpu", "gloo", 2, [])
    printed = re.findall(r"(\S+ GB/s)$", proc.stdout, re.MULTILINE)
    assert printed == [fmt_gbs(s.busbw_gbs) for s in kept.sizes]
    assert f"best {fmt_gbs(kept.best_busbw_gbs)}" in proc.stdout
    assert f"kept in {runs / DOCTOR_FILE}" in proc.stdout


def test_doctor_json_is_the_report_and_matches_doctor_json(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    proc = run_engine("doctor", "--nproc", "2", "--seconds", "1", "--runs-dir", str(runs),
                      "--json", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert (report["ok"], report["exit_code"], report["device"], report["nproc"]) == (
        True, 0, "cpu", 2)
    assert report["measurement"] == json.loads((runs / DOCTOR_FILE).read_text())
    assert report["doctor_file"] == str(runs / DOCTOR_FILE)
    sizes = report["measurement"]["sizes"]
    assert len(sizes) == 5 and all(s["busbw_gbs"] > 0 for s in sizes)
    for s in sizes:
        assert s["busbw_gbs"] == pytest.approx(s["algbw_gbs"] * 2 * (2 - 1) / 2)
        assert s["algbw_gbs"] == pytest.approx(s["size_bytes"] / s["time_s"] / 1e9)
    assert report["versions"]["torch"] and report["versions"]["python"]


def test_a_measurement_past_its_timeout_is_ended_and_the_check_fails(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    start = time.monotonic()
    # 8 s: long enough for the ranks to be all-reducing (their start takes 2-5 s here)
    proc = run_engine("doctor", "--nproc", "2", "--seconds", "120", "--timeout", "8",
                      "--runs-dir", str(runs), env={"TMPDIR": str(tmp_path)}, timeout=120)
    assert time.monotonic() - start < 60  # ended at the timeout, not after the 120 s
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("CANNOT TRAIN: the all-reduce across 2 CPU processes did not finish within 8 s "
            "(--timeout); its processes were ended") in proc.stdout
    assert processes_mentioning(str(tmp_path)) == []  # torchrun and its ranks: all gone
    assert not (runs / DOCTOR_FILE).exists()
    assert not list(tmp_path.glob("rankscope-doctor-*"))


def test_ctrl_c_ends_the_check_even_where_sigint_came_ignored(tmp_path: Path) -> None:
    """Ctrl+C (the app's Cancel sends the same SIGINT) ends torchrun and the ranks and removes
    the temporary folder, also in a doctor started with SIGINT ignored, as a script's
    background job inherits it (without the doctor's own handler it went on measuring)."""
    log = tmp_path / "stderr.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ddp_engine", "doctor", "--nproc", "2", "--seconds", "120",
             "--progress", "--runs-dir", str(tmp_path / "runs")], cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=err, env={**engine_env(), "TMPDIR": str(tmp_path)},
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for(lambda: "progress 2/" in log.read_text(), 120, "the first all-reduce size")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == EXIT_FORCED, log.read_text()
    finally:
        proc.kill()
    assert "interrupted: the measurement's processes were ended" in log.read_text()
    assert processes_mentioning(str(tmp_path)) == []
    assert not list(tmp_path.glob("rankscope-doctor-*"))


def test_a_rank_that_fails_fails_the_check_with_its_error(tmp_path: Path) -> None:
    report = examine(doctor_args("--device", "cpu", "--nproc", "2"))
    # The ranks asked for CUDA with no GPU visible to them: they refuse, as a broken CUDA
    # set-up would make them.
    report.plan = dataclasses.replace(report.plan, device="cuda",
                                      env={**report.plan.env, "CUDA_VISIBLE_DEVICES": ""})
    measure(report, seconds=1, timeout_s=120)
    assert report.result is None and report.exit_code == 1
    assert report.reason is not None and report.reason.startswith(
        "the all-reduce across 2 CPU processes failed (torchrun exit code 1): RuntimeError: "
        "device: cuda")
    assert report.verdict() == f"CANNOT TRAIN: {report.reason}"
    assert any("RuntimeError" in line for line in report.log_tail)


def test_bad_input_exits_2_with_one_line_naming_the_field() -> None:
    proc = run_engine("doctor", "--gpus", "99", timeout=60)
    assert proc.returncode == 2
    assert re.fullmatch(r"error: gpus: GPU 99 does not exist; allowed: .*\n", proc.stderr)
    proc = run_engine("doctor", "--seconds", "0", timeout=60)
    assert proc.returncode == 2 and "seconds must be a number of seconds > 0, got '0'" in \
        proc.stderr


@cuda
def test_doctor_all_reduces_on_the_gpus(tmp_path: Path) -> None:
    proc = run_engine("doctor", "--runs-dir", str(tmp_path), "--json", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    measured = report["measurement"]
    assert (measured["device"], measured["backend"]) == ("cuda", "nccl")
    assert [g["index"] for g in measured["gpus"]] == report["gpus_measured"]
    assert report["versions"]["nccl"] and measured["versions"]["nccl"]
    assert all(s["algbw_gbs"] > 0 for s in measured["sizes"])


def _devices(env: dict[str, str]) -> dict[str, str]:
    """A plan's environment less the flight recorder's dump paths (under each plan's own runs
    folder: doctor's and launch's differ)."""
    return {k: v for k, v in env.items() if not k.endswith("_TEMP_FILE")}
