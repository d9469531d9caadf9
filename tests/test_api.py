"""The Python API (engine.Graph, engine.optimize): graphs built in code with sync, async and
failing functions and a metric with feedback, run under the scripted backend, checked in
the run log and through the dashboard's data layer."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace

import pandas as pd
import pytest

from engine import Graph, GraphError, MetricError, optimize
from engine.core.graph import parse_graph
from engine.llm.base import LLMRequest
from engine.llm.scripted import ScriptedBackend
from tests.support.runlog import rows

ROWS = [{"id": f"r{i}", "question": f"What is {i} plus {i + 3}?", "answer": str(2 * i + 3)}
        for i in range(1, 9)]
DESCRIPTION = "Adds up every number in its input and returns the sum."


def add_numbers(text: str) -> str:
    return str(sum(int(n) for n in re.findall(r"\d+", text)))


async def double_async(total: str) -> str:
    await asyncio.sleep(0)
    return str(2 * int(total))


def refuse_eleven(total: str) -> str:
    if total == "11":
        raise ValueError("eleven is not allowed")
    return total


def plan_from_question(request: LLMRequest) -> str | None:
    """The plan node writes the question's two numbers as a sum; final answers 0."""
    if request.purpose == "forward" and request.meta.get("node") == "plan":
        numbers = re.findall(r"What is (\d+) plus (\d+)", request.messages[-1][1])[0]
        return f"<output>{numbers[0]} + {numbers[1]}</output>"
    if request.purpose == "forward" and request.meta.get("node") == "final":
        return "<output>0</output>"
    return None


def judged(example: dict, prediction: str) -> tuple[float, str]:
    if prediction.strip() == example["answer"]:
        return 1.0, "Correct."
    return 0.0, f"JUDGE: expected {example['answer']}, the pipeline said {prediction.strip()}."


def tool_graph(metric=judged) -> Graph:
    g = Graph(name="tools", input_fields=["question"], target_field="answer", metric=metric)
    g.llm("plan", prompt="Write the sum to compute.", inputs=["question"])
    g.function("add", fn=add_numbers, inputs=["plan"], description=DESCRIPTION)
    g.function("double", fn=double_async, inputs=["add"])
    g.function("guard", fn=refuse_eleven, inputs=["add"])
    g.llm("final", prompt="Give the final number.", inputs=["question", "add", "double", "guard"],
          output=True)
    return g


@pytest.fixture
def run(tmp_path):
    backend = ScriptedBackend(responder=plan_from_question)
    db = tmp_path / "runs.duckdb"
    result = optimize(tool_graph(), train=ROWS[:4], val=ROWS[4:], backend=backend, steps=1,
                      failures_per_step=4, db=db)
    return result, db, backend




def test_function_activations_sync_async_and_failure_are_logged(run):
    result, db, _ = run
    assert result.status == "finished" and result.steps == 1
    acts = {(e, n): (i, o, err) for e, n, i, o, err in rows(
        db, "SELECT example_id, node_id, input_text, output_text, error FROM node_outputs "
            "WHERE run_id = ? AND step = 1 AND split = 'train'", result.run_id)}
    # r1: 1 + 4 = 5; the sync tool read the plan, the async tool doubled the sum
    assert "1 + 4" in acts["r1", "add"][0] and acts["r1", "add"][1] == "5"
    assert acts["r1", "double"][1] == "10" and acts["r1", "guard"][1] == "5"
    # r4: 4 + 7 = 11: the failing function fails that example, with its exception text
    assert acts["r4", "guard"][2] == "function 'refuse_eleven' raised ValueError: " \
                                     "eleven is not allowed"
    assert acts["r4", "final"][2] == "upstream node 'guard' failed"
    [(error, score)] = rows(db, "SELECT error, score FROM losses WHERE run_id = ? AND step = 1 "
                                "AND split = 'train' AND example_id = 'r4'", result.run_id)
    assert "eleven is not allowed" in error and score == 0


def test_metric_feedback_is_the_output_gradient(run):
    result, db, _ = run
    grads = rows(db, "SELECT example_id, content FROM gradients WHERE run_id = ? AND "
                     "node_id = 'final' AND from_node_id = 'loss'", result.run_id)
    assert grads and {c for _, c in grads} == {
        f"JUDGE: expected {r['answer']}, the pipeline said 0." for r in ROWS[:3]}
    feedback = rows(db, "SELECT feedback FROM losses WHERE run_id = ? AND example_id = 'r1' "
                        "AND step = 1 AND split = 'train'", result.run_id)
    assert feedback == [("JUDGE: expected 5, the pipeline said 0.",)]


def test_described_function_gets_a_joint_backward_call(run):
    result, db, backend = run
    calls = [r for r in backend.requests if r.purpose == "backward"
             and r.meta.get("node") == "add"]
    assert calls, "the described tool made no backward call"
    text = calls[0].messages[-1][1]
    # its task is the description; the call shows what the tool got and what it returned
    assert DESCRIPTION in text and "1 + 4" in text and "<output>\n5\n</output>" in text
    # the gradient that passed through the function node reached the LLM node, logged with
    # the call that wrote it
    [(content, node_of_call)] = rows(
        db, "SELECT g.content, c.node_id FROM gradients g JOIN llm_calls c USING (call_id) "
            "WHERE g.run_id = ? AND g.example_id = 'r1' AND g.node_id = 'plan' "
            "AND g.from_node_id = 'add'", result.run_id)
    assert node_of_call == "add" and "plan" in content
    # the undescribed tool makes no call: its input receives its feedback as it is
    assert not [r for r in backend.requests if r.meta.get("node") == "double"
                and r.purpose == "backward"]
    [(to_add, from_final)] = rows(
        db, "SELECT g.content, f.content FROM gradients g JOIN gradients f ON f.run_id = g.run_id "
            "AND f.example_id = g.example_id AND f.node_id = 'double' AND f.kind = 'aggregate' "
            "WHERE g.run_id = ? AND g.example_id = 'r1' AND g.node_id = 'add' "
            "AND g.from_node_id = 'double'", result.run_id)
    assert to_add == from_final


def test_run_opens_through_the_dashboard_data_layer(run):
    from dashboard import data

    result, db, _ = run
    graph = data.graph(str(db), result.run_id)
    assert graph is not None and set(graph.model.functions) == {"add", "double", "guard"}
    assert graph.metric == "python:judged"
    view = data.node_view(str(db), result.run_id, 1, "r1", "add")
    activation = view["activation"].iloc[0]
    assert activation["output_text"] == "5" and "1 + 4" in activation["input_text"]
    assert activation["prompt"] == DESCRIPTION  # the function's text is its description
    assert "plan" in set(view["sent"]["node_id"])


def test_the_logged_yaml_names_functions_and_descriptions(run):
    result, db, _ = run
    [(text,)] = rows(db, "SELECT graph_yaml FROM runs WHERE run_id = ?", result.run_id)
    assert "function: add_numbers" in text and DESCRIPTION in text
    assert "metric: python:judged" in text


YAML = """name: same
input_fields: [question]
target_field: answer
metric: numeric
nodes:
  - id: hint
    prompt: Work out a step.
    inputs: [question]
  - id: number
    kind: function
    function: extract_number
    inputs: [hint]
  - id: final
    prompt: Solve it.
    inputs: [question, number]
    output: true
    max_tokens: 64
"""


def same_in_python() -> Graph:
    from engine.core.functions import extract_number

    g = Graph(name="same", input_fields=["question"], target_field="answer", metric="numeric")
    g.llm("hint", prompt="Work out a step.", inputs=["question"])
    g.function("number", fn=extract_number, inputs=["hint"])
    return g.llm("final", prompt="Solve it.", inputs=["question", "number"], output=True,
                 max_tokens=64)


def test_builder_builds_what_the_yaml_loader_builds():
    def unlined(graph):
        return [replace(n, line=None) for n in graph.nodes]

    built = same_in_python()
    assert unlined(built.spec) == unlined(parse_graph(YAML))
    assert built.spec.node("number").fn is None  # a registered function stays registered
    assert unlined(parse_graph(built.to_yaml())) == unlined(parse_graph(YAML))


def test_builder_refuses_what_the_loader_refuses_with_the_same_line():
    stray = YAML + "  - id: stray\n    prompt: Unused.\n    inputs: [question]\n"
    with pytest.raises(GraphError) as from_file:
        parse_graph(stray, "<graph same>")
    built = same_in_python().llm("stray", prompt="Unused.", inputs=["question"])
    with pytest.raises(GraphError) as from_code:
        built.validate()
    assert (from_code.value.message, from_code.value.node) == \
        (from_file.value.message, from_file.value.node) == \
        ("cannot reach the output node 'final'", "stray")
    assert str(from_code.value) == "<graph same>: node 'stray': cannot reach the output node " \
                                   "'final'"


def test_builder_errors_match_the_loader_and_name_the_node():
    with pytest.raises(GraphError, match=r"^<graph g>: unknown metric 'bleu' \(allowed: "):
        Graph(name="g", input_fields=["question"], target_field="answer", metric="bleu")
    g = Graph(name="g", input_fields=["question"], target_field="answer")
    g.llm("a", prompt="p", inputs=["question"])
    with pytest.raises(GraphError, match=r"^<graph g>: node 'a': duplicate node id$"):
        g.llm("a", prompt="p", inputs=["question"])
    with pytest.raises(GraphError, match=r"node 'b': an llm node needs a non-empty 'prompt'"):
        g.llm("b", prompt=" ", inputs=["question"])
    with pytest.raises(GraphError, match=r"node 'c': a node needs at least one input"):
        g.llm("c", prompt="p", inputs=[])
    g.llm("d", prompt="p", inputs=["typo"], output=True)
    with pytest.raises(GraphError) as exc:
        g.validate()
    assert str(exc.value) == ("<graph g>: node 'd': input 'typo' names neither a node nor an "
                              "input field")


def test_signature_mismatch_is_refused_when_the_node_is_added():
    g = Graph(name="g", input_fields=["question", "context"], target_field="answer")
    g.llm("a", prompt="p", inputs=["question"])
    with pytest.raises(GraphError) as exc:
        g.function("tool", fn=lambda text, extra: text, inputs=["a"])
    assert exc.value.node == "tool"
    assert "cannot take the node's 1 input (a)" in str(exc.value)
    with pytest.raises(GraphError, match="node 'tool2'.*2 inputs"):
        g.function("tool2", fn=add_numbers, inputs=["a", "context"])
    g.function("ok", fn=lambda *values: "".join(values), inputs=["a", "context"])  # *args fits
    assert "tool" not in g.nodes and "ok" in g.nodes


@pytest.mark.parametrize("returned", ["0.5", (1.0, 2), None, float("nan"), (1, "a", "b")])
def test_bad_metric_return_fails_the_run_with_one_line(tmp_path, returned):
    g = tool_graph(metric=lambda example, prediction: returned)
    db = tmp_path / "runs.duckdb"
    with pytest.raises(MetricError) as exc:
        optimize(g, train=ROWS[:2], val=ROWS[2:4], backend=ScriptedBackend(
            responder=plan_from_question), steps=1, db=db)
    message = str(exc.value)
    assert "\n" not in message and "must return a number or a (number, text) pair" in message
    [(status, error)] = rows(db, "SELECT status, error FROM runs")
    assert status == "failed" and "must return a number" in error


def test_metric_with_the_wrong_arity_is_refused_at_once():
    with pytest.raises(GraphError, match="metric 'score' must take .example, prediction."):
        def score(prediction):
            return 1.0
        Graph(name="g", input_fields=["q"], target_field="a", metric=score)


def test_dataframe_rows_and_a_jsonl_name(tmp_path):
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps({**r, "id": "v" + r["id"]}) + "\n" for r in ROWS[4:]))
    g = tool_graph(metric="numeric")
    result = optimize(g, train=pd.DataFrame(ROWS[:4]), val=str(path), steps=0,
                      backend=ScriptedBackend(responder=plan_from_question),
                      db=tmp_path / "runs.duckdb")
    splits = rows(tmp_path / "runs.duckdb", "SELECT split, count(*) FROM examples GROUP BY 1 "
                                            "ORDER BY 1")
    assert splits == [("train", 4), ("val", 4)] and result.val_score == 0.0


def test_forward_returns_every_activation():
    acts = tool_graph().forward(ROWS[0], backend=ScriptedBackend(responder=plan_from_question))
    assert list(acts) == ["plan", "add", "double", "guard", "final"]
    assert acts["add"].output_text == "5" and acts["double"].output_text == "10"


def test_to_yaml_refuses_python_functions():
    with pytest.raises(GraphError, match="node 'add' wraps a Python function"):
        tool_graph(metric="numeric").to_yaml()


def test_openai_keywords_never_store_the_key(tmp_path):
    from engine.api.support import make_backends

    forward, optimizer, names = make_backends(
        "openai", None, model="m-small", optimizer_model="m-large",
        base_url="http://127.0.0.1:9/v1", api_key="sk-secret-123")
    assert forward.name == "openai" and optimizer is None
    assert names == {"backend": "openai", "model": "m-small", "optimizer_backend": None,
                     "optimizer_model": "m-large"}
    assert "sk-secret-123" not in json.dumps(names)


def test_inside_an_event_loop_optimize_points_to_aoptimize(tmp_path):
    from engine import aoptimize

    async def notebook_cell():
        with pytest.raises(RuntimeError, match=r"use `await aoptimize\(...\)`"):
            optimize(tool_graph(), train=ROWS[:2], val=ROWS[2:4], backend="scripted")
        return await aoptimize(tool_graph(), train=ROWS[:2], val=ROWS[2:4], steps=0,
                               backend=ScriptedBackend(responder=plan_from_question),
                               db=tmp_path / "runs.duckdb")

    assert asyncio.run(notebook_cell()).status == "finished"


def test_bad_rows_are_refused_with_one_line(tmp_path):
    from engine.data.datasets import DatasetError

    with pytest.raises(DatasetError, match=r"^val row 1 \('val-1'\) has no field 'answer'"):
        optimize(tool_graph(), train=ROWS[:2], val=[{"question": "a", "answer": "1"},
                                                    {"question": "b"}],
                 backend="scripted", db=tmp_path / "runs.duckdb")
    with pytest.raises(ValueError, match="give train data with val"):
        optimize(tool_graph(), val=ROWS[:2], backend="scripted", db=tmp_path / "runs.duckdb")


@pytest.mark.parametrize("method", ["semantic", "semantic-evaluative", "textgrad",
                                    "semantic-nosibling", "gtbp", "none"])
def test_every_method_calls_on_the_described_tool_only(tmp_path, method):
    backend = ScriptedBackend(responder=plan_from_question)
    result = optimize(tool_graph(), train=ROWS[:4], val=ROWS[4:], backend=backend, steps=1,
                      method=method, failures_per_step=3, db=tmp_path / "runs.duckdb")
    called = {r.meta.get("node") for r in backend.requests if r.purpose == "backward"}
    assert result.status == "finished"
    assert called == (set() if method == "none" else {"add", "final"})


def test_every_sample_graph_file_round_trips_through_the_builder():
    from pathlib import Path

    from engine.core.graph import load_graph

    def unlined(graph):
        return [replace(n, line=None) for n in graph.nodes]

    for path in sorted((Path(__file__).parents[1] / "sample_graphs").glob("*.yaml")):
        original = load_graph(path)
        again = parse_graph(Graph.from_yaml(path).to_yaml())
        assert unlined(again) == unlined(original), path.name
        assert (again.metric, again.splits, again.answer_format, again.dataset) == \
            (original.metric, original.splits, original.answer_format, original.dataset)
