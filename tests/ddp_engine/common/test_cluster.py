"""The cluster exports run as written, on a machine where Rankscope is installed and nothing of
this checkout is on PATH, PYTHONPATH or the working folder: each node's script, and the SLURM
batch script under stand-ins for srun and scontrol that start its task once per node, as SLURM
would (two nodes on this machine, one CPU rank each). Each node is Rankscope's launcher: a full
run folder that ``python -m ddp_engine status`` and ``runs`` read."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ddp_engine.common.cli_flags import add_config_arguments, config_from_namespace
from ddp_engine.common.cluster import NODE_FIELDS, node_command, node_script, slurm_script
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.run_dir import iter_metrics, read_rank_files, read_status
from tests.conftest import REPO, free_port

SRUN = """#!/bin/bash
# srun, as far as the script needs it: the command once per node, SLURM_NODEID set
while [[ $1 == --* ]]; do shift; done
pids=()
for ((k = 0; k < SLURM_NNODES; k++)); do SLURM_NODEID=$k "$@" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""
# show hostnames: the "nodes", the second line a moment later (as a long list comes in
# pieces): a script that stops reading after the first line ends with SIGPIPE under pipefail
SCONTROL = "#!/bin/bash\necho 127.0.0.1\nsleep 0.2\necho 127.0.0.2\n"
BIG = RunConfig(nnodes=3, rdzv_endpoint="node0.example.org:29400", device="cuda", gpus=[0, 1],
                name="big", max_steps=50)


def _config() -> RunConfig:
    """Two nodes of one CPU rank each, meeting at a free port on 127.0.0.1."""
    return RunConfig(model="mlp", dataset="synthetic", device="cpu", nproc=1, max_steps=20,
                     nnodes=2, log_every=10, rdzv_endpoint=f"127.0.0.1:{free_port()}")


def _env(tmp_path: Path) -> dict[str, str]:
    """A node's environment: RANKSCOPE_PYTHON is this interpreter (Rankscope is installed for
    it); no PYTHONPATH, and neither its bin folder (no torchrun) nor this checkout on PATH; srun
    and scontrol are stand-ins."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    venv_bin = Path(sys.executable).parent
    kept = [p for p in env["PATH"].split(os.pathsep)
            if p and Path(p).resolve() != venv_bin.resolve() and not p.startswith(str(REPO))]
    env.update(PATH=os.pathsep.join([str(bin_dir), *kept]), RANKSCOPE_PYTHON=sys.executable,
               PYTHONUNBUFFERED="1", SLURM_JOB_NODELIST="n[1-2]", SLURM_NNODES="2",
               SLURM_JOB_ID="4242")
    return env


def _embedded(script: str) -> tuple[dict[str, object], list[str]]:
    """The config a script writes, and the launcher's arguments after ``--config FILE`` (in the
    SLURM script, up to the quote that ends srun's ``bash -c`` command)."""
    config = re.search(r"<<'RANKSCOPE_CONFIG'\n(.*?)\nRANKSCOPE_CONFIG\n", script, re.S)
    command = re.search(r'exec "\$PYTHON" -m ddp_engine launch --config \S+ ([^\n\']*)', script)
    assert config and command, script
    flags = shlex.split(command.group(1))
    return json.loads(config.group(1)), flags[:-1] if flags[-1:] == ["$@"] else flags


def _as_launched(tmp_path: Path, script: str) -> RunConfig:
    """The config the launcher builds from what ``script`` writes and the flags it gives."""
    config, flags = _embedded(script)
    path = tmp_path / "embedded.json"
    path.write_text(json.dumps(config))
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return config_from_namespace(parser.parse_args(["--config", str(path), *flags]))


def _start(script: str, folder: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """Save ``script`` in ``folder`` (made here) and run it there, output to folder/out.log."""
    folder.mkdir(parents=True)
    (folder / "start.sh").write_text(script)
    return subprocess.Popen(["bash", "start.sh"], cwd=folder, env=env, text=True,
                            stdout=(folder / "out.log").open("w"), stderr=subprocess.STDOUT)


def _finish(procs: Sequence[subprocess.Popen[Any]], logs: list[Path], timeout: float) -> None:
    """Wait for every process to exit 0 (each killed on the way out if it has not)."""
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0] * len(procs), "\n".join(f"---- {log}\n{log.read_text()}"
                                                for log in logs)


def _engine(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddp_engine", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def _full_run_folder(run_dir: Path, node_rank: int) -> None:
    """config.json as the launcher resolved it for this node, a completed status.json, the
    ranks' logs and heartbeats."""
    cfg = json.loads((run_dir / "config.json").read_text())
    assert (cfg["nnodes"], cfg["node_rank"]) == (2, node_rank)
    assert Path(cfg["run_dir"]) == run_dir.resolve()
    status = read_status(run_dir)
    assert status is not None and status["state"] == "completed", status
    assert any((run_dir / "logs").rglob("*.log"))
    assert (run_dir / "ranks" / f"heartbeat-{node_rank}.json").is_file()
    assert read_rank_files(run_dir)[node_rank]["state"] == "completed"


def _metrics_of_both_nodes(run_dir: Path) -> None:
    last = [m for m in iter_metrics(run_dir) if m["type"] == "metrics"][-1]
    assert last["step"] == 20
    assert [(r["rank"], r["node"], r["local_rank"]) for r in last["ranks"]] == [
        (0, 0, 0), (1, 1, 0)]


def test_a_node_command_starts_the_launcher_with_the_node_flags() -> None:
    assert node_command(BIG, 2) == (
        'exec "$PYTHON" -m ddp_engine launch --config rankscope-config.json --nnodes 3 '
        "--node-rank 2 --rdzv-endpoint node0.example.org:29400 --rdzv-id rankscope-big")
    local = dataclasses.replace(BIG, local_addr="10.0.0.1")  # this machine's: node 0's only
    assert node_command(local, 0).endswith("--rdzv-id rankscope-big --local-addr 10.0.0.1")
    assert "--local-addr" not in node_command(local, 1)
    script = slurm_script(BIG)
    assert "#SBATCH --nodes=3" in script and "#SBATCH --gpus-per-node=2" in script
    assert ('--nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" --rdzv-endpoint '
            '"$head:29400" --rdzv-id "rankscope-$SLURM_JOB_ID" --run-dir "$run_dir"') in script


@pytest.mark.parametrize(("cfg", "node_rank", "message"), [
    (RunConfig(), 0, "nnodes: a node script is for a run of 2 or more nodes, got 1"),
    (BIG, 3, r"node_rank must be between 0 and nnodes - 1 \(2\), got 3"),
])
def test_a_node_script_for_no_such_node_names_the_field(cfg: RunConfig, node_rank: int,
                                                        message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        node_script(cfg, node_rank)


def test_the_scripts_name_no_path_of_this_checkout_and_no_bare_torchrun() -> None:
    for script in [node_script(BIG, k) for k in range(3)] + [slurm_script(BIG)]:
        assert str(REPO) not in script and "PYTHONPATH" not in script
        assert "torchrun" not in script and "ddp_engine.worker" not in script
        assert "PYTHON=${RANKSCOPE_PYTHON:-python3}\n" in script
        assert 'exec "$PYTHON" -m ddp_engine launch --config ' in script


def test_the_embedded_config_agrees_with_the_command(tmp_path: Path) -> None:
    for k in range(3):
        script = node_script(BIG, k)
        assert not set(NODE_FIELDS) & set(_embedded(script)[0])  # nodes: the command's alone
        # What node k's launcher runs is the form's config as node k, the chosen GPUs kept.
        assert _as_launched(tmp_path, script) == dataclasses.replace(
            BIG, node_rank=k, rdzv_id="rankscope-big")
    config, flags = _embedded(slurm_script(BIG))
    assert not set(NODE_FIELDS) & set(config)
    assert flags[:2] == ["--nnodes", "$SLURM_NNODES"]  # as many as #SBATCH --nodes asks
    # Under SLURM the job's GPUs: as many as were chosen, not their indices on this machine.
    assert (config["gpus"], config["nproc"], config["device"]) == (None, 2, "cuda")


def test_a_script_runs_on_every_node_in_the_folder_named_in_the_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripts carry a script run's working folder (by default the folder they are made
    in, as torchrun's caller's) and its file, absolute: a node started elsewhere agrees."""
    monkeypatch.chdir(tmp_path)
    cfg = dataclasses.replace(BIG, script="train.py", gpus=None, device="cpu", nproc=1)
    for script in (node_script(cfg, 1), slurm_script(cfg)):
        config = _embedded(script)[0]
        assert (config["script"], config["script_cwd"]) == (
            str(tmp_path / "train.py"), str(tmp_path))
    mine = dataclasses.replace(cfg, script_cwd=str(REPO))
    assert _embedded(node_script(mine, 0))[0]["script_cwd"] == str(REPO)


def test_a_python_without_rankscope_is_named_before_anything_starts(tmp_path: Path) -> None:
    env = {**_env(tmp_path), "RANKSCOPE_PYTHON": str(tmp_path / "no-python")}
    proc = subprocess.run(["bash", "-c", node_script(_config(), 1)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: RANKSCOPE_PYTHON: {tmp_path / 'no-python'} cannot "
                                  "import ddp_engine; pip install Rankscope for it")
    assert not (tmp_path / "rankscope-config.json").exists()


@pytest.mark.slow
def test_the_node_scripts_train_two_nodes_into_full_run_folders(tmp_path: Path) -> None:
    cfg = _config()  # runs_dir "runs": in each node's own working folder
    env = _env(tmp_path)
    nodes = [tmp_path / f"node-{k}" for k in (0, 1)]  # each node its own folder
    procs = [_start(node_script(cfg, k), nodes[k], env) for k in (0, 1)]
    _finish(procs, [n / "out.log" for n in nodes], timeout=120)
    runs = nodes[0] / "runs"
    (run_dir,) = runs.iterdir()
    _full_run_folder(run_dir, 0)
    _metrics_of_both_nodes(run_dir)
    (node1_dir,) = (nodes[1] / "runs").glob("mlp-synthetic-node-1-*")
    _full_run_folder(node1_dir, 1)
    status = _engine(env, tmp_path, "status", str(run_dir))
    assert status.returncode == 0, status.stderr
    assert "state: completed" in status.stdout and "step: 20/20" in status.stdout
    listing = _engine(env, tmp_path, "runs", str(runs))
    assert listing.returncode == 0, listing.stderr
    (row,) = [line.split() for line in listing.stdout.splitlines()
              if line.startswith(run_dir.name)]
    assert row[1:6] == ["completed", "mlp", "synthetic", "cpu", "x1"], listing.stdout


@pytest.mark.slow
def test_the_slurm_script_trains_two_nodes_into_the_jobs_run_folder(tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(slurm_script(_config(), port=free_port()))
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "rankscope-4242.json").is_file()
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name == "mlp-synthetic-4242"
    _full_run_folder(run_dir, 0)
    _full_run_folder(run_dir / "node-1", 1)
    _metrics_of_both_nodes(run_dir)
    assert (run_dir / "checkpoints" / "last.pt").is_file()
