"""Taking a config to a cluster: torchrun's rendezvous arguments (for the launcher's plan), and
scripts that start Rankscope's launcher on each node or under SLURM (standard library only: the
app builds them without torch).

Every node runs ``python -m ddp_engine launch`` with the same config file and its own node
flags; the launcher runs torchrun and writes a full run folder (config.json, status.json, logs,
heartbeats) on each node. The config a script writes holds nothing about nodes (see
``NODE_FIELDS``): only the command line says them, so the two cannot disagree. The nodes meet
through torchrun's c10d rendezvous at node 0's address.

The scripts name no path of the machine that wrote them but a script run's file and working
folder (absolute, on a file system every node sees): the interpreter is ``$RANKSCOPE_PYTHON``
(default ``python3``), which must have Rankscope installed.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import shlex

from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_values import join_ints

DEFAULT_RDZV_PORT = 29400
CONFIG_NAME = "rankscope-config.json"
"""The config file a node script writes in its working folder and starts the launcher with."""
PYTHON_ENV = "RANKSCOPE_PYTHON"
"""The variable naming the interpreter the scripts run (default ``python3``)."""
NODE_FIELDS = ("nnodes", "node_rank", "rdzv_endpoint", "rdzv_id", "local_addr")
"""Config keys that say where the nodes meet or differ per node: a script's command line
gives them, its config file never does."""
_NOT_PORTABLE = (*NODE_FIELDS, "run_dir", "dry_run")


def rendezvous_args(cfg: RunConfig) -> list[str]:
    """torchrun's node arguments: c10d rendezvous for a multi-node config, else standalone.

    Node 0 hosts the rendezvous store, said outright (``--rdzv-conf is_host=1``, 0 on the
    others): left to itself torchrun makes a node the host only when the endpoint matches its
    host name or one of the addresses that name resolves to, so an endpoint on a second network
    (InfiniBand, a cluster network, a private address) has no host and every node fails to
    connect (issue 32). The nodes wait for each other ``dist_timeout_s`` (join_timeout), as
    long as a collective waits for a dead peer, not torchrun's 600 s."""
    if not cfg.multi_node:
        return ["--standalone", "--nnodes", "1"]
    assert cfg.rdzv_endpoint is not None  # RunConfig.validate requires it
    return ["--nnodes", str(cfg.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint",
            cfg.rdzv_endpoint, "--rdzv-id", cfg.rendezvous_id(),
            "--rdzv-conf", f"is_host={1 if cfg.node_rank == 0 else 0},"
            f"join_timeout={max(1, round(cfg.dist_timeout_s))}",
            *(["--local-addr", cfg.local_addr.strip()] if cfg.local_addr else [])]


def portable_config(cfg: RunConfig) -> dict[str, object]:
    """The config file every node reads: ``cfg`` without ``NODE_FIELDS`` (each node's command
    line gives them), without a fixed run folder (each node's launcher names its own under
    runs_dir) and not a dry run. A script run's file and working folder are absolute (the
    working folder by default the one these scripts are made in, as torchrun's would be): a
    node started from another folder runs the same file in the same folder."""
    return {k: v for k, v in cfg.with_script_paths().to_dict().items()
            if k not in _NOT_PORTABLE}


def node_flags(cfg: RunConfig, node_rank: int) -> list[str]:
    """The launcher's node flags for node ``node_rank`` of ``cfg`` (unquoted).

    ``--local-addr`` (the form's: this machine's address) goes to node 0's flags only: the form
    makes this machine node 0, and every other node has an address of its own.

    Raises:
        ConfigError: ``cfg`` is for one node, or ``node_rank`` is not one of its nodes.
    """
    if not cfg.multi_node:
        raise ConfigError(f"nnodes: a node script is for a run of 2 or more nodes, got "
                          f"{cfg.nnodes}")
    node = dataclasses.replace(cfg, node_rank=node_rank)  # validates node_rank
    flags = ["--nnodes", str(node.nnodes), "--node-rank", str(node.node_rank),
             "--rdzv-endpoint", str(node.rdzv_endpoint), "--rdzv-id", node.rendezvous_id()]
    if node.local_addr and node_rank == 0:
        flags += ["--local-addr", node.local_addr.strip()]
    return flags


def node_command(cfg: RunConfig, node_rank: int, config_path: str = CONFIG_NAME) -> str:
    """The line that starts node ``node_rank`` of ``cfg``: Rankscope's launcher, run by
    ``$PYTHON``, with the config file and the node's flags."""
    return _launch(shlex.quote(config_path), [shlex.quote(a) for a in node_flags(cfg, node_rank)])


def node_script(cfg: RunConfig, node_rank: int) -> str:
    """A shell script for one node: writes the config, then runs :func:`node_command`.

    Raises:
        ConfigError: as :func:`node_flags`.
    """
    command = node_command(cfg, node_rank)
    return "\n".join([
        "#!/bin/bash",
        f"# Rankscope: node {node_rank} of {cfg.nnodes} ({cfg.default_name()}).",
        "# Start one of these on each node (any order); node 0's address is the rendezvous",
        "# endpoint. Each node's launcher writes a run folder under runs_dir; node 0's has the",
        "# metrics, checkpoints and live telemetry of every rank. Arguments given to this",
        "# script go to the launcher: on a machine with several network interfaces, give it",
        "# this machine's address as the others reach it, e.g. --local-addr 10.0.0.2.",
        *_python_lines(),
        _write_config(portable_config(cfg), CONFIG_NAME),
        command + ' "$@"',
        ""])


def slurm_script(cfg: RunConfig, port: int = DEFAULT_RDZV_PORT) -> str:
    """An sbatch script for ``cfg``: one task per node, each ``srun`` task Rankscope's launcher,
    meeting at the first node of the allocation; the node rank is SLURM_NODEID.

    GPUs the config names by index are not named in the script: each node uses the GPUs SLURM
    gives the job (as many as were chosen).
    """
    chosen = cfg.gpus
    if chosen is not None:
        cfg = dataclasses.replace(cfg, gpus=None, nproc=len(chosen), device="cuda")
    gpu = cfg.device != "cpu"
    header = [
        "#!/bin/bash",
        f"#SBATCH --job-name={cfg.default_name()}",
        f"#SBATCH --nodes={cfg.nnodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if gpu and cfg.nproc is not None:
        header.append(f"#SBATCH --gpus-per-node={cfg.nproc}")
    elif gpu:
        header.append("# (ask for the GPUs as your cluster wants, e.g. #SBATCH --gpus-per-node=8:"
                      " the launcher starts one process per GPU it sees)")
    procs = (f"{cfg.nproc} processes" if cfg.nproc is not None
             else "one process per GPU" if gpu else "2 processes")
    run_dir = shlex.quote(posixpath.join(cfg.runs_dir, f"{cfg.default_name()}-"))
    header += [
        "#SBATCH --output=rankscope-%j.out",
        "",
        f"# Rankscope: {cfg.default_name()} on {cfg.nnodes} nodes x {procs}.",
        "# Each node's launcher is a task of srun. Ranks are numbered by node (node k holds",
        "# ranks k*P .. k*P+P-1); rank 0, with the metrics, checkpoints and live telemetry, is",
        "# on the first node of the allocation. The run folder is the job's ($run_dir; node",
        "# k's launcher files in its node-k/), on a file system every node sees.",
        *([f"# GPUs {join_ints(chosen)} were chosen where this script was written; here",
           f"# each node uses the {len(chosen)} that SLURM gives the job."] if chosen else []),
        *_python_lines(),
        # sed reads every line (head -n 1 would not, and with pipefail a scontrol that writes
        # after head left ends the job with SIGPIPE)
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        'config="$PWD/rankscope-$SLURM_JOB_ID.json"  # on a file system every node sees',
        f'run_dir={run_dir}"$SLURM_JOB_ID"',
        _write_config(portable_config(cfg), '"$config"'),
    ]
    # $SLURM_NODEID differs per node, so the command is single-quoted for the shell srun
    # starts on each node; the interpreter, the head node, the config and the run folder go
    # in its environment.
    launch = _launch('"$config"', [
        "--nnodes", '"$SLURM_NNODES"', "--node-rank", '"$SLURM_NODEID"', "--rdzv-endpoint",
        f'"$head:{port}"', "--rdzv-id", '"rankscope-$SLURM_JOB_ID"', "--run-dir", '"$run_dir"'])
    body = ["export PYTHON head config run_dir",
            f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(launch)}", ""]
    return "\n".join(header + body)


def _launch(config_path: str, flags: list[str]) -> str:
    """The line that runs the launcher; every argument is already a shell word."""
    return " ".join(['exec "$PYTHON" -m ddp_engine launch --config', config_path, *flags])


def _python_lines() -> list[str]:
    """Strict mode, ``$PYTHON`` from ``$RANKSCOPE_PYTHON``, and a clear error where it cannot
    import Rankscope."""
    return [
        f"# Rankscope must be installed for ${PYTHON_ENV} (default python3) on every node:",
        "# pip install the project there, or point it at the python of a virtualenv that has",
        f"# it, e.g. {PYTHON_ENV}=$HOME/rankscope/.venv/bin/python.",
        "set -euo pipefail",
        f"PYTHON=${{{PYTHON_ENV}:-python3}}",
        'if ! "$PYTHON" -c "import ddp_engine" 2>/dev/null; then',
        f'    echo "error: {PYTHON_ENV}: $PYTHON cannot import ddp_engine; pip install" \\',
        f'        "Rankscope for it, or set {PYTHON_ENV} to the python of a virtualenv" \\',
        '        "that has it" >&2',
        "    exit 2",
        "fi",
    ]


def _write_config(config: dict[str, object], path: str) -> str:
    """Shell lines that write ``config`` (as every node reads it) to ``path``."""
    text = json.dumps(config, indent=2, sort_keys=True)
    return f"cat > {path} <<'RANKSCOPE_CONFIG'\n{text}\nRANKSCOPE_CONFIG"
