"""What a small model's replies do to a DSPy program, as DSPy's own instrumentor records
them. A predictor whose ChatAdapter reply could not be parsed calls the model again through
the JSONAdapter (a Predict, and the Predict inside a ChainOfThought): the predictor is still
one node; the retried trace's node is the call whose reply the predictor returned, re-run as
DSPy sent it (JSONAdapter's format, with the node's instructions), its value read from the
JSON reply. A gradient probe's rewrite written in ChatAdapter's format passes on the field
DSPy would read."""

from __future__ import annotations

import json
import re

import duckdb

from engine.cli.commands import main
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.pipeline_responders import chat_adapter_fields, dspy_responder
from tests.test_framework_imports import load

BROKEN = "How many minutes?"  # the question whose ChatAdapter reply the predictor cannot read
BROKEN_THING = "boxes"  # the ChainOfThought's input whose reply cannot be read either


def falls_back(body: dict) -> str:
    """dspy_responder, except for two replies ChatAdapter cannot read: the `thing`
    predictor's to BROKEN, and the ChainOfThought's when its thing is BROKEN_THING; each
    answers JSONAdapter's request that follows with a JSON object."""
    messages = body.get("messages", [])
    system = (messages[0].get("content") or "") if messages else ""
    user = (messages[-1].get("content") or "") if messages else ""
    fields = chat_adapter_fields(user)
    if "Your output fields are:\n1. `thing`" in system and fields.get("question") == BROKEN:
        if "JSON object" in user:
            return json.dumps({"thing": "minutes"}, indent=2)
        return "[[ ## minute ## ]]\n1"
    if "2. `number`" in system and fields.get("thing", "").startswith(BROKEN_THING):
        if "JSON object" in user:
            return json.dumps({"reasoning": "The note holds no number.", "number": "none"})
        return "The answer is none."
    return dspy_responder(body)


def test_a_predictor_retried_through_the_json_adapter_is_one_node(tmp_path, capsys):
    program = load("dspy_pipeline")
    traces, targets, db = tmp_path / "t.jsonl", tmp_path / "targets.jsonl", tmp_path / "r.duckdb"
    with FakeOpenAIServer(responder=falls_back) as server:
        program.run(server.base_url, "fake-qwen", traces, 4, targets)
        json_requests = [r for r in server.requests if "JSON object" in
                          (r["messages"][-1].get("content") or "")]
        assert len(json_requests) == 2  # DSPy itself fell back, twice
        assert main(["import-traces", str(traces), "--db", str(db), "--targets", str(targets),
                     "--base-url", server.base_url, "--run-id", "imp", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [n["id"] for n in got["nodes"]] == ["note_sentence", "name_thing", "number"]
    assert [n["prompt"] for n in got["nodes"]][1] == program.NameThing.instructions
    assert got["edges"] == [["name_thing", "number"], ["note_sentence", "number"]]
    asked = {("thing" if "1. `thing` (str)" in r["messages"][0]["content"].split(
        "Your output fields are:")[1] else "number"): r for r in json_requests}
    for node, broken, value, request in [("name_thing", BROKEN, "minutes", asked["thing"]),
                                         ("number", "How many boxes?", "none",
                                          asked["number"])]:
        rows = _forward(db, node)
        retried = [(out, messages) for fields, out, messages in rows
                   if broken in json.loads(fields)["input"]]
        assert len(rows) == 4 and len(retried) == 1
        out, messages = retried[0]
        # the value the predictor returned, read from the JSON reply, not the broken one
        assert out == value
        # re-run as DSPy sent it the second time: JSONAdapter's messages, instructions and all
        assert [(m["role"], m["content"]) for m in messages] == [
            (m["role"], m["content"]) for m in request["messages"]]
    assert program.NameThing.instructions in asked["thing"]["messages"][0]["content"]


def _forward(db, node: str) -> list[tuple[str, str, list[dict]]]:
    """(example fields, output, forward messages) of each of the node's imported calls."""
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT e.fields, o.output_text, c.messages FROM node_outputs o "
            "JOIN examples e USING (run_id, example_id) JOIN llm_calls c ON "
            "c.run_id = o.run_id AND c.example_id = o.example_id AND c.node_id = o.node_id "
            "AND c.purpose = 'forward' WHERE o.run_id = 'imp' AND o.node_id = ?", [node]
        ).fetchall()
    return [(f, out, json.loads(m)) for f, out, m in rows]


def rewrites_in_wire_format(body: dict) -> str:
    """dspy_responder, and a gradient probe's rewriter that gives the sentence's number in
    the format the DSPy messages it is shown ask for (`[[ ## note ## ]]`), as the embedded
    1.5B does."""
    messages = body.get("messages", [])
    if messages and (messages[0].get("content") or "").startswith("You rewrite one step's"):
        user = messages[-1].get("content") or ""
        number = re.search(r"\d+", user.split("It produced this output:")[0])
        return (f"<output>[[ ## note ## ]]\n{number[0] if number else 'none'}\n\n"
                "[[ ## completed ## ]]</output>")
    return dspy_responder(body)


def test_a_gradient_probe_passes_on_the_field_a_wire_format_rewrite_holds(tmp_path, capsys):
    """The rewrite of a DSPy node's output, written in ChatAdapter's format, reaches the next
    predictor as the field DSPy would have parsed: the number, with no markers."""
    program = load("dspy_pipeline")
    traces, targets, db = tmp_path / "t.jsonl", tmp_path / "targets.jsonl", tmp_path / "r.duckdb"
    with FakeOpenAIServer(responder=rewrites_in_wire_format) as server:
        program.run(server.base_url, "fake-qwen", traces, 6, targets)
        assert main(["import-traces", str(traces), "--db", str(db), "--targets", str(targets),
                     "--base-url", server.base_url, "--run-id", "imp", "--val", "3"]) == 0
        assert main(["backprop", "imp", "--db", str(db)]) == 0
        assert main(["blame", "imp", "--db", str(db), "--examples", "val", "--exhaustive",
                     "--json"]) == 0
    capsys.readouterr()
    with duckdb.connect(str(db), read_only=True) as con:
        probes = con.execute(
            "SELECT e.fields, p.intervention, p.after_score FROM probes p JOIN examples e "
            "USING (run_id, example_id) WHERE p.run_id = 'imp' AND p.kind = 'gradient' "
            "AND p.node_id = 'note_sentence'").fetchall()
    assert len(probes) == 3
    for fields, intervention, after in probes:
        sentence = json.loads(json.loads(fields)["input"])["sentence"]
        assert intervention == re.search(r"\d+", sentence)[0]
        assert after == 1.0  # the number reached `number`, which copied it
