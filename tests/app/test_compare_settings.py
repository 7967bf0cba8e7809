"""The Compare view's wording without a window: the settings rows and the validation caption."""

from __future__ import annotations

from app.compare_settings import (
    MISSING,
    differences_note,
    flatten,
    format_value,
    settings_rows,
    validation_note,
)


def _by_key(rows):
    return {r.key: r for r in rows}


def test_equal_settings_are_not_flagged_and_differing_ones_are_listed_first() -> None:
    a = {"model": "mlp", "batch_size": 32, "lr": 0.001, "optimizer": "adamw"}
    b = {"model": "mlp", "batch_size": 64, "lr": 0.001, "optimizer": "sgd"}
    rows = settings_rows([a, b])
    assert [(r.key, r.differs) for r in rows] == [
        ("batch_size", True), ("optimizer", True),  # differences first, in RunConfig's order
        ("model", False), ("lr", False)]
    assert _by_key(rows)["batch_size"].values == ("32", "64")
    assert _by_key(rows)["lr"].values == ("0.001", "0.001")
    assert "samples per process" in _by_key(rows)["batch_size"].help
    assert differences_note(rows) == "Settings: 2 of 4 differ (highlighted, listed first)"


def test_a_key_missing_in_one_run_reads_as_a_dash_and_is_flagged() -> None:
    rows = _by_key(settings_rows([{"model": "mlp", "grad_clip": 1.0},
                                  {"model": "mlp", "eval_every": 50}]))
    assert rows["grad_clip"].values == ("1", MISSING) and rows["grad_clip"].differs
    assert rows["eval_every"].values == (MISSING, "50") and rows["eval_every"].differs
    assert not rows["model"].differs


def test_missing_and_null_are_the_same_and_a_run_without_config_is_all_dashes() -> None:
    rows = _by_key(settings_rows([{"gpus": None, "lr": 1}, {"lr": 1.0}, None]))
    assert rows["gpus"].values == (MISSING, MISSING, MISSING) and not rows["gpus"].differs
    assert rows["lr"].values == ("1", "1", MISSING) and rows["lr"].differs


def test_nested_arguments_are_flattened_into_dotted_keys() -> None:
    a = {"model": "gpt-tiny", "model_args": {"hidden": 64, "block": {"heads": 4}},
         "dataset_args": {}}
    b = {"model": "gpt-tiny", "model_args": {"hidden": 128}, "dataset_args": {}}
    assert flatten(a) == {"model": "gpt-tiny", "model_args.hidden": 64,
                          "model_args.block.heads": 4, "dataset_args": {}}
    rows = settings_rows([a, b])
    assert [r.key for r in rows if r.differs] == ["model_args.block.heads", "model_args.hidden"]
    by_key = _by_key(rows)
    assert by_key["model_args.block.heads"].values == ("4", MISSING)
    assert by_key["model_args.hidden"].values == ("64", "128")
    assert by_key["dataset_args"].values == (MISSING, MISSING)  # left empty in both: one row
    # filled in one run only: its keys' rows, "-" where the other leaves it empty
    rows = _by_key(settings_rows([{"model_args": {}}, {"model_args": {"hidden": 8}}]))
    assert list(rows) == ["model_args.hidden"]
    assert rows["model_args.hidden"].values == (MISSING, "8")


def test_values_read_as_people_write_them() -> None:
    assert [format_value(v) for v in (None, "", [], {}, True, False)] == \
        [MISSING, MISSING, MISSING, MISSING, "yes", "no"]
    assert [format_value(v) for v in (3e-4, 1e-5, 120.0, 0.1 + 0.2, 7)] == \
        ["0.0003", "1e-05", "120", "0.30000000000000004", "7"]
    assert format_value([0, 2]) == "0, 2"
    assert format_value({"a": 1, "b": None}) == "a=1, b=-"
    assert format_value("runs/mlp-digits") == "runs/mlp-digits"
    # true and 1 differ; 1 and 1.0 do not
    rows = _by_key(settings_rows([{"telemetry": True, "lr": 1}, {"telemetry": 1, "lr": 1.0}]))
    assert rows["telemetry"].differs and not rows["lr"].differs


def test_the_heading_and_the_validation_caption() -> None:
    assert differences_note(settings_rows([{"lr": 1}, {"lr": 1}])) == "Settings: all 1 the same"
    assert differences_note([]) == "Settings: no config.json in these runs"
    assert validation_note("b", [], []) == "b: no evaluations, so no validation loss"
    assert validation_note("a", [10.0, 20.0], [0.61234, 0.9]) == \
        "a: validation loss 0.9 at step 20 (best 0.6123, 2 evaluations)"
    assert validation_note("a", [10.0], [0.5]).endswith("(best 0.5, 1 evaluation)")


def test_each_runs_own_folder_is_shown_but_is_no_difference() -> None:
    rows = settings_rows([{"run_dir": "/runs/a", "lr": 0.1}, {"run_dir": "/runs/b", "lr": 0.1}])
    assert [(r.key, r.values, r.differs) for r in rows] == [
        ("lr", ("0.1", "0.1"), False), ("run_dir", ("/runs/a", "/runs/b"), False)]
    assert differences_note(rows) == "Settings: all 2 the same"
