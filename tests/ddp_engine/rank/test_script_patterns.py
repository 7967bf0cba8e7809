"""The script matrix (issue 28), the ways people train without a framework: each script, written
as its tutorial or its users write it, runs on CPU ranks under plain torchrun and the same file
under Rankscope. A script that succeeds under torchrun succeeds under Rankscope, with the same
outputs and the loss it logs, and stops at one agreed step however it is asked to. Lightning,
the Hugging Face Trainer and Accelerate: test_frameworks.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from ddp_engine.common.run_dir import read_rank_files, read_status
from tests.conftest import free_port, start_engine
from tests.ddp_engine.launch.test_launcher import events, metrics
from tests.ddp_engine.rank.script_matrix import (
    SCRIPTS,
    STOPS,
    assert_breakdown_within_step,
    assert_completed,
    assert_losses_match,
    assert_same_weights,
    assert_stopped_at_one_step,
    assert_sync_timed,
    assert_sync_timed_or_explained,
    load_weights,
    logged_losses,
    rank_losses,
    rankscope,
    read_json,
    reference,
    stop_run,
    torchrun,
    why,
)

pytestmark = pytest.mark.slow
__all__ = ["reference"]  # the module-scoped fixture, shared by this module's tests


def _watched(tmp_path: Path, reference, name: str, *args: str, nproc: int = 2,
             extra: tuple[str, ...] = (), timeout: float = 300) -> tuple[Path, Path, Path]:
    """SCRIPT ``--out DIR ARGS`` under plain torchrun (shared) and under Rankscope, which must
    end ``completed``: (plain torchrun's outputs, Rankscope's outputs, Rankscope's run folder).
    """
    script = SCRIPTS / f"{name}.py"
    plain = reference(script, *args, nproc=nproc)
    out, run_dir = tmp_path / "out", tmp_path / "run"
    proc = rankscope(run_dir, script, "--out", str(out), *args, nproc=nproc, extra=extra,
                     timeout=timeout)
    assert_completed(run_dir, proc)
    return plain, out, run_dir


def _same_run(plain: Path, out: Path, run_dir: Path) -> None:
    """The same final weights and logged losses as under torchrun, and Rankscope's loss of
    rank 0 the one the script logged at every step, with the sync timed."""
    assert_same_weights(load_weights(plain / "weights.pt"), load_weights(out / "weights.pt"))
    logged = logged_losses(out)
    assert logged == pytest.approx(logged_losses(plain), rel=1e-6)
    assert_losses_match(rank_losses(run_dir, 0), logged)
    assert_sync_timed_or_explained(run_dir)


def test_the_tutorial_with_dataloader_workers_trains_as_under_torchrun(tmp_path: Path,
                                                                       reference) -> None:
    plain, out, run_dir = _watched(tmp_path, reference, "workers_tutorial")
    _same_run(plain, out, run_dir)
    assert len(logged_losses(out)) == 32  # 1024 samples / 2 ranks / 32 a batch, 2 epochs
    assert [e["epoch"] for e in events(run_dir, "epoch_start")] == [0, 1]


@pytest.mark.parametrize("how", STOPS)
def test_the_tutorial_with_dataloader_workers_stops_at_one_step(tmp_path: Path,
                                                                how: str) -> None:
    """torchrun signals a rank's whole process group, DataLoader workers included: a stop must
    reach no worker, whichever way it is asked for."""
    run_dir, children = stop_run(tmp_path, SCRIPTS / "workers_tutorial.py", "--out",
                                 str(tmp_path / "out"), "--epochs", "100000", "--samples",
                                 "8192", how=how, processes=4)
    state = assert_stopped_at_one_step(run_dir, children)
    assert state["source"] == "script"
    torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(),
                        torch.nn.Linear(32, 2)).load_state_dict(state["model"])
    assert len(children) >= 4  # the launcher's ranks and their DataLoader workers were seen


def test_a_rank_0_epilogue_longer_than_the_side_groups_timeout_completes(
        tmp_path: Path, reference) -> None:
    """Rank 0 evaluates and saves for 8 s after training while rank 1 goes on to
    destroy_process_group. The script's process group times out after 5 s, and so Rankscope's
    side group (its timeout is the script's at the least, --dist-timeout-s here 5 s too): a
    collective of ours at the script's end would fail rank 1 before rank 0 got there."""
    plain, out, run_dir = _watched(tmp_path, reference, "rank0_epilogue", "--epilogue-s", "8",
                                   "--pg-timeout-s", "5", extra=("--dist-timeout-s", "5"))
    _same_run(plain, out, run_dir)
    assert {d["state"] for d in read_rank_files(run_dir).values()} == {"completed"}


def test_grad_scaler_skipped_steps_carry_no_loss_and_are_no_divergence(tmp_path: Path,
                                                                      reference) -> None:
    """bf16 autocast with a GradScaler; an infinite loss on rank 0 at iterations 5 and 11 makes
    the scaler skip those optimizer steps on both ranks (rank 1's loss was finite). The run
    completes (GradScaler recovers: no divergence); every iteration is a step, a skipped one
    shown as skipped with no loss, and every other step's loss is its own iteration's, nothing
    carried over from a skipped one."""
    plain, out, run_dir = _watched(tmp_path, reference, "gradscaler_skip")
    assert_same_weights(load_weights(plain / "weights.pt"), load_weights(out / "weights.pt"))
    for rank in (0, 1):
        logged = read_json(out, f"losses-rank{rank}.json")
        assert logged["skipped"] == [5, 11]
        losses = {int(k): v for k, v in logged["losses"].items()}
        shown = rank_losses(run_dir, rank)
        assert sorted(shown) == list(range(1, 21))
        assert_losses_match({s: v for s, v in shown.items() if s not in (5, 11)},
                            {s: v for s, v in losses.items() if s not in (5, 11)})
        assert shown[5] is None and shown[11] is None
        skipped = {m["step"]: m["ranks"][rank].get("skipped_steps") for m in metrics(run_dir)}
        assert {s for s, n in skipped.items() if n} == {5, 11}, skipped
    assert_sync_timed_or_explained(run_dir)


def test_ddp_over_a_sub_group_averages_over_that_group(tmp_path: Path, reference) -> None:
    """4 ranks, ``DDP(model, process_group=dp)`` over {0, 1} and {2, 3}: each group's weights
    as under torchrun (averaged over WORLD they would be one set for all four). Rankscope runs
    them as two nodes of 2 CPU ranks on this machine (a node's CPU ranks are limited to its
    cores); plain torchrun as one node of 4."""
    script = SCRIPTS / "subgroup_ddp.py"
    plain = reference(script, nproc=4)
    out, run_dir, port = tmp_path / "out", tmp_path / "run", free_port()
    procs = [start_engine("launch", "--script", str(script), "--nproc", "2", "--nnodes", "2",
                          "--node-rank", str(k), "--rdzv-endpoint", f"127.0.0.1:{port}",
                          "--run-dir", str(run_dir), "--log-every", "1", "--", "--out",
                          str(out), log=tmp_path / f"node-{k}.log") for k in (0, 1)]
    try:
        codes = [p.wait(timeout=240) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run had not ended after 240 s\n{why(run_dir)}")
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert codes == [0, 0] and read_status(run_dir)["state"] == "completed", (
        why(run_dir) + (tmp_path / "node-1.log").read_text()[-1500:])
    for k in (0, 1):
        name = f"weights-group{k}.pt"
        assert_same_weights(load_weights(plain / name), load_weights(out / name), where=name)
    g0, g1 = load_weights(out / "weights-group0.pt"), load_weights(out / "weights-group1.pt")
    assert (g0["weight"] - g1["weight"]).abs().max() > 0.1  # two groups, two models
    for rank in range(4):
        assert_losses_match(rank_losses(run_dir, rank),
                            logged_losses(out, f"losses-rank{rank}.json"))
    assert_sync_timed(run_dir)  # DDP's reducer timers, over DDP's own group


@pytest.mark.parametrize("hook", ["fp16-builtin", "fp16", "own"])
def test_a_script_with_a_comm_hook_trains_as_under_torchrun_with_its_sync_timed(
        tmp_path: Path, reference, hook: str) -> None:
    """DDP's built-in C++ FP16_COMPRESS hook, torch's Python fp16 hook, a hook of the script's
    own: the same weights and losses as under plain torchrun, and DDP's reducer timers time
    the sync of every report (no hook of Rankscope's wraps or replaces the script's)."""
    plain, out, run_dir = _watched(tmp_path, reference, "comm_hooks", "--hook", hook)
    _same_run(plain, out, run_dir)
    assert_sync_timed(run_dir)
    assert events(run_dir, "run_start")[0]["sync_timing"] == "reducer"


def test_staged_training_with_a_new_ddp_and_optimizer_is_watched_throughout(
        tmp_path: Path, reference) -> None:
    """Stage 1 (8 steps, frozen backbone, SGD), stage 2 (8 steps, a new DDP and Adam): 16
    steps counted, each with its loss; and ``--max-steps`` is reached in stage 2."""
    plain, out, run_dir = _watched(tmp_path, reference, "staged")
    _same_run(plain, out, run_dir)
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, 17))
    capped = tmp_path / "capped"
    proc = rankscope(capped, SCRIPTS / "staged.py", "--out", str(tmp_path / "capped-out"),
                     extra=("--max-steps", "11"))
    assert_completed(capped, proc)
    assert {d["step"] for d in read_rank_files(capped).values()} == {11}
    assert events(capped, "completed")[0]["step"] == 11


def _module_states(state: Any, keys: set[str]) -> list[dict]:
    """Every dict in a (nested) checkpoint whose keys are exactly ``keys``."""
    if isinstance(state, dict):
        own = [state] if set(state) == keys else []
        return own + [d for v in state.values() for d in _module_states(v, keys)]
    if isinstance(state, (list, tuple)):
        return [d for v in state for d in _module_states(v, keys)]
    return []


def _optimizer_states(state: Any) -> set[tuple[tuple[int, ...], ...]]:
    """Every optimizer state in a (nested) checkpoint, told apart by the shapes of the
    parameters it keeps state for (one held twice, under two names, counts once)."""
    if isinstance(state, dict):
        own = set()
        if {"state", "param_groups"} <= set(state):
            own.add(tuple(sorted(tuple(s["exp_avg"].shape) for s in state["state"].values())))
        return own.union(*(_optimizer_states(v) for v in state.values()))
    if isinstance(state, (list, tuple)):
        return set().union(*(_optimizer_states(v) for v in state))
    return set()


def test_a_gan_counts_each_iteration_once_and_shows_its_loss(tmp_path: Path,
                                                             reference) -> None:
    """Two DDP modules, two optimizers: one step per iteration, whose loss is that iteration's
    (the discriminator's plus the generator's: both backward() calls of the iteration)."""
    plain, out, run_dir = _watched(tmp_path, reference, "gan")
    assert_same_weights(load_weights(plain / "weights.pt"), load_weights(out / "weights.pt"))
    logged = logged_losses(out)
    assert len(logged) == 15
    assert_losses_match(rank_losses(run_dir, 0), {s: d + g for s, (d, g) in logged.items()})
    assert_sync_timed_or_explained(run_dir)


def test_a_gans_stop_checkpoint_holds_both_models_and_both_optimizers(tmp_path: Path) -> None:
    run_dir, children = stop_run(tmp_path, SCRIPTS / "gan.py", "--out", str(tmp_path / "out"),
                                 "--iterations", "0", how="socket")
    state = assert_stopped_at_one_step(run_dir, children)
    sequential = {"0.weight", "0.bias", "2.weight", "2.bias"}  # G's and D's keys alike
    first = {tuple(d["0.weight"].shape) for d in _module_states(state, sequential)}
    assert first == {(16, 4), (16, 2)}, first  # G's first layer and D's
    assert len(_optimizer_states(state)) == 2, sorted(state)  # G's Adam and D's


def test_init_process_group_with_no_backend(tmp_path: Path, reference) -> None:
    plain, out, run_dir = _watched(tmp_path, reference, "no_backend")
    _same_run(plain, out, run_dir)
    assert len(events(run_dir, "run_start")) == 1


def test_lbfgs_closure_steps_show_the_steps_loss_and_count_once(tmp_path: Path,
                                                                reference) -> None:
    """LBFGS evaluates its closure (forward and backward) up to 4 times inside one
    ``optimizer.step()``: the loss shown is the one the step returned, and the breakdown does
    not count the closure's forward and backward on top of the optimizer's time. The closure
    works 20 ms before its forward: in the optimizer's time, and in the step's (the first
    report's interval starts as the first step does, not at its first forward)."""
    plain, out, run_dir = _watched(tmp_path, reference, "lbfgs", "--closure-work-s", "0.02")
    _same_run(plain, out, run_dir)
    assert_breakdown_within_step(run_dir)


def test_a_script_with_its_own_sigterm_handler_trains_as_under_torchrun(tmp_path: Path,
                                                                        reference) -> None:
    plain, out, run_dir = _watched(tmp_path, reference, "own_sigterm")
    _same_run(plain, out, run_dir)
    assert not (out / "preempted.pt").exists()
    said = [e for e in events(run_dir, "warning") if e.get("cause") == "signal_handler"]
    assert said and said[0]["signal"] == "SIGTERM", said  # chained, and said to the viewers


def test_a_script_with_its_own_sigterm_handler_stops_at_one_step(tmp_path: Path) -> None:
    """SIGTERM to the launcher is Rankscope's agreed stop, whatever handler the script set."""
    run_dir, children = stop_run(tmp_path, SCRIPTS / "own_sigterm.py", "--out",
                                 str(tmp_path / "out"), "--steps", "0", how="sigterm")
    state = assert_stopped_at_one_step(run_dir, children)
    assert state["source"] == "script"


def test_torch_compile_sees_no_graph_break_of_ours(tmp_path: Path, reference) -> None:
    """``torch.compile(DDP(model))``: dynamo breaks the graph where it does under plain torchrun
    (DDP's own breaks), and nowhere else; its forward is still watched (samples/s, the
    forward's time), from the compiled wrapper."""
    plain, out, run_dir = _watched(tmp_path, reference, "compiled")
    _same_run(plain, out, run_dir)
    assert read_json(out, "graph_breaks.json") == read_json(plain, "graph_breaks.json")
    later = metrics(run_dir)[2:]  # past the compiling steps
    assert later and all(r["samples_per_s"] and r["forward_s"] for m in later
                         for r in m["ranks"]), later


def test_ddp_join_with_uneven_inputs_completes(tmp_path: Path, reference) -> None:
    """``Join([model])``: rank 0 has 8 batches, rank 1 has 11; rank 0 shadows rank 1's last
    three all-reduces, then both leave."""
    plain, out, run_dir = _watched(tmp_path, reference, "join_uneven", timeout=150)
    assert_same_weights(load_weights(plain / "weights.pt"), load_weights(out / "weights.pt"))
    logged = logged_losses(out)
    assert len(logged) == 8 and logged == pytest.approx(logged_losses(plain), rel=1e-6)
    shown = rank_losses(run_dir, 0)
    for step, loss in logged.items():  # rank 0's 8 steps, each with its loss
        assert shown.get(step) == pytest.approx(loss, rel=1e-5), (step, shown)


def test_relative_paths_mean_the_callers_folder(tmp_path: Path) -> None:
    """``--train-file data/train.csv --out outputs`` from a project folder, as with torchrun:
    read from and written to that folder, nothing beside the script."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 6, generator=g)
    rows = torch.cat([x, x[:, :2].sum(1, keepdim=True)], 1)
    projects = []
    for name in ("plain", "watched"):
        project = tmp_path / name
        (project / "data").mkdir(parents=True)
        (project / "data" / "train.csv").write_text(
            "".join(",".join(f"{v:.6f}" for v in row) + "\n" for row in rows.tolist()))
        projects.append(project)
    args = ("--train-file", "data/train.csv", "--out", "outputs")
    script = SCRIPTS / "relative_paths.py"
    torchrun(script, *args, cwd=projects[0])
    run_dir = tmp_path / "run"
    proc = rankscope(run_dir, script, *args, cwd=projects[1])
    beside_script = (SCRIPTS / "outputs").exists()
    shutil.rmtree(SCRIPTS / "outputs", ignore_errors=True)
    assert not beside_script, "outputs were written beside the script"
    assert_completed(run_dir, proc)
    _same_run(projects[0] / "outputs", projects[1] / "outputs", run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["script_cwd"] == str(projects[1])  # absolute, kept for a resume
