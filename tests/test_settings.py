"""Run settings have one source (engine.runs.settings.RunConfig): the command line's flags,
engine.optimize's keyword defaults, fork overrides and the dashboard's New-run form agree."""

from __future__ import annotations

import inspect
import json

import pytest

from dashboard import jobs
from engine.cli import build_parser, main
from engine.runlog.schema import connect
from engine.runs.settings import DEFAULTS, SETTINGS, as_flags, given_settings
from tests.support.graphs import TWO_HINTS, arithmetic_rows, run_engine, write_graph


def stored_config(db, run_id: str) -> dict:
    with connect(db, read_only=True) as con:
        (text,) = con.execute("SELECT config FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return json.loads(text)


def test_a_default_run_stores_the_same_settings_from_the_command_line_and_from_python(
        tmp_path):
    from engine import Graph, optimize

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows(12))
    db = tmp_path / "r.duckdb"
    common = ["--backend", "scripted", "--steps", "1", "--train", "3", "--val", "3",
              "--test", "0"]
    assert main(["run", str(graph), "--db", str(db), "--run-id", "cli", *common]) == 0
    optimize(Graph.from_yaml(graph), backend="scripted", steps=1, db=str(db), run_id="api",
             splits={"train": 3, "val": 3, "test": 0})
    cli, api = stored_config(db, "cli"), stored_config(db, "api")
    assert cli.pop("run_id") == "cli" and api.pop("run_id") == "api"
    assert cli == api
    assert cli["concurrency"] is None  # adaptive, whichever way the run was started


def test_optimize_takes_its_keyword_defaults_from_the_settings():
    from engine import optimize

    params = inspect.signature(optimize).parameters
    # backend: None means "the default backend kind", resolved as the command line does;
    # method_options: None means {}
    shared = [f.name for f in SETTINGS if f.name in params
              and f.name not in ("backend", "optimizer_backend", "method_options")]
    assert len(shared) >= 15
    for name in shared:
        assert params[name].default == getattr(DEFAULTS, name), name


def test_every_setting_has_a_flag_and_the_flags_default_to_nothing_typed():
    args = build_parser().parse_args(["run", "g.yaml"])
    assert given_settings(args) == {}
    flags = {a for action in build_parser()._subparsers._group_actions[0].choices["run"]._actions
             for a in action.option_strings}
    for f in SETTINGS:
        assert any(flag in flags for flag in as_flags({f.name: _non_default(f.name)})
                   if flag.startswith("--")), f.name


def _non_default(name: str):
    value = getattr(DEFAULTS, name)
    if isinstance(value, bool):
        return not value
    if isinstance(value, dict):
        return {"k": 1} if name == "method_options" else {"openai": 2}
    if name in ("method", "backend", "optimizer_backend"):
        return "textgrad" if name == "method" else "openai"
    if name == "contrast":
        return "semantic-nosibling"
    if name in ("cache", "update_mode", "update_when", "node_gates", "prompts", "structured",
                "local_serving"):
        return {"cache": "off", "update_mode": "one", "update_when": "always",
                "node_gates": "on", "prompts": "paper", "structured": "off",
                "local_serving": "in-process"}[name]
    if isinstance(value, float):
        return value + 1.5
    if isinstance(value, int) or value is None:
        return 3 if name not in ("model", "optimizer_model", "db", "data_dir", "dataset", "chat_format",
                                 "base_url", "run_id", "scripted_responder") else "x"
    return value + "x"


def test_flags_written_for_settings_read_back_as_the_same_settings():
    chosen = {f.name: _non_default(f.name) for f in SETTINGS}
    args = build_parser().parse_args(["run", "g.yaml", *as_flags(chosen)])
    assert given_settings(args) == chosen


def test_a_flag_typed_at_its_default_is_still_given():
    # A fork keeps every option it was given, also one equal to the command line's default.
    args = build_parser().parse_args(["run", "--fork", "p", "--from-step", "0",
                                      "--temperature", "0", "--seed", "0", "--failures", "2"])
    assert given_settings(args) == {"temperature": 0.0, "seed": 0, "failures_per_step": 2}


def test_a_fork_stores_every_option_it_was_given(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows(20))
    db = tmp_path / "r.duckdb"
    run_engine(graph, db, run_id="parent", steps=1, temperature=0.5, seed=3,
               failures_per_step=3)
    assert main(["run", "--fork", "parent", "--from-step", "0", "--db", str(db),
                 "--run-id", "child", "--temperature", "0", "--seed", "0",
                 "--failures", "2"]) == 0
    child = stored_config(db, "child")
    assert (child["temperature"], child["seed"], child["failures_per_step"]) == (0.0, 0, 2)


def test_a_fork_with_new_splits_measures_its_gate_baseline_on_them(tmp_path):
    from engine.runlog.reader import step_table

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows(30))
    db = tmp_path / "r.duckdb"
    run_engine(graph, db, run_id="parent", steps=1, train=4, val=4)
    assert main(["run", "--fork", "parent", "--from-step", "0", "--db", str(db),
                 "--run-id", "child", "--val", "9", "--steps", "0"]) == 0
    from engine.runlog.reader import query

    logged = query(db, "SELECT count(DISTINCT example_id) AS n FROM node_outputs "
                       "WHERE run_id = 'child' AND step = 0 AND split = 'val'")
    assert int(logged.n[0]) == 9  # the baseline was scored on the fork's own 9 examples
    assert len(step_table(db, "child")) == 1


@pytest.mark.parametrize("name", ["method", "backend", "model", "optimizer_model", "steps",
                                  "train", "val", "test", "seed", "dataset", "run_id"])
def test_the_new_run_form_starts_from_the_same_defaults(name):
    spec = jobs.RunSpec(graph="g.yaml", db="x.duckdb")
    assert getattr(spec, name) == getattr(DEFAULTS, name)


def test_the_new_run_form_writes_its_settings_as_the_engine_reads_them():
    spec = jobs.RunSpec(graph="g.yaml", db="x.duckdb", method="gtbp", steps=2,
                        settings={"method_options": {"m0": 3}, "data_dir": "/d",
                                  "gate": False})
    args = build_parser().parse_args(jobs.build_command(spec)[3:])
    given = given_settings(args)
    assert given["method_options"] == {"m0": 3} and given["gate"] is False
    assert (given["method"], given["steps"], given["data_dir"]) == ("gtbp", 2, "/d")


def test_a_scripted_responder_is_recorded_and_answers_the_runs_forks_too(tmp_path, capsys):
    from tests.support.runlog import rows

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    db = str(tmp_path / "r.duckdb")
    model = "sample_graphs/demo_responder.py:demo_responder"  # relative to the repository
    common = ["--db", db, "--steps", "0", "--val", "6", "--train", "2", "--test", "0"]
    assert main(["run", str(root / "sample_graphs" / "demo.yaml"), "--backend", "scripted",
                 "--scripted-responder", str(root / model), "--run-id", "parent",
                 *common[:2], *common[2:]]) == 0
    assert stored_config(db, "parent")["scripted_responder"] == str(root / model)
    # the demo's model: the starting prompts get every answer wrong, a note that asks for
    # the number gets them right, in the fork that the stored responder answers
    assert rows(db, "SELECT val_score FROM steps WHERE run_id = 'parent'") == [(0.0,)]
    assert main(["run", "--fork", "parent", "--from-step", "0", "--db", db, "--run-id",
                 "fork", "--steps", "0", "--set-prompt",
                 "note=The text says how many. Write that number."]) == 0
    assert rows(db, "SELECT val_score FROM steps WHERE run_id = 'fork'") == [(1.0,)]
    assert rows(db, "SELECT DISTINCT output_text FROM node_outputs WHERE run_id = 'fork' AND "
                    "node_id = 'answer' AND example_id = 'ct-00'") == [("7",)]


@pytest.mark.parametrize("args, message", [
    (["--scripted-responder", "no_colon"], "expects FILE.py:NAME"),
    (["--scripted-responder", "missing.py:fn"], "functions file not found"),
    (["--scripted-responder", "sample_graphs/demo_responder.py:nothing"],
     "has no function 'nothing'"),
    (["--scripted-responder", "sample_graphs/demo_responder.py:demo_responder",
      "--backend", "openai"], "only the scripted backend"),
])
def test_a_bad_scripted_responder_is_one_error_line(tmp_path, capsys, monkeypatch, args,
                                                    message):
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    db = tmp_path / "r.duckdb"
    argv = ["run", "sample_graphs/demo.yaml", "--db", str(db), "--steps", "0", *args]
    if "--backend" not in args:
        argv += ["--backend", "scripted"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert not db.exists()  # refused before the run log
