"""The three framework pipelines of sample_graphs/ (a DSPy program, a LangChain chain, an
`openai` SDK pipeline with a templated prompt, a forced tool call and a tool loop), each
traced by its framework's own OpenInference instrumentor against the scripted server,
imported: nodes named as the code names them, the right edges, the prompt the user wrote,
and re-runs that send what the framework would send, each trace with its own variables."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import duckdb
import pytest

from engine.cli.commands import main
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.pipeline_responders import (
    dspy_responder,
    langchain_responder,
    openai_tools_responder,
)

SAMPLES = Path(__file__).resolve().parents[1] / "sample_graphs"


def load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def traced(tmp_path: Path, name: str, responder, limit: int = 8):
    """Run the sample pipeline against the scripted server; (server, traces, targets)."""
    server = FakeOpenAIServer(responder=responder).__enter__()
    traces, targets = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.targets.jsonl"
    load(name).run(server.base_url, "fake-qwen", traces, limit, targets)
    return server, traces, targets


def imported(capsys, tmp_path: Path, traces: Path, targets: Path, server, *extra: str
             ) -> tuple[Path, dict]:
    db = tmp_path / "runs.duckdb"
    assert main(["import-traces", str(traces), "--db", str(db), "--targets", str(targets),
                 "--base-url", server.base_url, "--run-id", "imp", "--json", *extra]) == 0
    return db, json.loads(capsys.readouterr().out)


def sent(db: Path, node: str, purpose: str = "forward") -> list[list[dict]]:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT messages FROM llm_calls WHERE run_id = 'imp' AND "
                           "node_id = ? AND purpose = ? ORDER BY started_at",
                           [node, purpose]).fetchall()
    return [json.loads(m) for (m,) in rows]


@pytest.fixture
def dspy_import(tmp_path, capsys):
    server, traces, targets = traced(tmp_path, "dspy_pipeline", dspy_responder)
    with server:
        db, got = imported(capsys, tmp_path, traces, targets, server, "--val", "3")
        yield server, db, got


def test_a_dspy_program_imports_as_its_predictors_with_their_instructions(dspy_import):
    _, _, got = dspy_import
    program = load("dspy_pipeline")
    assert [n["id"] for n in got["nodes"]] == ["note_sentence", "name_thing", "number"]
    assert got["edges"] == [["name_thing", "number"], ["note_sentence", "number"]]
    # the prompt is the signature's instructions, never DSPy's field list and format rules
    assert [n["prompt"] for n in got["nodes"]] == [
        program.NoteSentence.instructions, program.NameThing.instructions,
        program.AnswerCount.instructions]
    assert got["ambiguous"] == []


def test_a_dspy_nodes_output_is_the_parsed_field_not_the_wire_format(dspy_import):
    _, db, got = dspy_import
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT node_id, output_text, raw_text FROM node_outputs WHERE "
                           "run_id = 'imp' AND node_id = 'number'").fetchall()
    assert rows and all("[[ ##" not in out and "[[ ## number ## ]]" in raw
                        for _, out, raw in rows)
    # the `number` field alone, not the reasoning before it: the faulty program has no
    # number to copy
    assert all(out.strip() == "none" and "[[ ## reasoning ## ]]" in raw
               for _, out, raw in rows)


def test_exact_match_grades_a_dspy_programs_parsed_answer(tmp_path, capsys):
    """Targets that are what the program answered: every trace passes, none is failed by
    the `[[ ## completed ## ]]` marker of the reply it came in."""
    server = FakeOpenAIServer(responder=dspy_responder).__enter__()
    with server:
        traces, targets = tmp_path / "t.jsonl", tmp_path / "targets.jsonl"
        answers = load("dspy_pipeline").run(server.base_url, "fake-qwen", traces, 4, targets)
        rows = [json.loads(line) for line in targets.read_text().splitlines()]
        targets.write_text("".join(json.dumps({"input": r["input"], "target": a}) + "\n"
                                   for r, a in zip(rows, answers)))
        _, got = imported(capsys, tmp_path, traces, targets, server)
    assert (got["scored"], got["failing"]) == (4, 0)


def test_a_dspy_re_run_sends_what_dspys_adapter_sends_with_the_new_instructions(
        dspy_import, capsys):
    import dspy

    server, db, _ = dspy_import
    program = load("dspy_pipeline")
    assert main(["backprop", "imp", "--db", str(db)]) == 0
    capsys.readouterr()
    with duckdb.connect(str(db), read_only=True) as con:
        new = dict(con.execute(
            "SELECT node_id, new_prompt FROM updates WHERE run_id = 'imp' AND "
            "new_prompt IS NOT NULL").fetchall())
    assert "note_sentence" in new
    re_runs = [r for r in server.requests if new["note_sentence"] in
               (r["messages"][0].get("content") or "")]
    # the gate re-runs the held-out traces, each with its own sentence: exactly the
    # messages DSPy's ChatAdapter writes for the signature with the new instructions
    with duckdb.connect(str(db), read_only=True) as con:
        held = [json.loads(f)["input"] for (f,) in con.execute(
            "SELECT fields FROM examples WHERE run_id = 'imp' AND split = 'val'").fetchall()]
    assert len(held) == 3 and len(re_runs) == 3
    signature = program.NoteSentence.with_instructions(new["note_sentence"])
    # an example's input is the root span's input.value: the program's keyword arguments
    sentences = [json.loads(given)["sentence"] for given in held]
    expected = sorted([(m["role"], m["content"]) for m in dspy.ChatAdapter().format(
        signature, demos=[], inputs={"sentence": sentence})] for sentence in sentences)
    assert sorted([(m["role"], m["content"]) for m in r["messages"]] for r in re_runs) == expected


def test_a_langchain_chain_of_one_word_replies_imports_by_run_name(tmp_path, capsys):
    server, traces, targets = traced(tmp_path, "langchain_pipeline", langchain_responder)
    with server:
        db, got = imported(capsys, tmp_path, traces, targets, server)
    chain = load("langchain_pipeline")
    assert [n["id"] for n in got["nodes"]] == ["city", "country", "continent"]
    assert got["edges"] == [["city", "country"], ["country", "continent"]]
    assert [n["prompt"] for n in got["nodes"]] == [chain.PROMPTS[k] for k in
                                                   ("city", "country", "continent")]
    # one-word values flow into the next step's message, where the trace had them
    with duckdb.connect(str(db), read_only=True) as con:
        country = dict(con.execute("SELECT example_id, output_text FROM node_outputs WHERE "
                                   "run_id = 'imp' AND node_id = 'country'").fetchall())
    calls = _sent_with_example(db, "continent")
    assert len(calls) == 8
    for messages, example in calls:
        assert len(country[example].split()) == 1
        assert messages[-1]["content"] == f"Country: {country[example]}"


FIXED_ORDER = ("You are the order assistant of {shop}. The customer today is {customer}. "
               "Record the order with record_order: the item the customer asks for and, as "
               "quantity, how many they ask to be sent.")


def tools_model(body: dict) -> str | dict:
    """The tool pipeline's model; asked to improve the order prompt, it repairs the fault
    and keeps the template's variables."""
    text = " ".join(str(m.get("content") or "") for m in body.get("messages", []))
    if "order assistant of {shop}" in text and "Write an improved prompt" in text:
        return f"<prompt>{FIXED_ORDER}</prompt>"
    return openai_tools_responder(body)


@pytest.fixture
def tools_import(tmp_path, capsys):
    server, traces, targets = traced(tmp_path, "openai_tools_pipeline", tools_model)
    with server:
        db, got = imported(capsys, tmp_path, traces, targets, server, "--val", "3")
        yield server, db, got, traces


def test_a_templated_tool_calling_pipeline_imports_with_its_template_as_the_prompt(
        tools_import):
    _, db, got, traces = tools_import
    pipeline = load("openai_tools_pipeline")
    ids = [n["id"] for n in got["nodes"]]
    assert ids == ["order", "cashier"] and got["edges"] == [["order", "cashier"]]
    order = got["nodes"][0]
    assert order["prompt"] == pipeline.PROMPTS["order"]  # the template, never one rendering
    assert "{customer}" in order["prompt"]
    # the forced tool call is the first stage's output; its arguments flow on
    with duckdb.connect(str(db), read_only=True) as con:
        outs = con.execute("SELECT output_text FROM node_outputs WHERE run_id = 'imp' AND "
                           "node_id = ?", [ids[0]]).fetchall()
    assert all(json.loads(o)["item"] for (o,) in outs)
    # the tool loop is one node: its call holds the tool's call and result
    loop = sent(db, ids[1])[0]
    assert [m["role"] for m in loop] == ["system", "user", "assistant", "tool"]


def test_each_re_run_of_a_templated_prompt_carries_its_own_traces_variables(
        tools_import, capsys):
    server, db, got, _ = tools_import
    ids = [n["id"] for n in got["nodes"]]
    customers = {}
    with duckdb.connect(str(db), read_only=True) as con:
        for example, fields in con.execute("SELECT example_id, fields FROM examples WHERE "
                                           "run_id = 'imp'").fetchall():
            spec = json.loads(json.loads(fields)["recorded_calls"])[ids[0]]
            customers[example] = spec["system"]["variables"]["customer"]
    assert len(set(customers.values())) > 1
    for messages, example in _sent_with_example(db, ids[0]):
        assert f"The customer today is {customers[example]}." in messages[0]["content"]
    seen = len(server.requests)
    assert main(["backprop", "imp", "--db", str(db)]) == 0
    capsys.readouterr()
    re_runs = [r for r in server.requests[seen:] if r.get("tools")
               and r["tools"][0]["function"]["name"] == "record_order"]
    assert re_runs, "no re-run reached the user's model with its tools"
    fixed = [r for r in re_runs if "how many they ask to be sent" in r["messages"][0]["content"]]
    assert len(fixed) == 3  # the three held-out traces, under the repaired template
    for request in fixed:  # each with its own trace's customer, the tool still forced
        example = next(e for _, e in _sent_with_example(db, "order")
                       if _message_of(db, e) == request["messages"][1]["content"])
        assert request["messages"][0]["content"] == FIXED_ORDER.format(
            shop=_variables(db, example)["shop"], customer=customers[example])
        assert request["tool_choice"] == {"type": "function",
                                          "function": {"name": "record_order"}}
    assert len({r["messages"][0]["content"] for r in fixed}) > 1


def test_a_proposal_that_drops_a_template_variable_is_refused(tmp_path, capsys):
    server, traces, targets = traced(tmp_path, "openai_tools_pipeline", openai_tools_responder)
    with server:
        db, _ = imported(capsys, tmp_path, traces, targets, server, "--val", "3")
        assert main(["backprop", "imp", "--db", str(db)]) == 0
        out = capsys.readouterr().out
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT new_prompt, accepted, reject_reason FROM updates WHERE "
                           "run_id = 'imp' AND node_id = 'order'").fetchall()
    assert rows and all("{customer}" not in new and not accepted
                        and reason == "drops the template variables {shop}, {customer}"
                        for new, accepted, reason in rows)
    assert "order" in out


def _variables(db: Path, example: str) -> dict:
    with duckdb.connect(str(db), read_only=True) as con:
        fields, = con.execute("SELECT fields FROM examples WHERE run_id = 'imp' AND "
                              "example_id = ?", [example]).fetchone()
    return json.loads(json.loads(fields)["recorded_calls"])["order"]["system"]["variables"]


def _message_of(db: Path, example: str) -> str:
    return next(m for m, e in _sent_with_example(db, "order") if e == example)[1]["content"]


def _sent_with_example(db: Path, node: str) -> list[tuple[list[dict], str]]:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT messages, example_id FROM llm_calls WHERE run_id = 'imp' "
                           "AND node_id = ? AND purpose = 'forward'", [node]).fetchall()
    return [(json.loads(m), e) for m, e in rows]


@pytest.mark.parametrize("name,responder", [
    ("dspy_pipeline", dspy_responder), ("langchain_pipeline", langchain_responder),
    ("openai_tools_pipeline", openai_tools_responder)])
def test_backprop_and_blame_run_on_each_framework_pipeline(tmp_path, capsys, name, responder):
    """Gradients reach every node of each imported pipeline, and blame probes every node
    (the scripted model writes no useful rewrites: which node it names is the embedded
    model's to show, benchmarks/traces_blame.py)."""
    server, traces, targets = traced(tmp_path, name, responder)
    with server:
        db, got = imported(capsys, tmp_path, traces, targets, server, "--val", "3")
        assert main(["backprop", "imp", "--db", str(db)]) == 0
        capsys.readouterr()
        assert main(["blame", "imp", "--db", str(db), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
    nodes = {n["id"] for n in got["nodes"]}
    with duckdb.connect(str(db), read_only=True) as con:
        graded = {n for (n,) in con.execute("SELECT DISTINCT node_id FROM gradients WHERE "
                                            "run_id = 'imp'").fetchall()}
    assert graded == nodes
    probed = json.dumps(report)
    assert all(f'"{n}"' in probed for n in nodes)
