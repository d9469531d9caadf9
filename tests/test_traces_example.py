"""The example pipeline (sample_graphs/traced_pipeline.py: three `openai` SDK calls traced
by openinference-instrumentation-openai) run against the scripted server, imported, back-
propagated and blamed; its re-runs call the server with upstream outputs substituted."""

from __future__ import annotations

import json

import duckdb
import pytest

from engine.cli.commands import main
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.traced_pipeline import load_pipeline, responder


@pytest.fixture
def imported(tmp_path, capsys):
    pipeline = load_pipeline()
    with FakeOpenAIServer(responder=responder) as server:
        answers = pipeline.run(server.base_url, "fake-qwen", tmp_path / "traces.jsonl", 6,
                               tmp_path / "targets.jsonl")
        db = tmp_path / "runs.duckdb"
        assert main(["import-traces", str(tmp_path / "traces.jsonl"), "--db", str(db),
                     "--targets", str(tmp_path / "targets.jsonl"), "--metric", "numeric",
                     "--base-url", server.base_url, "--run-id", "ex", "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        yield server, db, got, answers


def test_the_example_pipelines_traces_import_as_three_calls_and_two_flows(imported):
    server, _, got, answers = imported
    assert answers == ["0"] * 6  # the numbers call passes a mood on, never a number
    assert [(n["id"], n["calls"], n["prompt"]) for n in got["nodes"]] == [
        ("who", 6, "Who: say in one short sentence who the sentence is about."),
        ("numbers", 6, "Numbers: say in one short sentence how the person feels."),
        ("total", 6, "Total: add up the numbers you are given and reply with the sum, as "
                     "digits only.")]
    assert got["edges"] == [["numbers", "total"], ["who", "total"]]
    assert (got["traces"], got["scored"], got["failing"], got["ambiguous"]) == (6, 6, 6, [])


def test_backprop_then_probes_call_the_users_model_with_upstream_outputs_substituted(
        imported, capsys):
    server, db, _, _ = imported
    seen = len(server.requests)
    assert main(["backprop", "ex", "--db", str(db)]) == 0
    capsys.readouterr()
    backward = server.requests[seen:]
    # the forward pass replays from the cache: only backward and update calls reach the model
    assert not any(r["messages"][0]["content"].startswith(("Who:", "Numbers:", "Total:"))
                   for r in backward)
    with duckdb.connect(str(db), read_only=True) as con:
        graded = con.execute("SELECT DISTINCT example_id FROM gradients WHERE run_id = 'ex' "
                             "AND step = 1").fetchall()
        joint = con.execute(
            "SELECT c.messages, a.output_text, b.output_text FROM gradients g "
            "JOIN llm_calls c USING (call_id) "
            "JOIN node_outputs a ON a.run_id = g.run_id AND a.step = 0 AND "
            "a.example_id = g.example_id AND a.node_id = 'numbers' "
            "JOIN node_outputs b ON b.run_id = g.run_id AND b.step = 0 AND "
            "b.example_id = g.example_id AND b.node_id = 'who' "
            "WHERE g.run_id = 'ex' AND g.step = 1 AND g.node_id = 'numbers' AND "
            "g.kind = 'gradient'").fetchall()
        proposals = con.execute("SELECT node_id FROM updates WHERE run_id = 'ex' AND step = 1 "
                                "ORDER BY node_id").fetchall()
        example = con.execute("SELECT example_id, json_extract_string(fields, '$.input') "
                              "FROM examples WHERE run_id = 'ex' ORDER BY position LIMIT 1"
                              ).fetchone()
    assert len(graded) == 6  # every failing trace
    # sibling-conditioned: numbers' gradient comes from the call that also saw who's reply
    assert len(joint) == 6 and all(count in messages and topic in messages
                                   for messages, count, topic in joint)
    assert proposals == [("numbers",), ("total",), ("who",)]

    seen = len(server.requests)
    assert main(["probe", "ex", "--db", str(db), "--step", "1", "--node", "numbers",
                 "--example", example[0], "--output", "The numbers are 3 and 15."]) == 0
    rerun = [r for r in server.requests[seen:]
             if r["messages"][0]["content"].startswith("Total:")]
    assert [r["messages"][1]["content"] for r in rerun] == [
        "Note: It is about Maria.\nNumbers: The numbers are 3 and 15."]
    assert example[1] == "Maria has 3 apples in the basket and adds 15 more."


def test_blame_names_the_call_whose_prompt_is_at_fault(imported, capsys):
    server, db, _, _ = imported
    assert main(["backprop", "ex", "--db", str(db)]) == 0
    capsys.readouterr()
    assert main(["blame", "ex", "--db", str(db), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"]["node"] == "numbers", report["verdict"]
