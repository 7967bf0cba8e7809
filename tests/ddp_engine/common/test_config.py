"""RunConfig: validation messages, file round trips, flags, and checks against the machine."""

from __future__ import annotations

import argparse
import dataclasses
import zipfile
from pathlib import Path

import pytest

from ddp_engine.common.cli_flags import add_config_arguments, config_from_namespace
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.config_files import load_config_file
from ddp_engine.common.config_values import split_endpoint
from ddp_engine.common.machine_checks import check_environment
from ddp_engine.launch.cli import split_script_args


@pytest.mark.parametrize(("changes", "message"), [
    ({"batch_size": 0}, r"batch_size must be >= 1, got 0"),
    ({"nproc": 0}, r"nproc must be >= 1, got 0"),
    ({"max_steps": -5}, r"max_steps must be >= 1, got -5"),
    ({"epochs": 0}, r"epochs must be >= 1, got 0"),
    ({"grad_accum": 0}, r"grad_accum must be >= 1, got 0"),
    ({"log_every": -1}, r"log_every must be >= 0, got -1"),
    ({"lr": 0.0}, r"lr must be a finite number > 0, got 0.0"),
    ({"lr": float("nan")}, r"lr must be a finite number > 0, got nan"),
    ({"model": "resnet50"}, r"model: unknown model 'resnet50'; known: mlp, convnet, resnet18, "
                            r"gpt-tiny"),
    ({"dataset": "imagenet"}, r"dataset: unknown dataset 'imagenet'; known: synthetic, digits"),
    ({"dataset": "text:"}, r"dataset: 'text:' needs a path"),
    ({"loss": "hinge"}, r"loss: unknown loss 'hinge'; known: cross_entropy, mse"),
    ({"optimizer": "lamb"}, r"optimizer: 'lamb' is not allowed; choose one of sgd, adam, adamw"),
    ({"precision": "fp8"}, r"precision: 'fp8' is not allowed; choose one of fp32, bf16, fp16"),
    ({"precision": "fp16", "device": "cpu"}, r"precision: fp16 needs CUDA"),
    ({"gpus": []}, r"gpus must list at least one GPU index"),
    ({"gpus": [0, 0]}, r"gpus: each GPU may be listed once, got 0,0"),
    ({"gpus": [0, 1], "nproc": 3}, r"nproc must equal the number of GPUs in gpus \(2: 0,1\), "
                                   r"got 3"),
    ({"gpus": [0], "device": "cpu"}, r"gpus: 0 given with device 'cpu'"),
    ({"model": "gpt-tiny"}, r"gpt-tiny .* needs dataset text:PATH, got dataset 'synthetic'"),
    ({"name": "my run"}, r"name: 'my run' is not allowed"),
    ({"batch_size": "32"}, r"batch_size must be an integer, got '32'"),
    ({"find_unused_parameters": 1}, r"find_unused_parameters must be true or false, got 1"),
    ({"batch_size": True}, r"batch_size must be an integer, got True"),
    ({"lr": "fast"}, r"lr must be a number, got 'fast'"),
    ({"max_steps": 2.5}, r"max_steps must be an integer or unset, got 2.5"),
    ({"nnodes": 0}, r"nnodes must be >= 1, got 0"),
    ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"},
     r"node_rank must be between 0 and nnodes - 1 \(1\), got 2"),
    ({"node_rank": -1}, r"node_rank must be between 0 and nnodes - 1 \(0\), got -1"),
    ({"nnodes": 2}, r"rdzv_endpoint: nnodes is 2, so every node needs the rendezvous address, "
                    r"HOST:PORT"),
    ({"nnodes": 2, "rdzv_endpoint": "node0"}, r"rdzv_endpoint must be HOST:PORT with a port "
                                              r"1-65535 .*, got 'node0'"),
    ({"rdzv_endpoint": "node0:70000"}, r"rdzv_endpoint must be HOST:PORT .*got 'node0:70000'"),
    ({"rdzv_endpoint": ":29400"}, r"rdzv_endpoint must be HOST:PORT .*got ':29400'"),
    ({"rdzv_id": "my run"}, r"rdzv_id: 'my run' is not allowed"),
    ({"local_addr": "node 0"}, r"local_addr must be a host name or IP address, got 'node 0'"),
    ({"monitor_host": " "}, r"monitor_host must be a host name or IP address, got ' '"),
    ({"monitor_host": "node 0"}, r"monitor_host must be a host name or IP address, got 'node 0'"),
    ({"monitor_host": "::"}, r"monitor_host: IPv4 only, got '::': give 127\.0\.0\.1 "
     r"\(this machine only\), one of its IPv4 addresses or 0\.0\.0\.0 \(all of them\)$"),
    ({"loss_spike_mads": -1}, r"loss_spike_mads must be a finite number >= 0, got -1.0"),
    ({"loss_spike_mads": float("inf")}, r"loss_spike_mads must be a finite number >= 0, got inf"),
    ({"loss_spike_mads": "high"}, r"loss_spike_mads must be a number, got 'high'"),
    ({"loss_spike_reports": 0}, r"loss_spike_reports must be >= 1, got 0"),
    ({"lr_schedule": "exp"}, r"lr_schedule: 'exp' is not allowed; choose one of constant, cosine"),
    ({"warmup_steps": -1}, r"warmup_steps must be >= 0, got -1"),
    ({"script": " "}, r"script must not be empty"),
    ({"script": "t.py", "model": "resnet18"}, r"script: a script run trains what the script "
                                              r"builds; drop model \(got 'resnet18'\)"),
    ({"script": "t.py", "dataset": "digits"}, r"script: .*drop dataset \(got 'digits'\)"),
    ({"script": "t.py", "lr": 0.5}, r"script: lr = 0.5 applies to the built-in loop only"),
    ({"script": "t.py", "resume": "x.pt"}, r"script: resume = 'x.pt' applies to the built-in"),
    ({"script": "t.py", "script_args": ["--a", 1]}, r"script_args must be a list of strings"),
    ({"script": "t.py", "script_cwd": ""}, r"script_cwd must not be empty"),
])
def test_bad_values_name_field_value_and_what_is_allowed(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunConfig(**changes)


def test_a_multi_node_config_and_its_rendezvous() -> None:
    cfg = RunConfig(nnodes=2, node_rank=1, rdzv_endpoint="[fe80::1]:29400", name="big")
    assert cfg.multi_node and split_endpoint("x", cfg.rdzv_endpoint) == ("fe80::1", 29400)
    assert cfg.rendezvous_id() == "rankscope-big"  # every node derives the same id
    assert RunConfig(rdzv_id="job-7").rendezvous_id() == "job-7"
    assert split_endpoint("x", "10.0.0.1:29400") == ("10.0.0.1", 29400)
    assert not RunConfig().multi_node


def test_defaults_are_valid_and_ints_promote_to_float() -> None:
    cfg = RunConfig(lr=1, momentum=0, grad_clip=2)
    assert isinstance(cfg.lr, float) and isinstance(cfg.momentum, float)
    assert isinstance(cfg.grad_clip, float) and cfg.grad_clip == 2.0
    assert cfg.total_epochs == 1
    assert RunConfig(max_steps=10).total_epochs is None
    assert RunConfig(max_steps=10, epochs=3).total_epochs == 3


def test_toml_and_json_round_trip(tmp_path: Path) -> None:
    cfg = RunConfig(model="examples/custom.py:build", model_args={"hidden": 64, "act": "relu"},
                    dataset="synthetic", dataset_args={"input_shape": [1, 8, 8]}, gpus=None,
                    max_steps=50, lr=0.01, grad_clip=1.0, name="demo_1", keep_step_checkpoints=True)
    toml_file = tmp_path / "run.toml"
    toml_file.write_text(cfg.to_toml())
    assert RunConfig.from_dict(load_config_file(toml_file)) == cfg
    json_file = tmp_path / "run.json"
    json_file.write_text(cfg.to_json())
    assert RunConfig.from_dict(load_config_file(json_file)) == cfg


def test_toml_holds_any_character_beyond_the_basic_multilingual_plane(tmp_path: Path) -> None:
    # Written by hand, "runs/😀" became "runs/\ud83d\ude00": a JSON escape TOML refuses.
    cfg = RunConfig(runs_dir="runs/😀", dataset="synthetic",
                    dataset_args={"note": "𝔡𝔞𝔱𝔞 \"quoted\" \\ back", "seed": 1})
    toml_file = tmp_path / "run.toml"
    toml_file.write_text(cfg.to_toml(), encoding="utf-8")
    assert RunConfig.from_dict(load_config_file(toml_file)) == cfg


def test_a_model_argument_named_name_is_refused_by_the_toml_writer() -> None:
    cfg = RunConfig(model="examples/custom_model.py:build", model_args={"name": "x"})
    with pytest.raises(ConfigError, match=r"model_args: the key 'name' cannot be written"):
        cfg.to_toml()


def test_model_table_gives_name_and_keyword_arguments(tmp_path: Path) -> None:
    f = tmp_path / "run.toml"
    f.write_text('max_steps = 5\n[model]\nname = "mlp"\nhidden = 32\ndepth = 1\n')
    cfg = RunConfig.from_dict(load_config_file(f))
    assert cfg.model == "mlp" and cfg.model_args == {"hidden": 32, "depth": 1}
    f.write_text("[model]\nhidden = 32\n")
    with pytest.raises(ConfigError, match=r"table \[model\] needs a name key"):
        RunConfig.from_dict(load_config_file(f))


def test_config_file_errors_name_the_line_or_key(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text('model = "mlp"\nbatch_size = = 3\n')
    with pytest.raises(ConfigError, match=r"does not parse as TOML: .*line 2"):
        load_config_file(f)
    f.write_text("batch_sise = 3\n")
    with pytest.raises(ConfigError, match=r"unknown key 'batch_sise'; allowed keys: .*batch_size"):
        RunConfig.from_dict(load_config_file(f))
    j = tmp_path / "bad.json"
    j.write_text('{"model": "mlp",\n "lr": }')
    with pytest.raises(ConfigError, match=r"does not parse as JSON: .*line 2"):
        load_config_file(j)
    with pytest.raises(ConfigError, match=r"config: file .*missing.toml' does not exist"):
        load_config_file(tmp_path / "missing.toml")


def _parse(argv: list[str]) -> RunConfig:
    """As ``python -m ddp_engine launch ARGV`` reads its flags (the script's after ``--``)."""
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    engine, script_args = split_script_args(["launch", *argv])
    ns = parser.parse_args(engine[1:])
    if script_args is not None:
        ns.script_args = script_args
    return config_from_namespace(ns)


def test_every_field_has_a_flag_and_to_argv_round_trips() -> None:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    flags = {a.dest for a in parser._actions}
    assert {f.name for f in dataclasses.fields(RunConfig)} - {"script_args"} <= flags
    script = RunConfig(script="t.py", script_args=["--x", "1", "--"], script_cwd="/w",
                       max_steps=9)
    assert _parse(script.to_argv()) == script  # script_args: after "--"
    cfg = RunConfig(model="mlp", model_args={"hidden": 16}, nproc=3, max_steps=7, lr=0.5,
                    find_unused_parameters=True, dataset_args={"num_samples": 100},
                    resume="x.pt", run_dir="/tmp/x", loss_spike_mads=0.0, loss_spike_reports=5)
    assert _parse(cfg.to_argv()) == cfg


def test_flags_override_the_config_file(tmp_path: Path) -> None:
    f = tmp_path / "run.toml"
    f.write_text('max_steps = 5\nbatch_size = 8\n[model]\nname = "mlp"\nhidden = 32\n')
    cfg = _parse(["--config", str(f), "--batch-size", "4", "--model-arg", "depth=3"])
    assert (cfg.max_steps, cfg.batch_size) == (5, 4)
    assert cfg.model_args == {"hidden": 32, "depth": 3}


def test_environment_checks(tmp_path: Path) -> None:
    ok = {"gpu_count": 0, "cpu_count": 2}
    check_environment(RunConfig(nproc=2), **ok)
    with pytest.raises(ConfigError, match=r"nproc must be between 1 and the number of CPU cores "
                                          r"\(2\), got 3"):
        check_environment(RunConfig(nproc=3), **ok)
    with pytest.raises(ConfigError, match=r"nproc must be between 1 and the number of GPUs "
                                          r"\(2\), got 4"):
        check_environment(RunConfig(nproc=4), gpu_count=2, cpu_count=64)
    with pytest.raises(ConfigError, match=r"gpus: GPU 2 does not exist; allowed: none: no GPU"):
        check_environment(RunConfig(gpus=[2]), **ok)
    with pytest.raises(ConfigError, match=r"gpus: GPU 5 does not exist; allowed: 0, 1, 2, 3$"):
        check_environment(RunConfig(gpus=[0, 5]), gpu_count=4, cpu_count=8)
    with pytest.raises(ConfigError, match=r"device: 'cuda' asked for but no GPU is visible"):
        check_environment(RunConfig(device="cuda"), **ok)
    with pytest.raises(ConfigError, match=r"precision: fp16 needs CUDA"):
        check_environment(RunConfig(precision="fp16"), **ok)
    with pytest.raises(ConfigError, match=r"dataset: path '/nope/a.txt' of 'text:/nope/a.txt' "
                                          r"does not exist"):
        check_environment(RunConfig(model="gpt-tiny", dataset="text:/nope/a.txt"), **ok)
    with pytest.raises(ConfigError, match=r"dataset: path '/nope' of 'imagefolder:/nope'"):
        check_environment(RunConfig(dataset="imagefolder:/nope"), **ok)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match=r"run_dir: '.*file' is a file, not a folder"):
        check_environment(RunConfig(run_dir=str(a_file)), **ok)
    with pytest.raises(ConfigError, match=r"imagefolder:.*must name a folder"):
        check_environment(RunConfig(dataset=f"imagefolder:{a_file}"), **ok)


def test_plugin_checks_read_the_source_without_running_it(tmp_path: Path) -> None:
    ok = {"gpu_count": 0, "cpu_count": 2}
    plugin = tmp_path / "mine.py"
    plugin.write_text("raise SystemExit('never run')\ndef build(**kw):\n    pass\n")
    check_environment(RunConfig(model=f"{plugin}:build"), **ok)
    with pytest.raises(ConfigError, match=r"model: '.*mine.py' has no function 'make' \(it "
                                          r"defines: build\)"):
        check_environment(RunConfig(model=f"{plugin}:make"), **ok)
    with pytest.raises(ConfigError, match=r"model: plugin file '.*gone.py' of .* does not exist"):
        check_environment(RunConfig(model=f"{tmp_path}/gone.py:build"), **ok)
    with pytest.raises(ConfigError, match=r"dataset: module 'no_such_pkg.data' of .* cannot be "
                                          r"found"):
        check_environment(RunConfig(dataset="no_such_pkg.data:make"), **ok)
    check_environment(RunConfig(loss="tests.ddp_engine.rank.plugins.faulty:raise_on_rank1"), **ok)
    plugin.write_text("def build(:\n")
    with pytest.raises(ConfigError, match=r"has a syntax error at line 1"):
        check_environment(RunConfig(model=f"{plugin}:build"), **ok)


def test_resume_file_checks(tmp_path: Path) -> None:
    ok = {"gpu_count": 0, "cpu_count": 2}
    with pytest.raises(ConfigError, match=r"resume: checkpoint '.*missing.pt' does not exist"):
        check_environment(RunConfig(resume=str(tmp_path / "missing.pt")), **ok)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"resume: '.*junk.pt' is not a Rankscope checkpoint"):
        check_environment(RunConfig(resume=str(junk)), **ok)
    z = tmp_path / "other.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("a.txt", "x")
    with pytest.raises(ConfigError, match=r"is not a Rankscope checkpoint"):
        check_environment(RunConfig(resume=str(z)), **ok)


def test_a_batch_larger_than_a_builtin_dataset_is_refused_before_the_launch() -> None:
    ok = {"gpu_count": 0, "cpu_count": 4}
    with pytest.raises(ConfigError, match=r"^batch_size: 1000 x grad_accum 1 x nproc 2 samples "
                                          r"per step exceed the 1438 training samples; lower "
                                          r"batch_size, grad_accum or nproc$"):
        check_environment(RunConfig(dataset="digits", batch_size=1000, device="cpu"), **ok)
    check_environment(RunConfig(dataset="digits", batch_size=700, device="cpu"), **ok)
    with pytest.raises(ConfigError, match=r"exceed the 100 training samples"):
        check_environment(RunConfig(dataset="synthetic", dataset_args={"num_samples": 100},
                                    batch_size=16, grad_accum=4, nproc=2, device="cpu"), **ok)



def test_a_script_config_round_trips_and_names_its_run_after_the_script(tmp_path: Path) -> None:
    cfg = RunConfig(script="jobs/my train.py", script_args=["--lr", "0.1", "a b", "--"],
                    script_cwd="/data", max_steps=100, nproc=2)
    assert cfg.default_name() == "my_train"
    toml_file = tmp_path / "run.toml"
    toml_file.write_text(cfg.to_toml())
    assert RunConfig.from_dict(load_config_file(toml_file)) == cfg
    argv = cfg.to_argv()
    assert argv[-5:] == ["--", "--lr", "0.1", "a b", "--"]  # the script's, last, after --
    assert "--script" in argv and "--script-cwd" in argv
