"""The engine's behaviour under the scripted backend: what each method sends, the
gradients that come back, the gate, determinism and failure handling."""

from __future__ import annotations

import asyncio
import re

import pytest

from engine.llm.base import LLMRequest, TransientLLMError
from engine.llm.scripted import ScriptedBackend
from engine.prompts import templates as P
from tests.support.graphs import DIAMOND, TWO_HINTS, arithmetic_rows, run_engine, write_graph
from tests.support.runlog import rows

TWO_SUCCESSORS = """
name: fanout
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: numeric
nodes:
  - {id: h, prompt: Restate the problem., inputs: [question]}
  - {id: s1, prompt: Find the first quantity., inputs: [question, h]}
  - {id: s2, prompt: Find the second quantity., inputs: [question, h]}
  - {id: final, prompt: Solve the problem., inputs: [s1, s2], output: true}
"""




def solve(question: str) -> str:
    n = int(re.search(r"has (\d+) apples", question).group(1))
    return str(2 * n + 3)


def notes(request: LLMRequest) -> str | None:
    """Intermediate nodes write a note that names the node and the example."""
    node = request.meta.get("node")
    if request.purpose == "forward" and not request.meta.get("output_node"):
        n = re.search(r"has (\d+) apples", request.user_text).group(1)
        return f"<output>NOTE-{node}-{n}</output>"
    return None


def backward_calls(backend: ScriptedBackend, node: str) -> list[LLMRequest]:
    return [r for r in backend.requests if r.purpose == "backward" and r.meta["node"] == node]


def test_joint_backward_sees_all_three_siblings_and_yields_three_gradients(tmp_path):
    graph = write_graph(tmp_path, DIAMOND, arithmetic_rows())

    def responder(request):
        if request.purpose == "backward":
            return "\n".join(f'<gradient input="{n}">GRAD-{n.upper()}</gradient>'
                             for n in request.meta["inputs"])
        return notes(request)

    backend = ScriptedBackend(responder=responder)
    result = run_engine(graph, tmp_path / "r.duckdb", backend, steps=1, failures_per_step=1)
    calls = backward_calls(backend, "final")
    assert len(calls) == 1  # one joint call per sampled example
    text = calls[0].user_text
    for node in ("a", "b", "c"):
        assert re.search(rf"NOTE-{node}-\d+", text), f"output of {node} missing from the prompt"
    assert "Solve the problem." in text and "The expected output is" in text
    grads = rows(tmp_path / "r.duckdb", "SELECT node_id, from_node_id, content, method FROM "
                 "gradients WHERE kind = 'gradient' AND from_node_id = 'final' ORDER BY node_id")
    assert grads == [("a", "final", "GRAD-A", "semantic"), ("b", "final", "GRAD-B", "semantic"),
                     ("c", "final", "GRAD-C", "semantic")]
    assert result.status == "finished"


def test_textgrad_makes_one_call_per_input_each_about_that_input_only(tmp_path):
    graph = write_graph(tmp_path, DIAMOND, arithmetic_rows())
    backend = ScriptedBackend(responder=notes)
    run_engine(graph, tmp_path / "r.duckdb", backend, steps=1, failures_per_step=1,
               method="textgrad")
    calls = backward_calls(backend, "final")
    assert len(calls) == 3
    assert sorted(c.meta["inputs"][0] for c in calls) == ["a", "b", "c"]
    for call in calls:
        (mine,) = call.meta["inputs"]
        others = {"a", "b", "c"} - {mine}
        assert re.search(rf"NOTE-{mine}-\d+", call.user_text)
        for other in others:
            assert f"NOTE-{other}-" not in call.user_text
    gradients = rows(tmp_path / "r.duckdb", "SELECT DISTINCT method FROM gradients")
    assert gradients == [("textgrad",)]


class SlowFirstSuccessor(ScriptedBackend):
    """Makes s1's backward call slower than s2's, to prove the order does not follow timing."""

    async def complete(self, request):
        if request.purpose == "backward" and request.meta.get("node") == "s1":
            await asyncio.sleep(0.05)
        return await super().complete(request)


def test_node_with_two_successors_aggregates_in_fixed_order(tmp_path):
    graph = write_graph(tmp_path, TWO_SUCCESSORS, arithmetic_rows())

    def responder(request):
        if request.purpose == "backward":
            node = request.meta["node"]
            return "\n".join(f'<gradient input="{n}">from-{node}-to-{n}</gradient>'
                             for n in request.meta["inputs"])
        return notes(request)

    backend = SlowFirstSuccessor(responder=responder)
    run_engine(graph, tmp_path / "r.duckdb", backend, steps=1, failures_per_step=1)
    (aggregate,) = rows(tmp_path / "r.duckdb", "SELECT content FROM gradients WHERE node_id = "
                        "'h' AND kind = 'aggregate'")[0:1]
    assert aggregate[0] == "1. (from s1) from-s1-to-h\n2. (from s2) from-s2-to-h"
    received = rows(tmp_path / "r.duckdb", "SELECT from_node_id FROM gradients WHERE node_id = "
                    "'h' AND kind = 'gradient' ORDER BY from_node_id")
    assert received == [("s1",), ("s2",)]
    # h is visited only after both successors: its backward call is absent (question only)
    assert backward_calls(backend, "h") == []


@pytest.mark.parametrize(("reply", "expected"), [
    ("Yes.\n</output>", "Yes."),  # only the closing tag: the prediction keeps no tag
    ("<output>Yes.</output", "Yes."),  # cut short inside the closing tag
    ("<output>No, it broke.", "No, it broke."),
    ("Thinking. <output>Yes</output>", "Yes"),
])
def test_a_stray_output_tag_never_reaches_the_prediction(tmp_path, reply, expected):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())

    def responder(request):
        if request.purpose == "forward" and request.meta["node"] == "final":
            return reply
        return notes(request)

    db = tmp_path / "r.duckdb"
    run_engine(graph, db, ScriptedBackend(responder=responder), steps=0)
    outputs = {r[0] for r in rows(db, "SELECT output_text FROM node_outputs WHERE "
                                      "node_id = 'final'")}
    predictions = {r[0] for r in rows(db, "SELECT prediction FROM losses")}
    assert outputs == predictions == {expected}


def test_malformed_replies_fall_back_and_are_recorded(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())

    def responder(request):
        if request.purpose == "backward":
            return "hint_a: mention the total\nhint_b: state the unit"
        if request.purpose == "update":
            return "I think the prompt should be clearer.\n\nAlways state the final number."
        if request.purpose == "forward" and request.meta["node"] == "hint_a":
            return "the model ignored the format"
        return notes(request)

    db = tmp_path / "r.duckdb"
    run_engine(graph, db, ScriptedBackend(responder=responder), steps=1, failures_per_step=1)
    grads = dict(rows(db, "SELECT node_id, content FROM gradients WHERE from_node_id = 'final'"))
    assert grads == {"hint_a": "mention the total", "hint_b": "state the unit"}
    problems = rows(db, "SELECT DISTINCT parse_error FROM gradients WHERE from_node_id = 'final'")
    assert problems == [("no <gradient> blocks: split the reply by input labels",)]
    forward = rows(db, "SELECT output_text, parse_error FROM node_outputs WHERE node_id = "
                   "'hint_a' LIMIT 1")
    assert forward == [("the model ignored the format", "no <output> tags: used the whole reply")]
    updates = rows(db, "SELECT node_id, new_prompt, parse_error FROM updates ORDER BY node_id")
    assert updates[0] == ("final", "Always state the final number.",
                          "no <prompt> tags: used the last paragraph")


def test_dangling_output_tags_never_reach_the_prediction(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())

    def responder(request):
        if request.purpose == "forward" and request.meta["node"] == "hint_a":
            return "Yes.\n</output>"
        if request.purpose == "forward" and request.meta["node"] == "final":
            return "Thinking first. <output>\n42</output>\n</output>"
        return notes(request)

    db = tmp_path / "r.duckdb"
    run_engine(graph, db, ScriptedBackend(responder=responder), steps=0)
    outputs = dict(rows(db, "SELECT DISTINCT node_id, output_text FROM node_outputs WHERE "
                        "node_id IN ('hint_a', 'final')"))
    assert outputs == {"hint_a": "Yes.", "final": "42"}


@pytest.mark.parametrize(("reply", "parsed"), [
    ("Yes.\n</output>", ("Yes.", "no opening <output> tag: used the text before </output>")),
    ("<output>No", ("No", "unclosed <output> tag: used the text after it")),
    ("<output></output>\n42 </output>", ("42", "unclosed <output> tag: used the text after it")),
    ("<output>Paris</output>", ("Paris", None)),
])
def test_parse_output_drops_a_dangling_output_tag(reply, parsed):
    assert P.parse_output(reply) == parsed


def test_unsplittable_backward_reply_gives_no_input_another_inputs_text(tmp_path):
    # with several inputs, an unsplittable reply is never copied to every input;
    # one repair request names the missing inputs, then they stay empty with the error.
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())

    def responder(request):
        if request.purpose == "backward":
            return "Everything was wrong."
        return notes(request)

    db = tmp_path / "r.duckdb"
    backend = ScriptedBackend(responder=responder)
    run_engine(graph, db, backend, steps=1, failures_per_step=1)
    got = rows(db, "SELECT node_id, content, parse_error FROM gradients WHERE from_node_id = "
               "'final' ORDER BY node_id")
    assert [g[:2] for g in got] == [("hint_a", ""), ("hint_b", "")]
    assert all("after one repair request: empty gradient" in g[2] for g in got)
    repairs = [r for r in backend.requests if r.meta.get("role") == "backward_joint_repair"]
    assert len(repairs) == 1 and repairs[0].meta["inputs"] == ["hint_a", "hint_b"]


def gated_responder(update_prompts: list[str]):
    """The output node answers correctly only when its prompt says IMPROVED; update calls
    for 'final' return the given prompts in order."""
    queue = list(update_prompts)

    def responder(request):
        if request.purpose == "forward" and request.meta.get("output_node"):
            question = request.user_text.split("## Inputs", 1)[1]
            task = request.user_text.split("## Inputs", 1)[0]
            answer = solve(question) if "IMPROVED" in task else "0"
            return f"<output>{answer}</output>"
        if request.purpose == "update":
            if request.meta["node"] == "final" and queue:
                return f"<prompt>{queue.pop(0)}</prompt>"
            return f"<prompt>{request.meta['prompt']}</prompt>"  # unchanged
        return notes(request)

    return responder


def test_gate_accepts_only_strict_improvements(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    backend = ScriptedBackend(responder=gated_responder(
        ["Solve the problem carefully.", "Solve the problem. IMPROVED"]))
    db = tmp_path / "r.duckdb"
    run_engine(graph, db, backend, steps=3, failures_per_step=1)
    steps = rows(db, "SELECT step, train_score, val_score, accepted FROM steps ORDER BY step")
    # step 3: every training example is solved, so nothing is proposed
    assert steps == [(0, 0.0, 0.0, False), (1, 0.0, 0.0, False), (2, 0.0, 1.0, True),
                     (3, 1.0, 1.0, False)]
    updates = rows(db, "SELECT step, new_prompt, accepted, val_before, val_after FROM updates "
                   "WHERE node_id = 'final' ORDER BY step")
    assert updates == [(1, "Solve the problem carefully.", False, 0.0, 0.0),  # equal: rejected
                       (2, "Solve the problem. IMPROVED", True, 0.0, 1.0)]
    # the rejected proposal of step 1 is shown to the update call of step 2
    finals = [r for r in backend.requests if r.purpose == "update" and r.meta["node"] == "final"]
    assert "did not improve" not in finals[0].user_text
    assert "- Solve the problem carefully." in finals[1].user_text
    current = rows(db, "SELECT version, prompt FROM prompt_versions WHERE node_id = 'final' "
                   "AND accepted ORDER BY version")
    assert current == [(0, "Solve the problem."), (2, "Solve the problem. IMPROVED")]


def test_no_gate_accepts_a_worse_proposal(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    backend = ScriptedBackend(responder=gated_responder(["Solve the problem carefully."]))
    db = tmp_path / "r.duckdb"
    run_engine(graph, db, backend, steps=1, failures_per_step=1, gate=False)
    assert rows(db, "SELECT accepted FROM updates WHERE node_id = 'final'") == [(True,)]


def snapshot(db):
    return {
        "steps": rows(db, "SELECT step, train_score, val_score, accepted FROM steps ORDER BY 1"),
        "prompts": rows(db, "SELECT node_id, version, prompt, accepted FROM prompt_versions "
                        "ORDER BY 1, 2"),
        "gradients": rows(db, "SELECT step, example_id, node_id, from_node_id, kind, content "
                          "FROM gradients ORDER BY ALL"),
        "updates": rows(db, "SELECT step, node_id, old_prompt, new_prompt, accepted FROM updates "
                        "ORDER BY 1, 2"),
        "examples": rows(db, "SELECT split, example_id, position FROM examples ORDER BY ALL"),
        "calls": rows(db, "SELECT step, purpose, node_id, example_id, messages, response FROM "
                      "llm_calls ORDER BY ALL"),
    }


def test_same_seed_and_backend_give_identical_runs(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    first = snapshot(run_engine(graph, tmp_path / "a.duckdb", steps=3).run_id and
                     tmp_path / "a.duckdb")
    second = snapshot(run_engine(graph, tmp_path / "b.duckdb", steps=3).run_id and
                      tmp_path / "b.duckdb")
    assert first == second
    assert first["gradients"] and first["updates"]
    other = snapshot(run_engine(graph, tmp_path / "c.duckdb", steps=3, seed=1).run_id and
                     tmp_path / "c.duckdb")
    assert other["examples"] != first["examples"]


def test_run_splits_never_overlap(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows(30))
    db = tmp_path / "r.duckdb"
    run_engine(graph, db, steps=0, train=10, val=10, test=10)
    by_split = {}
    for split, example_id in rows(db, "SELECT split, example_id FROM examples"):
        by_split.setdefault(split, set()).add(example_id)
    assert {k: len(v) for k, v in by_split.items()} == {"train": 10, "val": 10, "test": 10}
    assert not (by_split["train"] & by_split["val"] or by_split["train"] & by_split["test"]
                or by_split["val"] & by_split["test"])
    tested = {r[0] for r in rows(db, "SELECT example_id FROM losses WHERE split = 'test'")}
    assert tested == by_split["test"]


class FailsOneExample(ScriptedBackend):
    async def complete(self, request):
        if request.purpose == "forward" and "has 4 apples" in request.user_text \
                and request.meta["node"] == "hint_a":
            raise TransientLLMError("server exploded")
        return await super().complete(request)


def test_a_failed_call_fails_only_its_example(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows(12))
    db = tmp_path / "r.duckdb"
    solved = gated_responder([])

    def responder(request):  # the output node is always right, so only the failure counts
        if request.purpose == "forward" and request.meta.get("output_node"):
            return f"<output>{solve(request.user_text.split('## Inputs')[1])}</output>"
        return solved(request)

    result = run_engine(graph, db, FailsOneExample(responder=responder), steps=0, train=12,
                        val=0, max_retries=1)
    assert result.status == "finished"
    failed = rows(db, "SELECT node_id, error FROM node_outputs WHERE error IS NOT NULL "
                  "ORDER BY node_id")
    assert failed[0][0] == "final" and "upstream node 'hint_a' failed" in failed[0][1]
    assert failed[1][0] == "hint_a" and "server exploded" in failed[1][1]
    assert rows(db, "SELECT train_score FROM steps") == [(11 / 12,)]
    assert rows(db, "SELECT retries FROM llm_calls WHERE error IS NOT NULL") == [(1,)]


def test_method_none_makes_no_backward_calls_and_shows_no_feedback(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    backend = ScriptedBackend()
    db = tmp_path / "r.duckdb"
    run_engine(graph, db, backend, steps=1, method="none")
    assert [r for r in backend.requests if r.purpose == "backward"] == []
    updates = [r for r in backend.requests if r.purpose == "update"]
    assert len(updates) == 3
    assert all("<feedback>" not in r.user_text for r in updates)
    assert rows(db, "SELECT count(*) FROM gradients") == [(0,)]


def test_evaluative_variant_asks_for_quality_not_direction(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    backend = ScriptedBackend()
    run_engine(graph, tmp_path / "r.duckdb", backend, steps=1, failures_per_step=1,
               method="semantic-evaluative")
    (call,) = backward_calls(backend, "final")
    assert "comment on the quality of that input" in call.user_text
    assert "without referring to the other inputs" in call.user_text


def test_update_prompt_shows_inputs_outputs_and_gradients(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())

    def responder(request):
        if request.purpose == "backward":
            return '<gradient input="hint_a">GA</gradient><gradient input="hint_b">GB</gradient>'
        return notes(request)

    backend = ScriptedBackend(responder=responder)
    run_engine(graph, tmp_path / "r.duckdb", backend, steps=1, failures_per_step=2)
    (update,) = [r for r in backend.requests if r.purpose == "update"
                 and r.meta["node"] == "hint_a"]
    text = update.user_text
    assert text.count("<example index=") == 2
    assert text.count("GA") == 2 and "GB" not in text
    assert re.search(r"NOTE-hint_a-\d+", text)
    assert "Work out an intermediate step that helps solve the problem." in text


JUDGED = TWO_HINTS.replace("metric: numeric", "metric: judge\nrubric: The answer must give "
                           "the total number of apples.")


def test_judge_metric_grades_with_the_rubric_and_its_critique_is_the_output_gradient(tmp_path):
    graph = write_graph(tmp_path, JUDGED, arithmetic_rows())

    def responder(request):
        if request.purpose == "loss":
            return "The answer forgets the apples he bought. <score>4</score>"
        return notes(request)

    backend = ScriptedBackend(responder=responder)
    db = tmp_path / "r.duckdb"
    run_engine(graph, db, backend, steps=1, failures_per_step=1, optimizer_model="judge-model")
    judge_calls = [r for r in backend.requests if r.purpose == "loss"]
    assert judge_calls and all(r.model == "judge-model" for r in judge_calls)
    text = judge_calls[0].user_text
    assert "The answer must give the total number of apples." in text
    assert "<reference>" in text and "<answer>" in text
    scores = {s for (s,) in rows(db, "SELECT DISTINCT score FROM losses")}
    assert scores == {0.4}
    feedback = rows(db, "SELECT content FROM gradients WHERE from_node_id = 'loss' LIMIT 1")
    assert feedback == [("The answer forgets the apples he bought.",)]


def test_one_prompt_at_a_time_updates_the_trainable_nodes_in_turn(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "r.duckdb"
    run_engine(graph, db, ScriptedBackend(), steps=4, update_mode="one")
    assert rows(db, "SELECT step, node_id FROM updates ORDER BY step") == [
        (1, "hint_a"), (2, "hint_b"), (3, "final"), (4, "hint_a")]
