"""A run built with the Python API, with a tool and a metric imported from a module, can be
probed, blamed, forked and resumed from the command line with no extra flags; a function
from a script's __main__ gets one line saying to pass --functions."""

from __future__ import annotations

import json

import duckdb

from engine.api.builder import Graph, optimize
from engine.cli import main
from engine.llm.scripted import ScriptedBackend
from tests.support.pipeline_code import close_enough, digits_only

ROWS = [{"id": f"q{i}", "question": f"Ann has {i} apples and gets {i + 2} more.",
         "answer": str(2 * i + 2)} for i in range(1, 9)]


def build(tool=digits_only, metric=close_enough) -> Graph:
    g = Graph(name="own", input_fields=["question"], target_field="answer", metric=metric)
    g.llm("plan", "Write the numbers of the question.", inputs=["question"])
    g.function("digits", tool, inputs=["plan"])
    g.llm("final", "Add the numbers and give the sum.", inputs=["question", "digits"],
          output=True)
    return g


def logged(tmp_path, **kw) -> str:
    db = str(tmp_path / "runs.duckdb")
    optimize(build(**kw), train=ROWS[:4], val=ROWS[4:], backend=ScriptedBackend(), steps=1,
             db=db, run_id="own", concurrency=4)
    return db


def test_the_run_records_where_its_code_comes_from(tmp_path):
    db = logged(tmp_path)
    with duckdb.connect(db, read_only=True) as con:
        config = json.loads(con.execute("SELECT config FROM runs").fetchone()[0])
    assert config["code"]["functions"]["digits_only"] == {
        "module": "tests.support.pipeline_code", "qualname": "digits_only",
        "file": config["code"]["functions"]["digits_only"]["file"]}
    assert config["code"]["metric"]["qualname"] == "close_enough"


def test_probe_blame_and_fork_reimport_the_code(tmp_path, capsys, monkeypatch):
    db = logged(tmp_path)
    monkeypatch.setattr("engine.llm.factory.make_backend", lambda *a, **k: ScriptedBackend())
    assert main(["blame", "own", "--db", db, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {n["node"] for n in report["nodes"]} == {"plan", "final"}
    assert sum(n["probed"] for n in report["nodes"]) > 0
    with duckdb.connect(db, read_only=True) as con:
        example, output = con.execute(
            "SELECT example_id, output_text FROM node_outputs WHERE step = 1 AND split = "
            "'train' AND node_id = 'plan' ORDER BY 1 LIMIT 1").fetchone()
    assert main(["probe", "own", "--db", db, "--step", "1", "--node", "plan", "--example",
                 example, "--output", "3 and 4", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    # the tool ran again on the new output: its digits reached 'final'
    assert [o["node_id"] for o in row["outputs"]] == ["plan", "digits", "final"]
    assert row["outputs"][1]["output_text"] == "3 4"
    assert main(["run", "--fork", "own", "--from-step", "1", "--steps", "1", "--db", db,
                 "--run-id", "child"]) == 0
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT status FROM runs WHERE run_id = 'child'").fetchone() == \
            ("finished",)


def test_code_from_a_scripts_main_is_said_in_one_line(tmp_path, capsys, monkeypatch):
    def local_tool(text: str) -> str:  # defined inside a function: no module can give it
        return text

    db = logged(tmp_path, tool=local_tool)
    monkeypatch.setattr("engine.llm.factory.make_backend", lambda *a, **k: ScriptedBackend())
    assert main(["blame", "own", "--db", db]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: function 'local_tool'")
    assert "--functions FILE.py" in lines[0]
