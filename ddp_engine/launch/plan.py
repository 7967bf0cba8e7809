"""Planning a launch: the config checked against this machine, the run folder made, and the
torchrun command line and environment that start one rank per device."""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path
from typing import Any

from ddp_engine.common import gpus
from ddp_engine.common.cluster import rendezvous_args
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_values import NODE_RANK_ENV
from ddp_engine.common.flight_recorder import recorder_env
from ddp_engine.common.inventory import NVML_TIMEOUT_S, gpu_inventory_within
from ddp_engine.common.machine_checks import (
    check_environment,
    check_steps_left,
    resolved_device,
)
from ddp_engine.common.rendezvous import (
    check_host_endpoint,
    check_local_addr,
    socket_interface_env,
)
from ddp_engine.common.run_dir import (
    CONFIG_FILE,
    new_run_dir,
    prepare_run_dir,
)


@dataclasses.dataclass
class Plan:
    """Everything a launch needs, resolved: the config, the devices and the command."""

    cfg: RunConfig
    device: str
    env: dict[str, str]
    """Variables set for the workers (on top of the launcher's own environment)."""
    torchrun_args: list[str]
    """torchrun's arguments (without the leading ``torchrun``)."""
    notes: list[str] = dataclasses.field(default_factory=list)
    """What the user should know about how the devices were resolved (``auto`` on CPU although
    NVML lists GPUs, and why)."""

    def command(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} torchrun {shlex.join(self.torchrun_args)}"


def plan_launch(cfg: RunConfig, *, create_run_dir: bool = True) -> Plan:
    """Resolve devices, process count and run folder; check everything a user could get wrong.

    Raises:
        ConfigError: bad input, naming the field, the value and what is allowed.
    """
    inventory = gpu_inventory_within(NVML_TIMEOUT_S)
    cpus = gpus.cpu_count()
    check_environment(cfg, inventory=inventory, cpu_count=cpus)
    if cfg.resume:
        from ddp_engine.rank import checkpoint  # imports torch: only when there is a file to check

        check_steps_left(cfg, checkpoint.recorded_step(cfg.resume))  # maps, reads no tensor
    usable = inventory.usable
    device = resolved_device(cfg, len(usable))
    notes = [f"training on CPU: {inventory.cpu_note()}"] if (
        device == "cpu" and cfg.device == "auto" and inventory.cpu_note()) else []
    changes: dict[str, Any] = {"device": device}
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    if device == "cuda":
        chosen = (cfg.gpus if cfg.gpus is not None else
                  [g.index for g in usable[:cfg.nproc or len(usable)]])
        changes.update(gpus=chosen, nproc=len(chosen))
        # By UUID: local rank i gets GPU chosen[i] whatever order CUDA numbers GPUs in.
        env["CUDA_VISIBLE_DEVICES"] = gpus.visible_devices_for(chosen, usable)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS",
                                                str(max(1, cpus // len(chosen))))
    else:
        nproc = cfg.nproc or min(2, cpus)
        changes.update(nproc=nproc, gpus=None)
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks must not grab a GPU
        env["OMP_NUM_THREADS"] = str(max(1, cpus // nproc))
    # A node other than 0 keeps its own ranks' logs and files apart from node 0's run folder
    # (the same folder, on a shared file system): in a node-K sub-folder, or a run folder
    # named for the node.
    node = f"node-{cfg.node_rank}" if cfg.node_rank else ""
    if create_run_dir:
        check_host_endpoint(cfg)  # node 0 hosts the rendezvous: its address, a free port
        check_local_addr(cfg)
        field, where = ("run_dir", cfg.run_dir) if cfg.run_dir else ("runs_dir", cfg.runs_dir)
        try:
            run_dir = prepare_run_dir(
                Path(cfg.run_dir, node).resolve() if cfg.run_dir else new_run_dir(
                    cfg.runs_dir, cfg.default_name() + (f"-{node}" if node else "")).resolve())
            probe = run_dir / ".rankscope-write-test"
            probe.write_bytes(b"")  # a read-only or full file system fails here, not in a rank
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"{field}: cannot write the run folder under {where!r}: "
                              f"{e.strerror or e}") from None
    elif cfg.run_dir:
        run_dir = Path(cfg.run_dir, node).resolve()
    else:
        run_dir = Path(cfg.runs_dir).resolve() / (
            f"{cfg.default_name()}-{node + '-' if node else ''}<timestamp>")
    changes["run_dir"] = str(run_dir)
    if device == "cuda":  # NCCL's flight recorder, dumped into ranks/ at a collective timeout
        env.update(recorder_env(run_dir))
    changes["resume"] = str(Path(cfg.resume).resolve()) if cfg.resume else None
    if cfg.script is not None:  # absolute: the ranks run in script_cwd, by default the
        # caller's folder as with torchrun (relative paths in the script's arguments mean what
        # they mean in the shell that started the launch)
        paths = cfg.with_script_paths()
        changes.update(script=paths.script, script_cwd=paths.script_cwd)
    resolved = dataclasses.replace(cfg, **changes)
    # Several nodes: ranks numbered by node rank, which needs torchrun's shared store. (One
    # node: torchrun's numbers; launch() drops a RANKSCOPE_NODE_RANK left in the shell.)
    if cfg.multi_node:
        env[NODE_RANK_ENV] = str(cfg.node_rank)
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "0"
        chosen_ifname = socket_interface_env(cfg, device)
        env.update(chosen_ifname)
        if chosen_ifname:
            notes.append(f"{' and '.join(sorted(chosen_ifname))}="
                         f"{next(iter(chosen_ifname.values()))}: the interface of --local-addr "
                         f"{cfg.local_addr} (set it yourself to choose another)")
    nodes = rendezvous_args(cfg)
    args = [*nodes, "--nproc-per-node", str(resolved.nproc),
            "--log-dir", str(run_dir / "logs"), "--redirects", "3",
            "--monitor-interval", "0.2", "--shutdown-timeout", str(cfg.shutdown_timeout_s),
            "-m", "ddp_engine.worker", "--config", str(run_dir / CONFIG_FILE)]
    return Plan(resolved, device, env, args, notes)
