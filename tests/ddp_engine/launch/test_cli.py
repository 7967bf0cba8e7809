"""The command line as a user meets it: --help, --dry-run, bad input, status and stop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_engine.common.run_dir import read_status
from tests.conftest import (
    REPO,
    endless_run,
    engine_env,
    make_run_folder,
    processes_mentioning,
    run_engine,
    wait_for,
)


def test_help_lists_every_flag_with_its_default() -> None:
    proc = run_engine("launch", "--help", timeout=60)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for flag in ("--config", "--model", "--dataset", "--loss", "--nproc", "--gpus",
                 "--max-steps", "--epochs", "--batch-size", "--lr", "--optimizer", "--precision",
                 "--grad-accum", "--checkpoint-every", "--resume", "--run-dir", "--runs-dir",
                 "--name", "--seed", "--log-every", "--dry-run", "--model-arg"):
        assert flag in text, flag
    assert "(default: 32)" in text and "(default: adamw)" in text


def test_dry_run_prints_the_torchrun_command_and_starts_nothing(tmp_path: Path) -> None:
    proc = run_engine("launch", "--nproc", "2", "--max-steps", "5", "--runs-dir",
                      str(tmp_path / "runs"), "--dry-run", timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, rest = proc.stdout.split("\n", 1)
    assert "torchrun --standalone --nnodes 1 --nproc-per-node 2" in first
    assert "-m ddp_engine.worker --config" in first and "CUDA_VISIBLE_DEVICES=''" in first
    assert '"max_steps": 5' in rest and '"nproc": 2' in rest and '"device": "cpu"' in rest
    assert not (tmp_path / "runs").exists()


def test_dry_run_of_a_script_passes_everything_after_the_dashes_to_it(tmp_path: Path) -> None:
    script = tmp_path / "scripts" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    project = tmp_path / "project"  # where the user types the command
    (project / "sub").mkdir(parents=True)
    proc = run_engine("launch", "--script", str(script), "--nproc", "2", "--runs-dir",
                      str(tmp_path / "runs"), "--dry-run", "--", "--epochs", "3", "--nproc",
                      "9", "--", timeout=60, cwd=project)
    assert proc.returncode == 0, proc.stderr
    first, rest = proc.stdout.split("\n", 1)
    assert "--nproc-per-node 2 " in first and "-m ddp_engine.worker --config" in first
    cfg = json.loads(rest)
    assert cfg["script_args"] == ["--epochs", "3", "--nproc", "9", "--"]
    # The working folder: the caller's, as torchrun keeps it (not the script's), absolute
    assert cfg["script"] == str(script) and cfg["script_cwd"] == str(project)
    proc = run_engine("launch", "--script", "../scripts/train.py", "--script-cwd", "sub",
                      "--runs-dir", str(tmp_path / "runs"), "--dry-run", timeout=60, cwd=project)
    cfg = json.loads(proc.stdout.split("\n", 1)[1])  # relative: from the caller's folder
    assert (cfg["script"], cfg["script_cwd"]) == (str(script), str(project / "sub"))
    assert cfg["run_dir"].endswith("<timestamp>") and "train-" in cfg["run_dir"]


def test_dry_run_of_node_1_meets_node_0_by_c10d_and_keeps_its_own_folder(
        tmp_path: Path) -> None:
    proc = run_engine("launch", "--nproc", "2", "--nnodes", "2", "--node-rank", "1",
                      "--rdzv-endpoint", "node0.example.org:29400", "--run-dir",
                      str(tmp_path / "run"), "--dry-run", timeout=60)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.split("\n", 1)[0]
    assert "RANKSCOPE_NODE_RANK=1 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0 torchrun --nnodes 2 " \
        "--rdzv-backend c10d --rdzv-endpoint node0.example.org:29400 --rdzv-id " \
        "rankscope-mlp-synthetic --rdzv-conf is_host=0,join_timeout=120 --nproc-per-node 2" in first
    assert "--standalone" not in first and "--local-addr" not in first
    addr = run_engine("launch", "--nproc", "2", "--nnodes", "2", "--node-rank", "1",
                      "--rdzv-endpoint", "node0:29400", "--local-addr", "10.0.0.2", "--dry-run",
                      timeout=60)
    assert "--rdzv-id rankscope-mlp-synthetic --rdzv-conf is_host=0,join_timeout=120 " \
        "--local-addr 10.0.0.2 --nproc-per-node 2" in addr.stdout.split("\n", 1)[0]
    host = run_engine("launch", "--nproc", "2", "--nnodes", "2", "--node-rank", "0",
                      "--rdzv-endpoint", "10.251.7.1:29400", "--dry-run", timeout=60)
    assert "--rdzv-conf is_host=1," in host.stdout.split("\n", 1)[0]  # node 0 hosts the
    # store whatever its host name resolves to
    assert f"--config {tmp_path / 'run' / 'node-1' / 'config.json'}" in first
    assert not (tmp_path / "run").exists()


def test_cluster_prints_each_nodes_script_or_a_slurm_script(tmp_path: Path) -> None:
    nodes = run_engine("cluster", "--nnodes", "2", "--rdzv-endpoint", "node0:29400", "--nproc",
                       "2", "--device", "cpu", "--max-steps", "50", timeout=60)
    assert nodes.returncode == 0, nodes.stderr
    assert nodes.stdout.count("#!/bin/bash") == 2
    for k in (0, 1):
        assert '-m ddp_engine launch --config rankscope-config.json --nnodes 2 --node-rank ' \
            f"{k} --rdzv-endpoint node0:29400" in nodes.stdout
    assert '"max_steps": 50' in nodes.stdout and '"nnodes"' not in nodes.stdout
    slurm = run_engine("cluster", "--slurm", "--nnodes", "4", "--nproc", "8", "--device",
                       "cuda", timeout=60)  # no GPU here: the script is for the cluster
    assert slurm.returncode == 0, slurm.stderr
    assert "#SBATCH --nodes=4" in slurm.stdout and "#SBATCH --gpus-per-node=8" in slurm.stdout
    assert '--rdzv-endpoint "$head:29400"' in slurm.stdout
    cfg = tmp_path / "big.toml"
    cfg.write_text("nnodes = 3\nnproc = 4\n")  # the node count from a config file
    from_file = run_engine("cluster", "--slurm", "--config", str(cfg), timeout=60)
    assert from_file.returncode == 0, from_file.stderr
    assert "#SBATCH --nodes=3" in from_file.stdout
    alone = run_engine("cluster", "--nproc", "2", timeout=60)
    assert alone.returncode == 2 and "nnodes: give --nnodes N" in alone.stderr


def _touch(path: Path, text: str = "x") -> str:
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("args", "message"), [
    (["--nproc", "0"], "nproc must be >= 1, got 0"),
    (["--nproc", "4096"], "nproc must be between 1 and the number of"),
    (["--gpus", "99"], "gpus: GPU 99 does not exist"),
    (["--batch-size", "0"], "batch_size must be >= 1, got 0"),
    (["--batch-size", "ten"], "batch_size must be an integer, got 'ten'"),
    (["--model", "resnet9000"], "model: unknown model 'resnet9000'; known: mlp, convnet"),
    (["--dataset", "imagenet"], "dataset: unknown dataset 'imagenet'; known: synthetic"),
    (["--model", "{tmp}/nope.py:build"], "model: plugin file '{tmp}/nope.py' of"),
    (["--model", "{plugin}:make_model"], "has no function 'make_model'"),
    (["--model", "gpt-tiny", "--dataset", "text:{tmp}/none.txt"], "dataset: path "
                                                                  "'{tmp}/none.txt'"),
    (["--dataset", "imagefolder:{tmp}/nodir"], "dataset: path '{tmp}/nodir'"),
    (["--resume", "{tmp}/missing.pt"], "resume: checkpoint '{tmp}/missing.pt' does not exist"),
    (["--resume", "{junk}"], "is not a Rankscope checkpoint"),
    (["--run-dir", "{junk}"], "run_dir: '{junk}' is a file, not a folder"),
    (["--nnodes", "2"], "rdzv_endpoint: nnodes is 2, so every node needs the rendezvous"),
    (["--nnodes", "2", "--node-rank", "5", "--rdzv-endpoint", "h:1"],
     "node_rank must be between 0 and nnodes - 1 (1), got 5"),
    (["--config", "{badtoml}"], "does not parse as TOML"),
    (["--config", "{tmp}/none.toml"], "config: file '{tmp}/none.toml' does not exist"),
    (["--script", "{tmp}/none.py"], "script: '{tmp}/none.py' does not exist"),
    (["--script", "{tmp}"], "script: '{tmp}' is a folder"),
    (["--script", "{broken}"], "script: '{broken}' is not a Python file Python can parse at "
                               "line 2"),
    (["--script", "{plugin}", "--model", "mlp"], "script: '{plugin}' was given together with "
                                                 "--model"),
    (["--script", "{plugin}", "--lr", "0.5"], "script: lr = 0.5 applies to the built-in loop"),
    (["--script", "{plugin}", "--script-cwd", "{tmp}/nodir"], "script_cwd: '{tmp}/nodir' is "
                                                              "not a folder; give the folder"),
    (["--script", "{plugin}", "--script-cwd", "{plugin}"], "script_cwd: '{plugin}' is not a "
                                                           "folder"),
    (["--script", "{plugin}", "--script-cwd", " "], "script_cwd must not be empty"),
])
def test_bad_input_exits_2_with_one_line_before_any_worker(tmp_path: Path, args: list[str],
                                                           message: str) -> None:
    names = {"tmp": str(tmp_path), "junk": _touch(tmp_path / "junk.pt", "junk"),
             "plugin": _touch(tmp_path / "plug.py", "def build():\n    pass\n"),
             "badtoml": _touch(tmp_path / "bad.toml", "max_steps = [\n"),
             "broken": _touch(tmp_path / "broken.py", "import os\ndef main(:\n")}
    args = [a.format(**names) for a in args]
    proc = run_engine("launch", "--runs-dir", str(tmp_path / "runs"), *args, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message.format(**names) in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(error_lines) == 1, proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started or written
    assert not processes_mentioning(str(tmp_path))


def test_bad_checkpoint_with_torch_content_is_refused(tmp_path: Path) -> None:
    import torch

    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    proc = run_engine("launch", "--resume", str(other), "--runs-dir", str(tmp_path / "r"),
                      timeout=60)
    assert proc.returncode == 2
    assert "is not a Rankscope checkpoint (no format='rankscope-checkpoint' key)" in proc.stderr


def test_status_and_stop_commands(tmp_path: Path) -> None:
    assert run_engine("status", str(tmp_path / "none"), timeout=30).returncode == 2
    with endless_run(tmp_path) as (proc, run_dir):
        wait_for(lambda: (read_status(run_dir) or {}).get("step", 0) > 0, 120, "progress")
        shown = run_engine("status", str(run_dir), timeout=30)
        assert shown.returncode == 0
        assert "state: running" in shown.stdout and "rank 1: loss" in shown.stdout
        live = json.loads((run_dir / "monitor.json").read_text())
        assert f"telemetry: 127.0.0.1:{live['port']}  token: {live['token']}" in shown.stdout
        assert f"ssh -N -L {live['port']}:127.0.0.1:{live['port']}" in shown.stdout
        stopped = run_engine("stop", str(run_dir), timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.startswith("stopped at step")
        assert proc.wait(timeout=30) == 0
    assert read_status(run_dir)["state"] == "stopped"
    again = run_engine("stop", str(run_dir), timeout=30)
    assert again.returncode == 0 and "already ended: stopped" in again.stdout
    assert not processes_mentioning(str(run_dir))


def test_help_says_each_default_once() -> None:
    shown = " ".join(run_engine("launch", "--help", timeout=60).stdout.split())
    assert "--name STR run name (default: <model>-<dataset>) --dry-run" in shown
    assert "2 on CPU --gpus" in shown  # --nproc's help names its default: no "(default: -)"


def test_runs_in_a_fresh_checkout_says_there_are_none_yet(tmp_path: Path) -> None:
    shown = run_engine("runs", cwd=tmp_path, timeout=60)
    assert shown.returncode == 0 and shown.stdout.startswith("no runs yet: 'runs' does not "
                                                              "exist"), shown.stderr
    (tmp_path / "empty").mkdir()
    shown = run_engine("runs", str(tmp_path / "empty"), timeout=60)
    assert (shown.returncode, shown.stdout.strip()) == (0, f"no runs yet in "
                                                           f"{str(tmp_path / 'empty')!r}")
    (tmp_path / "a-file").write_text("")
    shown = run_engine("runs", str(tmp_path / "a-file"), timeout=60)
    assert shown.returncode == 2 and "is a file, not a folder" in shown.stderr


def test_status_formats_numbers_for_people_and_json_keeps_them(tmp_path: Path) -> None:
    run = make_run_folder(tmp_path, "r", losses=lambda step, rank: 0.0005270614754408598)
    status = json.loads((run / "status.json").read_text())
    status["last_metrics"] = {"ranks": [{"rank": 0, "loss": 0.0005270614754408598,
                                         "samples_per_s": 12345.678}]}
    (run / "status.json").write_text(json.dumps(status))
    shown = run_engine("status", str(run), timeout=60).stdout
    assert "  rank 0: loss 0.0005271  samples/s 12,346\n" in shown
    raw = json.loads(run_engine("status", str(run), "--json", timeout=60).stdout)
    assert raw["last_metrics"]["ranks"][0]["loss"] == 0.0005270614754408598


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    run = make_run_folder(tmp_path, "r")
    for args in (["status", str(run)], ["runs", str(tmp_path)], ["launch", "--help"]):
        proc = subprocess.Popen([sys.executable, "-m", "ddp_engine", *args], cwd=REPO,
                                env=engine_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # as `| head -n 0` would: gone before the first line
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
        # 141 (128 + SIGPIPE) as a shell reports a command its pipe ended; --help is
        # argparse's, which ends with 0 before any command runs
        assert err == "" and code == (0 if "--help" in args else 141), (args, code, err)
