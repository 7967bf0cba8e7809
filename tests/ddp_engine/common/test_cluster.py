"""The cluster exports run as written: each node's torchrun script, and the SLURM batch script
under stand-ins for srun and scontrol that start its task once per node, as SLURM would (two
nodes on this machine, 2 CPU ranks each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_engine.common.cluster import node_command, slurm_script
from ddp_engine.common.config import RunConfig
from ddp_engine.common.run_dir import iter_metrics, read_rank_files
from tests.conftest import REPO, engine_env, free_port

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


def _config(tmp_path: Path, **extra: object) -> RunConfig:
    return RunConfig(model="mlp", dataset="synthetic", device="cpu", nproc=2, max_steps=20,
                     nnodes=2, rdzv_endpoint=f"127.0.0.1:{free_port()}", log_every=10,
                     runs_dir=str(tmp_path / "runs"), **extra)  # type: ignore[arg-type]


def _env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = engine_env()
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent),
                                   env["PATH"]])
    env.update(OMP_NUM_THREADS="1", SLURM_JOB_NODELIST="n[1-2]", SLURM_NNODES="2",
               SLURM_JOB_ID="4242")
    return env


def _trained_as_one_run(tmp_path: Path) -> None:
    (run_dir,) = (tmp_path / "runs").iterdir()  # rank 0 named it; every rank wrote there
    last = [m for m in iter_metrics(run_dir) if m["type"] == "metrics"][-1]
    assert last["step"] == 20
    assert [(r["rank"], r["node"], r["local_rank"]) for r in last["ranks"]] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert {d["state"] for d in read_rank_files(run_dir).values()} == {"completed"}
    assert (run_dir / "checkpoints" / "last.pt").is_file()


def test_a_node_command_names_its_node_and_the_rendezvous() -> None:
    cfg = RunConfig(nnodes=3, rdzv_endpoint="node0.example.org:29400", device="cuda",
                    gpus=[0, 1], name="big")
    assert node_command(cfg, 2) == (
        "RANKSCOPE_NODE_RANK=2 torchrun --nnodes 3 --rdzv-backend c10d --rdzv-endpoint "
        "node0.example.org:29400 --rdzv-id rankscope-big --nproc-per-node 2 "
        "--shutdown-timeout 30 -m ddp_engine.worker --config rankscope-config.json")
    script = slurm_script(cfg, "/opt/rankscope")
    assert "#SBATCH --nodes=3" in script and "#SBATCH --gpus-per-node=2" in script
    assert "RANKSCOPE_NODE_RANK=$SLURM_NODEID" in script


@pytest.mark.slow
def test_the_node_scripts_train_two_nodes_as_one_run(tmp_path: Path) -> None:
    from ddp_engine.common.cluster import node_script

    cfg = _config(tmp_path)
    procs = []
    for k in (0, 1):
        script = tmp_path / f"node-{k}" / "start.sh"  # each node its own folder
        script.parent.mkdir()
        script.write_text(node_script(cfg, k, str(REPO)))
        procs.append(subprocess.Popen(["bash", str(script)], cwd=script.parent,
                                      env=_env(tmp_path), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    _trained_as_one_run(tmp_path)


@pytest.mark.slow
def test_the_slurm_script_trains_two_nodes_as_one_run(tmp_path: Path) -> None:
    port = free_port()
    script = tmp_path / "job.sbatch"
    script.write_text(slurm_script(_config(tmp_path), str(REPO), port=port))
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "rankscope-4242.json").is_file()
    _trained_as_one_run(tmp_path)


@pytest.mark.slow
def test_a_node_started_by_its_script_joins_a_node_started_by_the_launcher(
        tmp_path: Path) -> None:
    """Node 0 as the app starts it (the launcher, a run folder of its own), node 1 from its
    exported plain-torchrun script (no folder: rank 0 names it): one run."""
    from ddp_engine.common.cluster import node_script
    from tests.conftest import start_engine

    cfg = _config(tmp_path)
    run_dir = tmp_path / "run"
    node0 = start_engine("launch", *cfg.to_argv(), "--run-dir", str(run_dir),
                         log=tmp_path / "node-0.log")
    script = tmp_path / "node-1" / "start.sh"
    script.parent.mkdir()
    script.write_text(node_script(cfg, 1, str(REPO)))
    node1 = subprocess.run(["bash", str(script)], cwd=script.parent, env=_env(tmp_path),
                           capture_output=True, text=True, timeout=240)
    assert node0.wait(timeout=60) == 0, (tmp_path / "node-0.log").read_text()
    assert node1.returncode == 0, node1.stdout + node1.stderr
    last = [m for m in iter_metrics(run_dir) if m["type"] == "metrics"][-1]
    assert last["step"] == 20 and [r["node"] for r in last["ranks"]] == [0, 0, 1, 1]
    assert sorted(read_rank_files(run_dir)) == [0, 1, 2, 3]  # node 1 wrote into rank 0's
