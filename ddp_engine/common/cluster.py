"""Taking a config to a cluster: torchrun's rendezvous arguments, the command for each node,
and a SLURM batch script (standard library only: the app builds them without torch).

Every node runs the same worker with the same config; what differs is its node rank, given as
RANKSCOPE_NODE_RANK (ranks are numbered by it: see ``NODE_RANK_ENV``). The nodes meet through
torchrun's c10d rendezvous at node 0's address.
"""

from __future__ import annotations

import dataclasses
import shlex

from ddp_engine.common.config import RunConfig
from ddp_engine.common.config_values import NODE_RANK_ENV

DEFAULT_RDZV_PORT = 29400
CONFIG_NAME = "rankscope-config.json"
"""The config file the exported commands read, written next to them by the script."""


def rendezvous_args(cfg: RunConfig) -> list[str]:
    """torchrun's node arguments: c10d rendezvous for a multi-node config, else standalone."""
    if not cfg.multi_node:
        return ["--standalone", "--nnodes", "1"]
    assert cfg.rdzv_endpoint is not None  # RunConfig.validate requires it
    return ["--nnodes", str(cfg.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint",
            cfg.rdzv_endpoint, "--rdzv-id", cfg.rendezvous_id(),
            *(["--local-addr", cfg.local_addr.strip()] if cfg.local_addr else [])]


def _procs(cfg: RunConfig) -> str:
    """Processes per node: the config's, else one per GPU (torchrun's "gpu"), or 2 on CPU."""
    if cfg.nproc is not None:
        return str(cfg.nproc)
    if cfg.gpus is not None:
        return str(len(cfg.gpus))
    return "2" if cfg.device == "cpu" else "gpu"


def portable_config(cfg: RunConfig) -> RunConfig:
    """The config as every node reads it: nothing about nodes (each node's command says it),
    no fixed run folder (rank 0 names one under runs_dir and tells the others), GPUs chosen
    per node."""
    return dataclasses.replace(cfg, nnodes=1, node_rank=0, rdzv_endpoint=None, rdzv_id=None,
                               local_addr=None,
                               run_dir=None, dry_run=False, gpus=None,
                               nproc=None if cfg.gpus is not None else cfg.nproc)


def _torchrun(cfg: RunConfig, node_rank: str, node_args: list[str], config_path: str) -> str:
    """A torchrun command line; every argument is already a shell word (quoted or a $var)."""
    env = [f"{NODE_RANK_ENV}={node_rank}"] + (['CUDA_VISIBLE_DEVICES=""'] if cfg.device == "cpu"
                                              else [])
    return " ".join([*env, "torchrun", *node_args, "--nproc-per-node", _procs(cfg),
                     "--shutdown-timeout", str(cfg.shutdown_timeout_s), "-m", "ddp_engine.worker",
                     "--config", config_path])


def node_command(cfg: RunConfig, node_rank: int, config_path: str = CONFIG_NAME) -> str:
    """The exact command that starts node ``node_rank`` of ``cfg`` with plain torchrun."""
    return _torchrun(cfg, str(node_rank), [shlex.quote(a) for a in rendezvous_args(cfg)],
                     shlex.quote(config_path))


def node_script(cfg: RunConfig, node_rank: int, pythonpath: str) -> str:
    """A shell script for one node: writes the config, then runs :func:`node_command`."""
    return "\n".join([
        "#!/bin/bash",
        f"# Rankscope: node {node_rank} of {cfg.nnodes} ({cfg.default_name()}). Start one of",
        "# these on each node (any order); node 0's address is the rendezvous endpoint.",
        "set -euo pipefail",
        f"export PYTHONPATH={shlex.quote(pythonpath)}${{PYTHONPATH:+:$PYTHONPATH}}",
        _write_config(cfg, CONFIG_NAME),
        node_command(cfg, node_rank),
        ""])


def slurm_script(cfg: RunConfig, pythonpath: str, port: int = DEFAULT_RDZV_PORT) -> str:
    """An sbatch script for ``cfg``: one task per node, each ``srun`` task a torchrun agent,
    meeting at the first node of the allocation; the node rank is SLURM_NODEID."""
    gpu = cfg.device != "cpu"
    procs = _procs(cfg)
    header = [
        "#!/bin/bash",
        f"#SBATCH --job-name={cfg.default_name()}",
        f"#SBATCH --nodes={cfg.nnodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if gpu and procs != "gpu":
        header.append(f"#SBATCH --gpus-per-node={procs}")
    elif gpu:
        header.append("# (ask for the GPUs as your cluster wants, e.g. #SBATCH --gpus-per-node=8:"
                      " torchrun starts one process per visible GPU)")
    header += [
        "#SBATCH --output=rankscope-%j.out",
        "",
        f"# Rankscope: {cfg.default_name()} on {cfg.nnodes} nodes x {procs} processes.",
        "# Ranks are numbered by node (node k holds ranks k*P .. k*P+P-1); rank 0, with the",
        "# metrics, checkpoints and live telemetry, is on the first node of the allocation.",
        "set -euo pipefail",
        f"export PYTHONPATH={shlex.quote(pythonpath)}${{PYTHONPATH:+:$PYTHONPATH}}",
        # sed reads every line (head -n 1 would not, and with pipefail a scontrol that writes
        # after head left ends the job with SIGPIPE)
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        'config="$PWD/rankscope-$SLURM_JOB_ID.json"  # on a file system every node sees',
        _write_config(cfg, '"$config"'),
    ]
    # $SLURM_NODEID differs per node, so the command is single-quoted for the shell srun
    # starts on each node; the head node's name and the config file go in its environment.
    torchrun = _torchrun(cfg, "$SLURM_NODEID", [
        "--nnodes", "$SLURM_NNODES", "--rdzv-backend", "c10d", "--rdzv-endpoint",
        f"$head:{port}", "--rdzv-id", "rankscope-$SLURM_JOB_ID"], '"$config"')
    body = ["export head config",
            f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(torchrun)}", ""]
    return "\n".join(header + body)


def _write_config(cfg: RunConfig, path: str) -> str:
    """Shell lines that write ``cfg`` (as every node reads it) to ``path``."""
    return f"cat > {path} <<'RANKSCOPE_CONFIG'\n{portable_config(cfg).to_json()}\nRANKSCOPE_CONFIG"
